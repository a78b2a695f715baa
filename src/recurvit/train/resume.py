"""What a ``--resume`` may change, and the one line that says what it changed.

The rule: overrides given with ``--resume`` APPLY when they change how training continues (the
``train.*`` settings: epochs, lr, schedule, clipping, supervision, ...; where the data live:
``data.root``, ``data.num_workers``); the optimizer and the schedule then follow them
(``optim.follow_config``) and config.yaml is rewritten with them. Overrides that would change
WHAT is trained (the model, the data set and its augmentation, the seed, the batch size, which
fixes the iterations of every epoch already run, per-stage heads, which add modules) are refused
with one line naming the keys; so is ``train.epochs`` below the epoch the checkpoint is at.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

from ..errors import UserError

# (heads are model; the block's lr groups are the optimizer state's layout)
FIXED_TRAIN_KEYS = ("train.seed", "train.batch_size", "train.supervision.per_stage_heads", "train.block_lr_scale",
                    "train.lr_throttle")
MUTABLE_DATA_KEYS = ("data.root", "data.num_workers")

Change = Tuple[str, Any, Any]  # (dotted key, old value, new value)


def flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(old: Dict[str, Any], new: Dict[str, Any]) -> List[Change]:
    """Every dotted key whose value differs between two plain config dicts."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def mutable(key: str, fixed: Iterable[str] = FIXED_TRAIN_KEYS) -> bool:
    return (key.startswith("train.") and key not in fixed) or key in MUTABLE_DATA_KEYS


def check_resume(run: str, epoch: int, changes: List[Change], fixed: Iterable[str] = FIXED_TRAIN_KEYS) -> str:
    """The line to print on resume; UserError naming the keys a resume cannot change."""
    fixed = tuple(fixed)
    refused = [k for k, _, _ in changes if not mutable(k, fixed)]
    if refused:
        raise UserError(f"--resume {run} cannot change {', '.join(refused)} (they define what is trained); "
                        "start a new run with --out instead")
    below = [(k, b) for k, _, b in changes if k == "train.epochs" and isinstance(b, int) and b < epoch]
    if below:  # config.yaml would say fewer epochs than last.pt holds: the run would contradict itself
        raise UserError(f"--resume {run} is at epoch {epoch} already; train.epochs={below[0][1]} would record fewer "
                        f"epochs than its checkpoint holds; give train.epochs >= {epoch} (or evaluate the run as it is)")
    said = ", ".join(f"{k} {_fmt(a)} -> {_fmt(b)}" for k, a, b in changes)
    return f"resuming {run} at epoch {epoch}" + (f": {said}" if said else "")


def _fmt(v: Any) -> str:
    return "unset" if v is None else str(v)

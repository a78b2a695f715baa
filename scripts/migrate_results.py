"""Rewrite the files an earlier recurvit wrote (result.json, results.csv, checkpoints) in the form it reads now.

    python scripts/migrate_results.py              # the committed results folders (results/), in place
    python scripts/migrate_results.py PATH ...     # run directories, runs/studies/NAME, results folders
    python scripts/migrate_results.py --check      # exit 1 when any file would change; nothing is written

Each file is rewritten only where it is in an earlier form, so a second run changes nothing:

- a run's ``result.json`` (in its run directory, or the copy a results folder keeps as ``runs/<id>/result.json``):
  the record of its evaluators (``eval``) as ``{horizon: {max_steps_factor: N}, ...}`` where an earlier runner
  recorded ``{max_steps_factor, variants}`` (an empty ``variants`` dropped) or no record (the horizon to 4T, as it
  ran then); ``plateau_test`` / ``plateau_val`` read off its per-epoch curves where it holds a curve without its
  figure; ``train_seconds`` from the last epoch logged beside it (``metrics.jsonl``) where it lost it.
- a study's ``results.csv`` (the results folder of a study file in ``--studies``): rewritten from its own rows by
  the current writer, so it holds every column the current one writes (an earlier one lacked ``acc_32T``,
  ``acc_64T``, ``plateau_val`` and ``plateau_test``: they stay empty, the table never held those figures).
- a checkpoint (``*.pt``) that names no task (checkpoints of classification named none): its task, core options
  written flat under ``model`` moved to ``model.options``, ``best_acc`` renamed ``best_score``, a last.pt's
  ``metrics`` (the last epoch logged beside it) and its preprocessing record (``data``, where the data set is
  at hand) where it kept none.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recurvit.errors import UserError  # noqa: E402
from recurvit.run.atomic import save_atomic, write_atomic  # noqa: E402
from recurvit.study import load_study  # noqa: E402
from recurvit.study.plateau import plateau_change  # noqa: E402
from recurvit.study.report import results_csv, rows_from_csv  # noqa: E402

CURVES = (("test_acc_curve", "plateau_test"), ("val_acc_curve", "plateau_val"))
HORIZON_THEN = 4  # the horizon factor of a result that records no evaluators (the runner's default then)


def migrate_result(res: Dict[str, Any], run_dir: Optional[Path] = None) -> Tuple[Dict[str, Any], List[str]]:
    """(the result in the current form, what changed); ``run_dir``: the run directory it lies in, if any."""
    out, changed = dict(res), []
    rec = out.get("eval")
    if not isinstance(rec, dict):
        rec = {"max_steps_factor": out.get("max_steps_factor", HORIZON_THEN), "variants": {}}
    if "max_steps_factor" in rec:
        rest = {k: v for k, v in rec.items() if k != "max_steps_factor" and (k != "variants" or v)}
        out["eval"] = {"horizon": {"max_steps_factor": rec["max_steps_factor"]}, **rest}
        changed.append("eval record")
    for curve, key in CURVES:
        if curve in out and key not in out:
            out[key] = plateau_change(out[curve])
            changed.append(key)
    log = run_dir / "metrics.jsonl" if run_dir is not None else None
    if "test_acc_curve" in out and out.get("train_seconds") is None and log is not None and log.is_file():
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        if lines and lines[-1].get("train_seconds") is not None:
            out["train_seconds"] = lines[-1]["train_seconds"]
            changed.append("train_seconds")
    return out, changed


def result_files(path: Path) -> List[Tuple[Path, str, Callable[[], None]]]:
    """(file, what changed, write) of a result.json in an earlier form."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # not a result (a torn write): the runner evaluates such a run again
    if not isinstance(res, dict) or "run_id" not in res:
        return []
    in_run_dir = (path.parent / "last.pt").is_file() or (path.parent / "metrics.jsonl").is_file()
    new, changed = migrate_result(res, path.parent if in_run_dir else None)
    if not changed:
        return []
    return [(path, ", ".join(changed), lambda: write_atomic(path, json.dumps(new, indent=1)))]


def studies_by_folder(studies: Path) -> Dict[Path, Any]:
    """The study files of ``studies`` by the results folder each names."""
    found = {}
    for f in sorted(studies.glob("*.yaml")):
        try:
            study = load_study(f)
        except UserError:
            continue  # not a study file (claims.yaml)
        if study.results is not None:
            found[Path(study.results).resolve()] = study
    return found


def table_files(path: Path, studies: Dict[Path, Any]) -> List[Tuple[Path, str, Callable[[], None]]]:
    """(file, what changed, write) of a study's results.csv whose columns are not the current writer's."""
    study = studies.get(path.parent.resolve())
    if study is None:
        return []
    with open(path, newline="") as f:  # its bytes as written (csv ends its lines with \r\n)
        text = f.read()
    if not text.strip():
        return []  # an empty table: the study writes it again
    new = results_csv(rows_from_csv(path, study), study)
    if new == text:
        return []
    before, after = text.splitlines()[0].split(","), new.splitlines()[0].split(",")
    added, gone = [c for c in after if c not in before], [c for c in before if c not in after]
    what = "columns" + (f" + {', '.join(added)}" if added else "") + (f" - {', '.join(gone)}" if gone else "")
    return [(path, what, lambda: write_atomic(path, new))]


def migrate_checkpoint(ckpt: Dict[str, Any], log: Optional[Path] = None) -> Tuple[Dict[str, Any], List[str]]:
    """(a recurvit checkpoint in the current form, what changed); ``log``: the metrics.jsonl beside it. Only a
    checkpoint that names no task is in an earlier form (every later one holds all that is added here)."""
    from recurvit.config import config_from_dict, nest_options
    from recurvit.run.preprocessing import preprocessing_of

    if "task" in ckpt:
        return ckpt, []
    out = {"format": ckpt["format"], "task": "classify", **ckpt}
    changed = ["task"]
    if isinstance(out.get("config"), dict) and nest_options(out["config"]) != out["config"]:
        out["config"] = nest_options(out["config"])
        changed.append("core options under model.options")
    if "best_acc" in out:
        out["best_score"] = out.pop("best_acc")
        changed.append("best_acc -> best_score")
    if "optimizer" in out and not out.get("metrics") and log is not None and log.is_file():
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        if lines:
            out["metrics"] = lines[-1]
            changed.append("metrics")
    if not out.get("data") and isinstance(out.get("config"), dict):
        record = preprocessing_of(out, config_from_dict(out["config"]))  # None where the data set is not at hand
        if record is not None:
            out["data"] = record
            changed.append("data record")
    return out, changed


def checkpoint_files(path: Path) -> List[Tuple[Path, str, Callable[[], None]]]:
    """(file, what changed, write) of a recurvit checkpoint in an earlier form."""
    import torch

    from recurvit.run.checkpoint import FORMAT

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  (not a checkpoint this script can read: left as it is)
        return []
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        return []
    new, changed = migrate_checkpoint(ckpt, path.parent / "metrics.jsonl")
    if not changed:
        return []
    return [(path, ", ".join(changed), lambda: save_atomic(new, path))]


def changes(paths: List[Path], studies: Path) -> List[Tuple[Path, str, Callable[[], None]]]:
    """Every file under ``paths`` in an earlier form: (file, what changes, write)."""
    by_folder = studies_by_folder(studies) if studies.is_dir() else {}
    found = []
    for top in paths:
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for f in files:
            if f.name == "result.json":
                found += result_files(f)
            elif f.name == "results.csv":
                found += table_files(f, by_folder)
            elif f.suffix == ".pt":
                found += checkpoint_files(f)
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", type=Path, help="files or folders (default: results/)")
    p.add_argument("--check", action="store_true", help="exit 1 when any file would change; write nothing")
    p.add_argument("--studies", type=Path, default=ROOT / "studies",
                   help="the folder of the study files whose results.csv are rewritten (default: studies/)")
    args = p.parse_args(argv)
    paths = args.paths or [ROOT / "results"]
    missing = [str(x) for x in paths if not x.exists()]
    if missing:
        print(f"migrate_results: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        found = changes(paths, args.studies)
    except UserError as e:
        print(f"migrate_results: {e}", file=sys.stderr)
        return 2
    for f, what, write in found:
        print(f"{'would rewrite' if args.check else 'rewrote'} {f} ({what})")
        if not args.check:
            write()
    print(f"{len(found)} file(s) {'in an earlier form' if args.check else 'rewritten'}")
    return 1 if args.check and found else 0


if __name__ == "__main__":
    raise SystemExit(main())

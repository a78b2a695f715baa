"""What a run needs to preprocess an image without its training data, as a checkpoint carries it and as
timm reads it (``model.pretrained_cfg``: ``timm.data.resolve_data_config(model=m)`` then builds the run's
own transform instead of falling back to 3x224 ImageNet defaults)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from ..data import DATASETS, build_datasets
from ..errors import UserError
from .loaders import run_data

IMAGEFOLDER_CROP = 0.875  # data.transforms.FOLDER_CROP: resize to size / 0.875, centre crop


def data_record(cfg, info) -> Dict[str, Any]:
    """The checkpoint's ``data`` entry: input size and channels, mean / std, class names, how images were
    read (``tensor``: in-memory uint8 images at their native size; ``folder``: PIL images, resize + crop),
    the crop fraction of evaluation (``crop_pct``, as timm's: an image of another shape is resized on its
    shorter side to img_size / crop_pct, then centre-cropped) and the data root as an absolute path."""
    root, folder = cfg.data.root, cfg.data.name == "imagefolder"
    return {"name": info.name, "img_size": int(info.img_size), "in_chans": int(info.in_chans),
            "mean": [float(m) for m in info.mean], "std": [float(s) for s in info.std],
            "class_names": list(info.class_names), "pipeline": "folder" if folder else "tensor",
            "crop_pct": IMAGEFOLDER_CROP if folder else 1.0,
            "root": str(Path(root).expanduser().resolve()) if root else None}


def crop_pct(data: Dict[str, Any]) -> float:
    """The crop fraction of a run's ``data`` entry (entries written before it was stored: by pipeline)."""
    return float(data.get("crop_pct") or (IMAGEFOLDER_CROP if data.get("pipeline") == "folder" else 1.0))


def pretrained_cfg(data: Dict[str, Any], num_classes: int) -> Dict[str, Any]:
    """timm's ``pretrained_cfg`` keys for a run's ``data`` entry (plus the class names)."""
    size, chans = data["img_size"], data["in_chans"]
    return {"input_size": (chans, size, size), "mean": tuple(data["mean"]), "std": tuple(data["std"]),
            "interpolation": "bilinear", "crop_pct": crop_pct(data),
            "crop_mode": "center", "num_classes": num_classes, "label_names": list(data["class_names"]),
            "recurvit_data": dict(data)}


def preprocessing_of(ckpt: Dict[str, Any], cfg) -> Optional[Dict[str, Any]]:
    """A checkpoint's ``data`` entry; for a checkpoint written before it existed, derived from the run's
    data config where the data set is at hand (None where it is not: the caller says so)."""
    if ckpt.get("data"):
        return ckpt["data"]

    try:
        _, _, info = build_datasets(run_data(cfg), with_train=False)
    except (UserError, OSError):
        return None
    return data_record(cfg, info)


def _few(names) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(repr(n[:40]) for n in names[:6])
    return f"{len(names)} ({shown}{', ...' if len(names) > 6 else ''})"


def check_classes(record: Optional[Dict[str, Any]], info, source) -> None:
    """A run evaluated on data whose classes are not the run's, by name and in order, is one line (its
    accuracy would count another class's images as right or wrong: a folder with classes {0, 2} read by a
    model of {0, 1, 2}, a digits model on Fashion-MNIST). Refused, not mapped: a run's head indexes its own
    classes, and a subset or another order is another evaluation. A record without class names says nothing."""
    run = list((record or {}).get("class_names") or [])
    data = list(getattr(info, "class_names", ()) or ())
    if not run or not data or run == data:
        return
    if sorted(run) == sorted(data):
        why = "the same names in another order"
    else:
        missing, extra = [n for n in run if n not in data], [n for n in data if n not in run]
        why = "; ".join(x for x in (f"missing {_few(missing)}" if missing else "",
                                    f"not the run's {_few(extra)}" if extra else "") if x)
    raise UserError(f"{source} was trained on {_few(run)} classes and the data has {_few(data)}: {why}; "
                    "evaluate it on data with the run's classes (--data-root)")


def check_record(data: Dict[str, Any], num_classes: int, in_chans: int, where) -> None:
    """An export's preprocessing record as a model can use it, or one line naming the bad field: a data set
    recurvit knows (eval reads it, predict reads images as it did), finite mean and std (std > 0) a channel, a
    positive image size, the model's channels, and as many class names (strings) as its head has classes (a NaN
    mean predicted "prob": NaN; short or integer names were taken as they were)."""
    import math

    def bad(what: str) -> UserError:
        return UserError(f"cannot read the export {where}: its preprocessing record {what}; export the run again")

    if not isinstance(data, dict):
        raise bad(f"is a {type(data).__name__}, not a mapping")
    name = data.get("name")
    if not (isinstance(name, str) and name in DATASETS):
        raise bad(f"names the data set {str(name)[:40]!r}, not one of recurvit's ({', '.join(DATASETS)})")
    size, chans = data.get("img_size"), data.get("in_chans")
    if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
        raise bad(f"has img_size {size!r}, not a positive integer")
    if chans != in_chans:
        raise bad(f"says in_chans {chans!r}, and the model takes {in_chans}")
    for key in ("mean", "std"):
        v = data.get(key)
        if not (isinstance(v, list) and len(v) == in_chans and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
            raise bad(f"has {key} {str(v)[:80]}, not {in_chans} finite number(s)")
    if any(x <= 0 for x in data["std"]):
        raise bad(f"has std {data['std']}, not > 0")
    names = data.get("class_names")
    if names is not None and not (isinstance(names, list) and len(names) == num_classes
                                  and all(isinstance(n, str) for n in names)):
        raise bad(f"has class_names {str(names)[:80]}, not {num_classes} names (strings) for the model's "
                  f"{num_classes} classes")

"""What a run needs to preprocess an image without its training data, as a checkpoint carries it and as
timm reads it (``model.pretrained_cfg``: ``timm.data.resolve_data_config(model=m)`` then builds the run's
own transform instead of falling back to 3x224 ImageNet defaults)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from ..data import build_datasets
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

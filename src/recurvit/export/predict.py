"""Predictions for your own images with a run's own preprocessing (``recurvit predict``, ``recurvit.predict``).

The preprocessing is the run's evaluation pipeline, rebuilt from its checkpoint (``model.pretrained_cfg``):
in-memory data sets (digits, Fashion-MNIST, CIFAR) read uint8 images at their native size, so a PNG of a
test image gives exactly the tensor ``recurvit eval`` sees; image-folder runs resize and centre-crop."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ..data import transforms as T
from ..data.datasets import dense_target
from ..data.images import non_finite, to_8bit
from ..errors import UserError
from ..run.preprocessing import crop_pct

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


@dataclass
class Prediction:
    source: str                       # the file (or "image <i>" for an in-memory image)
    top: List[Tuple[str, float]]      # (class name, probability), most probable first
    mask: Optional[torch.Tensor] = None  # a dense run's (mazes): the predicted class of every pixel, (H, W) uint8

    def as_dict(self) -> Dict[str, Any]:
        if self.mask is not None:
            return {"image": self.source, "path_pixels": int((self.mask > 0).sum())}
        return {"image": self.source, "top": [{"label": n, "prob": p} for n, p in self.top]}


def image_files(paths: Sequence[Union[str, Path]]) -> List[Path]:
    """The files of ``paths``: each file as given, each folder's images (recursively, sorted)."""
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.exists():
            out.append(p)
        else:
            raise UserError(f"no such image or folder: {p}")
    return out


def read_images(files: Iterable[Path]) -> Tuple[List[Tuple[str, Any]], List[Tuple[str, str]]]:
    """(readable (name, PIL image) pairs, unreadable (name, reason) pairs)."""
    from PIL import Image, UnidentifiedImageError

    ok, bad = [], []
    for f in files:
        try:
            with Image.open(f) as im:
                im.load()
                why = non_finite(im)
                if why:
                    raise ValueError(why)
                ok.append((str(f), to_8bit(im).copy()))  # 16-bit scaled to 8; a range it cannot read: one line
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, UserError) as e:
            bad.append((str(f), str(e).splitlines()[0] if str(e) else type(e).__name__))
    return ok, bad


def _transform(cfg: Dict[str, Any]):
    data = cfg.get("recurvit_data")
    if data is None:
        raise UserError("this model carries no preprocessing (pretrained_cfg); load it with recurvit.load_model(RUN)")
    size, chans, mean, std = data["img_size"], data["in_chans"], data["mean"], data["std"]
    if data["pipeline"] == "folder":
        folder = T.folder_test_transform(size, mean, std, crop_pct(data))
        return lambda im: folder(to_8bit(im).convert("RGB"))

    dense = dense_target(data.get("name", ""))  # a maze is read at its own size: the model runs larger ones

    def tensor(im):
        import numpy as np

        arr = np.asarray(to_8bit(im).convert("L" if chans == 1 else "RGB"), dtype=np.uint8)  # 16 bits scaled
        x = torch.from_numpy(arr.copy())
        x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)  # (C, H, W) uint8, as the in-memory data sets
        if x.shape[-1] != x.shape[-2]:
            if dense:
                raise UserError(f"a {x.shape[-1]}x{x.shape[-2]} maze image; a maze is square")
            x = T.resize_center_crop(x, size, crop_pct(data))  # as timm's eval transform: shorter side, centre crop
        native = int(x.shape[-1])
        return T.tensor_test_transform(native if dense else size, native, mean, std)(x)

    return tensor


def _as_pil(x: torch.Tensor):
    """A uint8 (C, H, W) image tensor as a PIL image (read then as a file of it would be)."""
    from PIL import Image

    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise UserError(f"an image tensor must be (C, H, W) with 1 or 3 channels, got {tuple(x.shape)}")
    arr = x.permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)


def gather(images: Any, names: Optional[Sequence[str]] = None) -> Tuple[List[str], List[Any]]:
    """(names, images) of what :func:`predict` takes: a path (file or folder), a PIL image, a tensor, or a
    list of these. A folder gives its image files (recursively, sorted); a uint8 tensor (C, H, W) or
    (B, C, H, W) holds raw images (preprocessed as their PNGs would be); a floating-point tensor is the
    model's input, already preprocessed, used as it is."""
    if isinstance(images, torch.Tensor):
        if images.ndim not in (3, 4):
            raise UserError(f"an image tensor must be (C, H, W) or (B, C, H, W), got {tuple(images.shape)}")
        images = list(images[None] if images.ndim == 3 else images)
    elif isinstance(images, (str, Path)) or not isinstance(images, Iterable) or hasattr(images, "getbands"):
        images = [images]  # one path or one PIL image (a string is never iterated character by character)
    out_names, out = [], []
    for i, im in enumerate(images):
        if isinstance(im, (str, Path)):
            pairs, bad = read_images(image_files([im]))
            if bad:
                raise UserError(f"cannot read {bad[0][0]}: {bad[0][1]}")
            if not pairs:
                raise UserError(f"no images in {im} (looked for {', '.join(IMAGE_SUFFIXES)})")
            out_names += [n for n, _ in pairs]
            out += [x for _, x in pairs]
        elif isinstance(im, torch.Tensor) or hasattr(im, "getbands"):  # a tensor or a PIL image
            out_names.append(f"image {i}")
            out.append(_as_pil(im) if isinstance(im, torch.Tensor) and im.dtype == torch.uint8 else im)
        else:
            raise UserError(f"cannot predict on a {type(im).__name__}: give paths, folders, PIL images or tensors")
    if names is not None:
        if len(names) != len(out):
            raise UserError(f"{len(names)} names for {len(out)} images")
        out_names = list(names)
    return out_names, out


@torch.no_grad()
def predict(model: torch.nn.Module, images: Any, topk: int = 5, steps: Optional[int] = None,
            batch_size: int = 64, names: Optional[Sequence[str]] = None) -> List[Prediction]:
    """Class names and probabilities with the run's own preprocessing (``model.pretrained_cfg``, set by
    ``recurvit.load_model``); ``steps``: run K steps. ``images``: a path to an image or a folder of images,
    a PIL image, a tensor (uint8: raw images; float: the model's input as is), or a list of any of these
    (see :func:`gather`). A dense run's model (logits (B, C, H, W): mazes) gives each image's predicted
    mask instead (``Prediction.mask``), one image a pass (mazes of several sizes)."""
    if topk < 1:
        raise UserError(f"--topk must be >= 1, got {topk}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names, images = gather(images, names)
    own = None
    if any(not isinstance(im, torch.Tensor) for im in images):
        check_input_size(model, cfg)
        own = _transform(cfg)

    def tf(im):
        return im if isinstance(im, torch.Tensor) else own(im)

    labels = list(cfg.get("label_names") or [])
    device = next(model.parameters()).device
    model.eval()
    out: List[Prediction] = []
    if is_dense(cfg):
        check_mazes([(name, im) for name, im in zip(names, images) if not isinstance(im, torch.Tensor)])
        xs = [tf(im) for im in images]
        check_dense_sides(model, [(name, int(x.shape[-1])) for name, x in zip(names, xs)])
        return [Prediction(name, [], model(x[None].to(device), steps=steps)[0].argmax(0).to(torch.uint8).cpu())
                for name, x in zip(names, xs)]
    for i in range(0, len(images), batch_size):
        x = torch.stack([tf(im) for im in images[i:i + batch_size]]).to(device)
        probs = model(x, steps=steps).float().softmax(-1)
        p, idx = probs.topk(min(topk, probs.shape[-1]), dim=-1)
        for name, pr, ix in zip(names[i:i + batch_size], p.tolist(), idx.tolist()):
            out.append(Prediction(name, [(labels[j] if j < len(labels) else str(j), q) for j, q in zip(ix, pr)]))
    return out


def check_input_size(model: torch.nn.Module, cfg: Dict[str, Any]) -> None:
    """One line when the preprocessing record (``pretrained_cfg``) would size images for another model than
    this one: a classifier reads images at the record's img_size, and a model built for another size fails
    on them with a shape error (a dense model reads a maze at its own size: not checked here)."""
    data = cfg.get("recurvit_data") or {}
    size, own = data.get("img_size"), getattr(getattr(model, "cfg", None), "img_size", None)
    if is_dense(cfg) or not isinstance(own, int) or size == own:
        return
    raise UserError(f"the model's preprocessing record says img_size {str(size)[:20]}, and the model takes "
                    f"{own}x{own} px images; export the run again")


def check_mazes(pairs: Sequence[Tuple[str, Any]]) -> None:
    """One line naming the first (name, PIL image) that is not a maze in the easy-to-hard format (a maze model's
    answer on any other image means nothing: ``data.mazes.maze_problem``)."""
    import numpy as np

    from ..data.mazes import maze_problem

    for name, im in pairs:
        why = maze_problem(np.asarray(to_8bit(im).convert("RGB"), dtype=np.uint8))
        if why:
            raise UserError(f"{name} is not a maze image: {why}")


def check_dense_sides(model: torch.nn.Module, sides: Sequence[Tuple[str, int]]) -> None:
    """One line for a square image a dense (maze) model cannot read: a side its patches do not tile (the
    mask would come back smaller than the image), or another size than a fixed-size model was built for (a
    learned position embedding without ``model.dynamic_img_size``)."""
    mc = model.cfg
    p = getattr(mc, "patch_size", 1) or 1
    fixed = getattr(model, "pos_embed", None) is not None and not getattr(mc, "dynamic_img_size", True)
    for name, side in sides:
        if side % p:
            raise UserError(f"{name}: a {side}-pixel maze image, and this model reads {p}-pixel patches: its side "
                            f"must be a multiple of {p} (a size-s maze is 2s + 6 pixels)")
        if fixed and side != mc.img_size:
            raise UserError(f"{name}: a {side}-pixel maze image, and this model runs only at {mc.img_size} pixels "
                            f"(a learned position embedding, trained without model.dynamic_img_size=true)")


def is_dense(cfg: Dict[str, Any]) -> bool:
    """Whether a model's ``pretrained_cfg`` is a dense (per-pixel, maze) run's: ``predict`` then returns
    each image's mask, and :func:`.predict_run.predict_files` writes it as NAME.path.png instead of class
    rows."""
    return bool(dense_target((cfg.get("recurvit_data") or {}).get("name", "")))

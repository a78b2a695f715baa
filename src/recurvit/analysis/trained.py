"""A trained classifier opened for analysis: its model on a device, its config with the data set where it lives
now, and its test split, checked (finite weights, the classes it was trained on) before any figure is made."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import UserError
from ..run.load import load

SHIPPED_DATA = ("digits", "synthetic")  # data sets that live in the package: no folder to point at


def apply_data_root(cfg, root) -> None:
    """``--data-root DIR``: where the run's data set lives now (overrides data.root); an error for a data
    set that has no folder, instead of silently evaluating on the shipped data."""
    if not root:
        return
    if cfg.data.name in SHIPPED_DATA:
        raise UserError(f"--data-root does not apply: this run's data set is {cfg.data.name}, which ships with "
                        "the package (there is no folder to read)")
    cfg.data.root = str(root)


def open_classifier(path: str | Path, device: str = "auto", data_root: Optional[str] = None, loaded=None,
                    **options):
    """(model on its device, config, device, test loader, data info) of the classifier at ``path`` (a run
    directory, a checkpoint or an exported model): its weights (``options``: core options to run it with;
    NaN weights refused), ``data_root`` applied, the device of ``device`` and the run's test split.
    ``loaded``: the run as :func:`recurvit.run.load.load` already read it (not read again)."""
    from ..run.checkpoint import check_finite
    from ..run.device import pick_device
    from ..run.loaders import build_test_loader
    from ..run.preprocessing import check_classes

    loaded = (loaded if loaded is not None else load(path, **options)).classifier(path)
    if loaded.checkpoint is None and not (loaded.data_record or {}).get("name"):
        raise UserError(f"{path} does not say which data set its model was trained on; evaluate the run "
                        "directory it came from")
    model, cfg = loaded.model, loaded.config
    check_finite(model, path)  # NaN weights would report meaningless figures (a constant argmax)
    apply_data_root(cfg, data_root)
    dev = pick_device(device)
    test_loader, info = build_test_loader(cfg)
    check_classes(loaded.data_record, info, path)  # another data set's classes: one line, not a figure
    return model.to(dev), cfg, dev, test_loader, info


__all__ = ["SHIPPED_DATA", "apply_data_root", "open_classifier"]

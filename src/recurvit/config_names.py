"""Configs by name: a config argument is a path or the name of a config packaged with recurvit.

``digits/bvit``, ``digits/bvit.yaml`` and ``configs/digits/bvit.yaml`` all name the packaged
``recurvit/configs/digits/bvit.yaml``; an existing file always wins over a name, so a user's own
``configs/digits/bvit.yaml`` is read as written. ``recurvit configs`` lists the names.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import List, Optional, Tuple

from .errors import UserError

SUFFIXES = (".yaml", ".yml")
PREFIXES = ("src/recurvit/configs/", "recurvit/configs/", "configs/")  # how the README and headers write them


def packaged_root() -> Path:
    """The folder of the packaged configs (inside the installed package)."""
    return Path(str(files("recurvit") / "configs"))


def config_names() -> List[str]:
    """Every packaged config's name (``digits/bvit``), sorted."""
    root = packaged_root()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def packaged(name: str) -> Optional[Path]:
    """The packaged config ``name`` means (``digits/bvit``, ``configs/digits/bvit.yaml``), or None."""
    text = name.replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    for prefix in PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    for suffix in SUFFIXES:
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    if not text or ".." in text.split("/"):
        return None
    path = packaged_root() / f"{text}.yaml"
    return path if path.is_file() else None


def find_config(arg: str | Path) -> Path:
    """The config file ``arg`` means: an existing file, else the packaged config of that name (also when
    ``arg`` is the repository-relative path ``configs/NAME.yaml`` given from another folder)."""
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    found = packaged(str(arg))
    if found is not None:
        return found
    if p.is_dir():
        raise UserError(f"config {arg} is a folder; give a YAML file or a packaged config name "
                        "(`recurvit configs` lists them)")
    raise UserError(f"config file not found: {arg} is neither a file nor a packaged config name "
                    "(`recurvit configs` lists them, e.g. digits/bvit)")


def describe(name: str) -> Tuple[str, str]:
    """(command, summary) from a packaged config's header: the first comment line and its command line."""
    lines = [ln[1:].strip() for ln in (packaged_root() / f"{name}.yaml").read_text().splitlines()
             if ln.startswith("#")]
    summary = lines[0] if lines else ""
    command = next((ln.split("(")[0].strip() for ln in lines if ln.startswith("recurvit ")), "")
    return command, summary


__all__ = ["find_config", "packaged", "config_names", "packaged_root", "describe"]

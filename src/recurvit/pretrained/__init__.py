"""Trained models shipped inside the package: loadable by name, with no training and no download.

    recurvit.list_pretrained()                  # the names
    recurvit.pretrained.shipped()["maze_dt16_prog"].about    # what it is, how it was trained, what it solves
    recurvit.load_model("maze_dt16_prog")       # the model (eval mode), as from a run directory
    recurvit predict maze_dt16_prog maze.png    # the predicted path written beside the maze as maze.path.png

Each is a safetensors export (``recurvit export RUN --format safetensors``: the weights, the model's
arguments and its preprocessing) listed in ``index.yaml`` beside it with the command and commit that trained
it and the figures measured on the exported file itself, on its run's test split; ``python scripts/ship_model.py RUN NAME --about ...``
writes both, so nothing in the index is typed by hand. A path that exists always wins over a shipped name.
``tests/pretrained/test_shipped.py`` loads every shipped model in a fresh process and checks it on inputs its
run never saw. Reading the index imports neither torch nor timm.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional

INDEX = Path(__file__).with_name("index.yaml")


@dataclass(frozen=True)
class Shipped:
    """One shipped model, as ``index.yaml`` lists it."""

    name: str
    file: Path                      # the safetensors export, inside the package
    about: str                      # one paragraph: what it is and which recipe trained it
    trained_by: str                 # the command that trained it
    commit: str                     # the commit it was trained at
    task: str                       # the data it was trained on ("mazes")
    train_size: int                 # for mazes: the maze size it was trained at
    steps: int                      # its trained depth (test-time iterations by default)
    data: Dict[str, int] = field(default_factory=dict)        # its run's maze_seed, maze_train, maze_val
    measured: Dict[str, float] = field(default_factory=dict)  # solved_<size>, solved_open_<size> of the shipped
                                                              # file on its run's test split (scripts/ship_model.py)

    def floor(self, key: str, margin: float = 0.05) -> float:
        """What a fresh sample must reach: the shipped file's own test figure ``key`` less ``margin``."""
        return max(0.0, self.measured[key] - margin)


@lru_cache(maxsize=1)
def shipped() -> Dict[str, Shipped]:
    """Every shipped model by name (empty when the index is absent)."""
    import yaml

    if not INDEX.is_file():
        return {}
    rows = yaml.safe_load(INDEX.read_text()) or {}
    return {name: Shipped(name=name, file=INDEX.parent / row["file"], about=row["about"],
                          trained_by=row["trained_by"], commit=row["commit"], task=row["task"],
                          train_size=int(row["train_size"]), steps=int(row["steps"]),
                          data={k: int(v) for k, v in (row.get("data") or {}).items()},
                          measured={k: float(v) for k, v in (row.get("measured") or {}).items()})
            for name, row in rows.items()}


def list_pretrained() -> List[str]:
    """The names of the shipped models (``recurvit.load_model(NAME)``, ``recurvit predict NAME IMAGE``)."""
    return sorted(shipped())


def path_of(name: Any) -> Optional[Path]:
    """The file of the shipped model ``name``; None when ``name`` names none (or is a path that exists)."""
    if not isinstance(name, (str, Path)) or Path(name).exists():
        return None
    entry = shipped().get(str(name))
    return entry.file if entry is not None else None


def looks_like_a_name(path: Any) -> bool:
    """Whether ``path`` reads as a bare name (no folder, no suffix) rather than a path: what a missing
    shipped name looks like."""
    p = Path(str(path))
    return p.name == str(path) and not p.suffix and not p.exists()

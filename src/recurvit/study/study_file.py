"""A study file read into its typed keys (:class:`StudyFile`, OmegaConf structured configs): an unknown key, a
missing one or a value of the wrong type is one line naming the key. The keys are described in
:mod:`recurvit.study.spec`, which expands them into the study's grid of runs."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import MISSING
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from ..errors import UserError
from .base_config import MAX_BASE
from .claim_kinds.base import structured

LABEL = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass
class ReportKeys:
    compare: Optional[List[Any]] = None  # pairs of variant labels, e.g. [[naive, ds3]]
    frontier: bool = False


@dataclass
class RegistrationKeys:
    n: Any = None  # runs per cell; n, seeds and checkpoint are checked against the grid (_registration)
    seeds: Any = None
    checkpoint: Any = "last"
    budget: Any = None  # in words, e.g. "60 epochs"


@dataclass
class StudyFile:
    """A study file's keys, typed (see the module docstring); ``from:`` is read as ``from_`` (a keyword)."""

    name: Any = MISSING
    task: Any = "classify"
    base: Any = None
    from_: Any = None
    overrides: Optional[Dict[Any, Any]] = None
    grid: Optional[Dict[Any, Any]] = MISSING
    eval: Optional[Dict[Any, Any]] = None
    report: Optional[ReportKeys] = None
    runs: Optional[str] = None
    results: Optional[str] = None
    claims: Optional[Dict[Any, Any]] = None  # each claim typed by its kind (recurvit.study.claims)
    registration: Optional[RegistrationKeys] = None


SECTIONS = {"": StudyFile, "report": ReportKeys, "registration": RegistrationKeys}


def _keys(cls: type) -> List[str]:
    return [f.name.rstrip("_") for f in fields(cls)]


def _typed(p: Path, raw: Dict[str, Any]) -> StudyFile:
    """The study file's keys, typed by OmegaConf's structured configs; an unknown key, a missing one or a value of
    the wrong type is one line naming the key."""
    try:
        return structured(StudyFile, {("from_" if k == "from" else k): v for k, v in raw.items()})
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        key = "from" if key == "from_" else key
        section, _, name = key.rpartition(".")
        if isinstance(e, MissingMandatoryValue):
            raise UserError(f"study file {p} needs a '{key}:' entry (see recurvit/study/spec.py)") from None
        if isinstance(e, ConfigKeyError) and section in SECTIONS:
            allowed, prefix = _keys(SECTIONS[section]), f"{section}." if section else ""
            near = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; did you mean '{prefix}{near[0]}'?" if near else f" (known: {', '.join(allowed)})"
            msg = f"unknown key '{prefix}{name}'{hint}"
        elif key == "registration":
            msg = f"registration: must be a mapping ({', '.join(_keys(RegistrationKeys))})"
        elif key in ("grid", "overrides", "eval", "report"):
            msg = f"'{key}:' must be a mapping (key: value lines), got a {type(raw[key]).__name__}"
        else:
            msg = f"{key}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        raise UserError(f"study file {p}: {msg}") from None


class _UniqueKeys(yaml.SafeLoader):
    """yaml's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last in silence: two
    grid variants with the same label collapsed into one)."""


def _unique_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor': merged keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"'{key}' is given twice", key_node.start_mark)
            seen.add(key)
        except TypeError:  # an unhashable key: yaml's own constructor says so
            break
    return loader.construct_mapping(node, deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_study_file(p: Path) -> StudyFile:
    """The study file ``p``'s keys, typed; its name checked (it names folders)."""
    if not p.is_file():
        raise UserError(f"study file not found: {p}")
    if p.stat().st_size > MAX_BASE:  # a 200 MB file was parsed for 90 s into a MemoryError
        raise UserError(f"study file {p} is {p.stat().st_size:,} bytes; a study file is a YAML file of a few KB")
    try:
        raw = yaml.load(p.read_text(), Loader=_UniqueKeys) or {}  # safe, and a key given twice is an error
    except yaml.YAMLError as e:
        raise UserError(f"study file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:  # 5,000 nested levels: a 3,000-line traceback before
        raise UserError(f"study file {p} is nested too deeply to be a study file") from None
    if not isinstance(raw, dict):
        raise UserError(f"study file {p} must be a mapping with name, base and grid")
    keys = _typed(p, raw)
    if keys.from_ is None and keys.base is None:
        raise UserError(f"study file {p} needs a 'base:' entry (see recurvit/study/spec.py)")
    name = keys.name  # it names folders (runs/studies/<name>): it must stay inside the working folder
    if not isinstance(name, str) or not LABEL.fullmatch(name) or name in (".", ".."):
        raise UserError(f"study file {p}: name must be one word of letters, digits, '_', '.', '+', '-' (it names "
                        f"the study's folders), got {name!r}")
    return keys

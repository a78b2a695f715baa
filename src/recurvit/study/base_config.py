"""A study's ``base:`` config read as one before any run is made of it, and what a message may show of it.

A ``base:`` may name any file. :func:`check_base` reads it as a config (a YAML mapping of sections: model:,
data:, train:) and refuses anything else in one line that names the file and what is wrong with it, never its
content (a study file may come from someone else, and the file it names is not for a message to print); the
config loader's own check of keys and values follows at :func:`recurvit.study.spec.load_study`. :func:`shown`
clips anything a user wrote to a bounded length for an error line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import yaml

from ..errors import UserError


def shown(text: Any, n: int = 200) -> str:
    """At most ``n`` characters of something a user wrote, for an error line."""
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


MAX_BASE = 1 << 20  # bytes: a config is a YAML file of a few KB
MAX_KEY = 64  # characters of a config's top-level key (a section: model, data, train)
_BASES: Dict[Tuple[str, int, int], bool] = {}  # (path, mtime, size) of a base config already read as one


def check_base(path: Path, study_file: Optional[Path]) -> Path:
    """``path`` if it reads as a config (a YAML mapping of sections), else UserError: one line naming the file
    and what is wrong with it, never its content (the base may name any file: its text is not the user's to
    see in a message, and a study file may come from someone else)."""
    where = f"study file {shown(study_file)}: base config {shown(path)}"
    try:
        st = path.stat()
        if (str(path), st.st_mtime_ns, st.st_size) in _BASES:
            return path
        if st.st_size > MAX_BASE:
            raise UserError(f"{where} is {st.st_size:,} bytes, not a config (a YAML file of a few KB)")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where} is not a text file (not UTF-8), not a config (a YAML file)") from None
    except OSError as e:
        raise UserError(f"{where} cannot be read ({e.strerror})") from None
    try:
        raw = yaml.safe_load(text)  # a tag that would construct an object is an error
    except (yaml.YAMLError, RecursionError) as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{where} is not valid YAML{at} "
                        f"({shown(getattr(e, 'problem', None) or type(e).__name__, 80)})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{where} is not a config: a mapping of sections (model:, data:, train:) is expected, it "
                        f"holds a {'YAML ' + type(raw).__name__ if raw is not None else 'nothing'}")
    long = next((k for k in raw if len(str(k)) > MAX_KEY), None)
    if long is not None:
        raise UserError(f"{where} is not a config: a top-level key of {len(str(long)):,} characters is no section "
                        "(model:, data:, train:)")
    _BASES[str(path), st.st_mtime_ns, st.st_size] = True
    return path

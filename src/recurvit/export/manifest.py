"""The manifest of a step-program folder (``manifest.json``, written by :mod:`recurvit.export.steps`), read and
checked before any program file is opened:

- its structure (format and version, the programs of each part, the names that chain them): an entry missing or
  of the wrong type is one line here, not a KeyError later;
- the file names it gives stay inside the folder: a program is ONE plain file name (no path separator, not
  ``.`` or ``..``, so never absolute) with its backend's suffix, named once; a program file is opened without
  following a link, and only a regular file is read;
- its fingerprints (``integrity``): the sha256 of every program file's bytes and the fingerprint of the weights
  of the run the programs came from (:func:`weights_fingerprint`). :func:`read_programs` hashes every file
  when the set is loaded, before any is deserialized, so a program from another run (of the same
  architecture it would run, and answer differently) or a changed file is refused in one line. The bytes
  hashed are the bytes the backend then loads.

A folder without fingerprints (exported before recurvit wrote them, or a manifest rewritten without them) is
refused with the command that re-exports it, not loaded with a warning: the check is there so that a mixed set
never runs unnoticed, a warning is easy to miss in a deployment's log, and a step-program folder is remade in
seconds from its run.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, List

import torch

from ..errors import UserError

FORMAT = "recurvit.step-program"
VERSION = 1
MANIFEST = "manifest.json"
SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}
PARTS = ("embed", "step", "readout")
MAX_MANIFEST = 16 << 20  # bytes: a manifest is a few KB
REEXPORT = "re-export it: recurvit export RUN --format {backend} --steps-program --out NEW"


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the model's state dict (every entry's name, dtype, shape and bytes, in name order): the same
    weights give the same fingerprint whatever the export, another run's weights another one."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def program_names(m: Dict[str, Any]) -> List[str]:
    """Every program file a (checked) manifest names: embed, steps, readouts, fused programs."""
    p = m["programs"]
    return [p["embed"], *p["step"], *p["readout"], *[f["file"] for f in p.get("fused", [])]]


def _bad(folder: Path, what: str, backend: str = "onnx|torch-export") -> UserError:
    return UserError(f"{folder / MANIFEST} {what}; " + REEXPORT.format(backend=backend))


def _strs(x: Any, empty: bool = False) -> bool:
    return isinstance(x, list) and (empty or len(x) > 0) and all(isinstance(s, str) for s in x)


def _index(x: Any, n: int) -> bool:
    return type(x) is int and 0 <= x < n


def check_name(folder: Path, name: Any, backend: str) -> str:
    """``name`` if it is one plain file name with the backend's suffix, else UserError (one line) naming it."""
    shown = repr(name)[:80]
    if not isinstance(name, str) or name in ("", ".", "..") or len(name) > 255 or any(
            c in name for c in ("/", "\\", "\0")) or os.path.isabs(name) or name != os.path.basename(name):
        raise UserError(f"{folder / MANIFEST} names the program file {shown}: a program must be a file inside its "
                        "folder (one file name, no path separator, not '..'); " + REEXPORT.format(backend=backend))
    if not name.endswith(SUFFIX[backend]):
        raise _bad(folder, f"names the program file {shown}, not a {SUFFIX[backend]} file of its {backend} "
                           "programs", backend)
    return name


def read_manifest(folder: Path) -> Dict[str, Any]:
    """The manifest of the step-program folder ``folder``, its structure and file names checked (see the module
    docstring); UserError, one line, otherwise. No program file is opened."""
    path = folder / MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST:
            raise ValueError(f"{path.stat().st_size:,} bytes")
        m = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{folder} is not a step-program export ({MANIFEST}: "
                        f"{(getattr(e, 'strerror', None) or str(e) or type(e).__name__)[:120]}); write one with "
                        "recurvit export RUN --steps-program") from None
    if not isinstance(m, dict):
        raise _bad(folder, "is not a JSON object")
    version = m.get("version")
    if m.get("format") != FORMAT or type(version) is not int or version > VERSION:
        raise UserError(f"{path} is format {str(m.get('format'))[:60]} version {str(version)[:20]}; this recurvit "
                        f"reads {FORMAT} up to version {VERSION}")
    backend = m.get("backend")
    if backend not in SUFFIX:
        raise _bad(folder, f"names the backend {str(backend)[:40]!r}, not one of {', '.join(SUFFIX)}")
    p = m.get("programs")
    if not isinstance(p, dict) or not isinstance(p.get("embed"), str) or not _strs(p.get("step")) or not _strs(
            p.get("readout")):
        raise _bad(folder, "has no programs entry of an embed file and lists of step and readout files", backend)
    fused = p.get("fused", [])
    if not isinstance(fused, list) or not all(
            isinstance(f, dict) and isinstance(f.get("file"), str) and _index(f.get("step"), len(p["step"]))
            and _index(f.get("readout"), len(p["readout"])) for f in fused):
        raise _bad(folder, "lists fused programs that are not {file, step, readout} of its own programs", backend)
    for name in [p["embed"], *p["step"], *p["readout"], *[f["file"] for f in fused]]:
        check_name(folder, name, backend)
    names = program_names(m)
    if len(set(names)) != len(names):
        raise _bad(folder, "names a program file twice", backend)
    parts = PARTS + (("fused",) if fused else ())
    if not all(isinstance(m.get(k), dict) and all(_strs(m[k].get(part)) for part in parts)
               for k in ("inputs", "outputs")) or not _strs(m.get("state")) or "z" not in m["state"]:
        raise _bad(folder, "does not say the inputs, outputs and state of every program", backend)
    heads = m.get("readout_of_step")
    steps, most = m.get("default_steps"), m.get("max_steps")
    if not isinstance(heads, list) or not heads or not all(_index(h, len(p["readout"])) for h in heads) \
            or type(steps) is not int or steps < 1 or not (most is None or (type(most) is int and most >= 1)):
        raise _bad(folder, "does not say its steps (default_steps, max_steps, readout_of_step)", backend)
    return m


def _read(folder: Path, name: str) -> bytes:
    """The bytes of the regular file ``folder/name``, not through a link (UserError, one line, otherwise)."""
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        what = "a symbolic link" if os.path.islink(path) else e.strerror
        raise UserError(f"program file {path}: {what}; a step-program folder holds its own program files") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UserError(f"program file {path} is not a regular file; a step-program folder holds its own "
                            "program files")
        return f.read()


def read_programs(folder: Path, m: Dict[str, Any]) -> Dict[str, bytes]:
    """{name: bytes} of every program file of the checked manifest ``m``, each the file the export wrote (its
    sha256 the manifest's): UserError, one line, for a folder without fingerprints, a missing file or one whose
    bytes differ (a program from another run, or a changed file)."""
    backend, names = m["backend"], program_names(m)
    integrity = m.get("integrity")
    sums = integrity.get("sha256") if isinstance(integrity, dict) else None
    if not isinstance(sums, dict) or not isinstance(integrity.get("weights"), str):
        raise _bad(folder, "has no fingerprints of its programs (an export from before recurvit checked them, or "
                           "a manifest rewritten without them)", backend)
    if sorted(sums) != sorted(names):
        raise _bad(folder, "fingerprints other files than the programs it names", backend)
    out: Dict[str, bytes] = {}
    for name in names:
        data = _read(folder, name)
        if hashlib.sha256(data).hexdigest() != sums[name]:
            raise UserError(f"{folder / name} is not the program this export wrote (its sha256 differs from the one "
                            f"in {MANIFEST}): a program from another run or a changed file; "
                            + REEXPORT.format(backend=backend))
        out[name] = data
    return out


def seal(folder: Path, m: Dict[str, Any], weights: str) -> Dict[str, Any]:
    """Write ``m`` as the manifest of ``folder`` with its fingerprints: ``weights`` (the run's,
    :func:`weights_fingerprint`) and the sha256 of every program file now in the folder. Returns ``m``."""
    m["integrity"] = {"weights": weights,
                      "sha256": {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in program_names(m)}}
    (folder / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")
    return m


__all__ = ["FORMAT", "MANIFEST", "SUFFIX", "VERSION", "check_name", "program_names", "read_manifest",
           "read_programs", "seal", "weights_fingerprint"]

"""The probe's cases for step-program folders and a study's ``base:`` (issue 57), run by scripts/probe.py.

A step-program folder (``recurvit export RUN --steps-program``) is read through the Python API
(``StepProgram(DIR)``, then an early-exit run; ``quantize_steps``), each case in a fresh interpreter that
prints a UserError as the command line does (one line, exit 2):

- payloads: doctored ``.pt2`` archives shipped as a whole folder, the manifest's fingerprints recomputed for
  the doctored file: a weight marked ``use_pickle``, sample inputs that are a code-running pickle, an opaque
  constant (``pickle.loads``), an input guard that ``.module()`` ``exec``s, a symbolic size that
  ``sympy.sympify`` evaluates; manifest file names that lead outside the folder (``../``, an absolute path, a
  link) to a doctored program, and one that makes ``quantize_steps`` write outside its output;
- bad inputs: a program of another run of the same architecture swapped in, a folder without fingerprints,
  names a program may not have (``/etc/passwd``, ``sub/x.pt2``), a program that is no archive, a manifest
  without programs; and ``study`` files whose ``base:`` names a file that is no config, whose content must not
  appear in the error line.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# run in a fresh interpreter: argv = [kind, folder, out]; a UserError is one line and exit 2, as the CLI does
API = """import sys, torch
from recurvit.errors import UserError
try:
    kind, folder = sys.argv[1], sys.argv[2]
    if kind == "quantize":
        from recurvit.export.int8 import quantize_steps
        quantize_steps(folder, sys.argv[3])
    else:
        from recurvit.export.deploy import StepProgram
        prog = StepProgram(folder)
        c, h, w = prog.manifest["input_shape"]
        prog.adaptive(torch.zeros(2, c, h, w), 0.5, min_steps=prog.default_steps)
except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


def api(kind: str, folder, out=None, timeout=300, env=None) -> subprocess.CompletedProcess:
    """``API`` on ``folder`` in a fresh interpreter (one CPU thread), as scripts/probe.py's ``cli`` runs a command."""
    args = [sys.executable, "-c", API, kind, str(folder), *([str(out)] if out else [])]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", **(env or {})})


class _Touch:
    """Unpickling it runs ``touch MARKER``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _saved(marker) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(_Touch(marker), buf)
    return buf.getvalue()


def rewrite(path: Path, edit) -> None:
    """The .pt2 archive at ``path`` with ``edit(members)`` applied to its {name under the root folder: bytes}."""
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        members = {n[len(root) + 1:]: z.read(n) for n in z.namelist()}
    edit(members)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(f"{root}/{name}", data)
    path.write_bytes(buf.getvalue())


def reseal(folder: Path) -> None:
    """The manifest's sha256 fingerprints recomputed for the files its names now reach (an attacker's folder)."""
    m = json.loads((folder / "manifest.json").read_text())
    sums = (m.get("integrity") or {}).get("sha256") or {}
    for name in sums:
        if (folder / name).is_file():
            sums[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(m))


def _edit_json(member: str, fn):
    def edit(m):
        m[member] = json.dumps(fn(json.loads(m[member]))).encode()
    return edit


def _pickled_weight(marker):
    def fn(cfg):
        cfg["config"][next(iter(cfg["config"]))].update(use_pickle=True, path_name="weight_999")
        return cfg

    def edit(m):
        _edit_json("data/weights/model_weights_config.json", fn)(m)
        m["data/weights/weight_999"] = _saved(marker)
    return edit


def _sample_inputs(marker):
    def edit(m):
        m["data/sample_inputs/model.pt"] = _saved(marker)
    return edit


def _opaque_constant(marker):
    def edit(m):
        m["data/constants/model_constants_config.json"] = json.dumps({"config": {"evil": {
            "path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}}}).encode()
        m["data/constants/opaque_obj_0"] = pickle.dumps(_Touch(marker))
    return edit


def _guard(marker):  # the guard closes torch's _assert( call, runs a statement, and opens a harmless def
    return _edit_json("models/model.json", lambda p: {
        **p, "guards_code": [f"0#\n)\nimport os;os.system('touch {marker}')\ndef g():\n  f=print(0"]})


def _sympy(marker):
    def edit(m):
        text = m["models/model.json"].decode()
        sym = next(k for k in json.loads(text)["range_constraints"] if k.startswith("s"))
        old = f"Symbol('{sym}', positive=True, integer=True)"
        m["models/model.json"] = text.replace(old, f"__import__('os').system('touch {marker}') + {sym}", 1).encode()
    return edit


DOCTORED = [("embed.pt2", _pickled_weight, "a weight marked use_pickle (a torch.save of a code-running object)"),
            ("step.pt2", _pickled_weight, "a weight marked use_pickle"),
            ("embed.pt2", _sample_inputs, "sample inputs a code-running pickle (torch retries them unsafely)"),
            ("embed.pt2", _opaque_constant, "an opaque constant (pickle.loads)"),
            ("readout.pt2", _guard, "an input guard that .module() exec's"),
            ("embed.pt2", _sympy, "a symbolic size that sympy.sympify evaluates")]


def _rename(folder: Path, part: str, name: str) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    old = m["programs"][part] if part == "embed" else m["programs"][part][0]
    if part == "embed":
        m["programs"]["embed"] = name
    else:
        m["programs"][part][0] = name
    sums = (m.get("integrity") or {}).get("sha256")
    if isinstance(sums, dict) and old in sums:
        sums[name] = sums.pop(old)
    (folder / "manifest.json").write_text(json.dumps(m))


def step_program_payloads(tmp: Path, steps: Path, onnx_steps: Path, one, watch) -> None:
    """Each case through ``one(what, make, command, run)`` of scripts/probe.py: ``steps`` a torch.export
    step-program folder (with fused programs), ``onnx_steps`` an ONNX one (None: those cases are left out);
    ``watch(folder, skip)`` the probe's check that nothing outside ``skip`` in ``folder`` was written."""
    run = lambda *a, timeout=300, env=None: api("run", *a, timeout=timeout, env=env)  # noqa: E731
    first = lambda t, o: [t]  # noqa: E731

    def copy(i):
        folder = tmp / f"steps-{i}"
        shutil.copytree(steps, folder / "steps")
        return folder

    for name, edit, label in DOCTORED:
        def make(marker, i, name=name, edit=edit):
            folder = copy(i) / "steps"
            rewrite(folder / name, edit(marker))
            reseal(folder)
            return folder, None
        one(f"step-program folder, {name} with {label}: StepProgram(DIR)", make, first, run)

    for how in ("../elsewhere/embed.pt2", "an absolute path", "a symbolic link"):
        def make(marker, i, how=how):
            top = copy(i)
            folder, elsewhere = top / "steps", top / "elsewhere"
            elsewhere.mkdir()
            shutil.copy(folder / "embed.pt2", elsewhere / "embed.pt2")
            rewrite(elsewhere / "embed.pt2", _pickled_weight(marker))
            if how == "a symbolic link":
                (folder / "embed.pt2").unlink()
                (folder / "embed.pt2").symlink_to(elsewhere / "embed.pt2")
            else:
                _rename(folder, "embed", how if how.startswith("..") else str(elsewhere / "embed.pt2"))
            reseal(folder)
            return folder, watch(top, folder)
        one(f"step-program manifest.json whose embed program is {how} to a doctored program outside: "
            "StepProgram(DIR)", make, first, run)

    if onnx_steps is not None:  # quantize_steps writes OUT's program under the name the manifest gives
        def make(marker, i):
            top = tmp / f"steps-{i}"
            shutil.copytree(onnx_steps, top / "steps")
            shutil.copy(top / "steps" / "step.onnx", top / "outside.onnx")
            _rename(top / "steps", "step", str(top / "outside.onnx"))
            reseal(top / "steps")
            return top / "steps", watch(top, top / "steps")
        one("an ONNX step-program manifest.json naming the absolute path of a file outside: quantize_steps(DIR, "
            "OUT) writes only in OUT", make, lambda t, o: [t, t / "int8"],
            lambda *a, timeout=300, env=None: api("quantize", *a, timeout=timeout, env=env))


def step_program_bad_inputs(tmp: Path, steps: Path, other: Path) -> list:
    """(label, folder) of each bad step-program folder: ``steps`` a torch.export folder with fused programs,
    ``other`` one of another run of the same architecture."""
    cases = []

    def case(label, edit):
        folder = tmp / f"steps-bad-{len(cases)}"
        shutil.copytree(steps, folder)
        edit(folder)
        cases.append((label, folder))

    for name in ("step.pt2", "readout.pt2", "fused.pt2"):
        case(f"{name} of another run of the same architecture", lambda f, n=name: shutil.copy(other / n, f / n))

    def manifest(fn):
        def edit(f):
            m = json.loads((f / "manifest.json").read_text())
            fn(m)
            (f / "manifest.json").write_text(json.dumps(m))
        return edit

    case("a manifest without fingerprints (an older export)", manifest(lambda m: m.pop("integrity", None)))
    case("a manifest naming /etc/passwd as its readout", lambda f: _rename(f, "readout", "/etc/passwd"))
    case("a manifest naming sub/x.pt2 as its step", lambda f: _rename(f, "step", "sub/x.pt2"))
    case("a manifest without programs", manifest(lambda m: m.pop("programs")))
    case("a manifest whose readout is a number", manifest(lambda m: m["programs"].update(readout=[3])))
    case("step.pt2 not an archive (fingerprints recomputed)",
         lambda f: ((f / "step.pt2").write_bytes(b"junk\n"), reseal(f)))
    return cases


def study_base_cases(tmp: Path) -> list:
    """(argv, text that must not appear on stderr) of ``recurvit study`` files whose base names a file that is
    no config: prose, a YAML list, binary bytes, a mapping with a 1,000-character key, a 3,000-character name."""
    secret = "CONFIDENTIAL " + "lorem ipsum " * 210  # 2.5 KB
    key = secret[:1000].replace(" ", "_")  # a key YAML reads (an implicit key is at most 1024 characters)
    files = {"notes.txt": secret.encode(), "list.yaml": f"- {secret}\n- b\n".encode(),
             "blob.bin": b"\xbc\xff\x00" + secret.encode(), "key.yaml": f"{key}: 1\n".encode()}
    out = []
    for name, data in files.items():
        (tmp / name).write_bytes(data)
        study = tmp / f"study-base-{name}.yaml"
        study.write_text(f"name: s\nbase: {tmp / name}\ngrid: {{train.seed: [0]}}\n")
        out.append((["study", study, "--out", tmp / f"never-{name}"], "CONFIDENTIAL"))
    study = tmp / "study-base-long.yaml"
    study.write_text(f"name: s\nbase: {'b' * 3000}\ngrid: {{train.seed: [0]}}\n")
    out.append((["study", study, "--out", tmp / "never-long"], "b" * 300))
    return out

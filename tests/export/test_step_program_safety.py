"""A step-program folder is read with nothing it says executed, only from inside itself, and only as the set
one export wrote (issue 57, items 1, 2 and 8), and a study's ``base:`` is never echoed (item 3).

Each doctored archive below is what an attacker would ship: the whole folder, its manifest's fingerprints
recomputed for the doctored file (so the archive check itself is what must refuse it). Executed = the marker
file the payload would create exists afterwards."""
import hashlib
import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

import recurvit
from recurvit.errors import UserError
from recurvit.export.deploy import StepProgram
from recurvit.export.steps import MANIFEST, export_steps

pytestmark = pytest.mark.usefixtures("one_thread")

try:
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401

    HAS_ONNX = True
except ImportError:
    HAS_ONNX = False
NEEDS_ONNX = pytest.mark.skipif(not HAS_ONNX, reason="needs the onnx extra")

SHAPE = dict(img_size=8, patch_size=4, in_chans=3, num_classes=5, embed_dim=24, num_heads=2)


def build(seed=0):
    torch.manual_seed(seed)
    model = recurvit.create_model("bvit_tiny", steps=3, step_cond="embed", reinject=True, **SHAPE).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.startswith("core."):
                p.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two exports of the same architecture with different weights (two runs), torch.export programs."""
    root = tmp_path_factory.mktemp("exports")
    for seed in (0, 1):
        export_steps(build(seed), root / f"run{seed}", "torch-export", fused=True)
    return root


@pytest.fixture
def folder(exports, tmp_path):
    out = tmp_path / "steps"
    shutil.copytree(exports / "run0", out)
    return out


def images(n=4):
    return torch.randn(n, SHAPE["in_chans"], SHAPE["img_size"], SHAPE["img_size"],
                       generator=torch.Generator().manual_seed(1))


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600, msg
    return msg


def reseal(folder: Path) -> None:
    """The manifest's fingerprints recomputed for the files now in the folder (what an attacker would ship)."""
    m = json.loads((folder / MANIFEST).read_text())
    integrity = m.get("integrity")
    if isinstance(integrity, dict) and isinstance(integrity.get("sha256"), dict):
        for name in integrity["sha256"]:
            integrity["sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(m))


# ------------------------------------------------------------------------ doctored archives
class Touch:
    """Unpickling it runs ``touch MARKER``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def rewrite(path: Path, edit) -> None:
    """The .pt2 archive at ``path`` with ``edit(members, root)`` applied to its {name: bytes} (names without
    the archive's root folder)."""
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        members = {n[len(root) + 1:]: z.read(n) for n in z.namelist()}
    edit(members, root)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(f"{root}/{name}", data)
    path.write_bytes(buf.getvalue())


def pickled_weight(marker):
    """A weight marked use_pickle, its file a torch.save of a code-running object."""
    def edit(m, root):
        cfg = json.loads(m["data/weights/model_weights_config.json"])
        fqn = next(iter(cfg["config"]))
        cfg["config"][fqn].update(use_pickle=True, path_name="weight_999")
        m["data/weights/model_weights_config.json"] = json.dumps(cfg).encode()
        buf = io.BytesIO()
        torch.save(Touch(marker), buf)
        m["data/weights/weight_999"] = buf.getvalue()
    return edit


def pickled_sample_inputs(marker):
    """The sample inputs a code-running pickle (torch reads them again unsafely when the safe load fails)."""
    def edit(m, root):
        buf = io.BytesIO()
        torch.save(Touch(marker), buf)
        m["data/sample_inputs/model.pt"] = buf.getvalue()
    return edit


def opaque_constant(marker):
    """A constant stored as an opaque object: torch reads it with pickle.loads."""
    def edit(m, root):
        m["data/constants/model_constants_config.json"] = json.dumps({"config": {"evil": {
            "path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}}}).encode()
        m["data/constants/opaque_obj_0"] = pickle.dumps(Touch(marker))
    return edit


def guard_code(marker):
    """An input guard that, exec'd when .module() is made, runs a statement of its own."""
    def edit(m, root):
        model = json.loads(m["models/model.json"])
        model["guards_code"] = [f"0#\n)\nimport os;os.system('touch {marker}')\ndef g():\n  f=print(0"]
        m["models/model.json"] = json.dumps(model).encode()
    return edit


def sympy_expression(marker):
    """A symbolic size whose expression, given to sympy.sympify (an eval), runs a command."""
    def edit(m, root):
        text = m["models/model.json"].decode()
        model = json.loads(text)
        sym = next(k for k in model["range_constraints"] if k.startswith("s"))
        old = f"Symbol('{sym}', positive=True, integer=True)"
        assert old in text
        new = f"__import__('os').system('touch {marker}') + {sym}"
        m["models/model.json"] = text.replace(json.dumps(old)[1:-1], new, 1).encode()
    return edit


DOCTORED = {"a weight marked use_pickle": pickled_weight, "sample inputs a pickle": pickled_sample_inputs,
            "an opaque constant": opaque_constant, "guards_code": guard_code, "a sympy expression": sympy_expression}


@pytest.mark.parametrize("what", list(DOCTORED))
def test_a_doctored_program_is_refused_with_nothing_executed(folder, tmp_path, what):
    marker = tmp_path / "executed"
    rewrite(folder / "embed.pt2", DOCTORED[what](marker))
    reseal(folder)
    with pytest.raises(UserError) as e:
        StepProgram(folder)(images())
    assert not marker.exists(), f"{what}: the payload ran"
    assert "embed.pt2" in one_line(e)


def test_a_doctored_step_program_is_refused_too(folder, tmp_path):
    marker = tmp_path / "executed"
    rewrite(folder / "step.pt2", pickled_weight(marker))
    reseal(folder)
    with pytest.raises(UserError, match="step.pt2") as e:
        StepProgram(folder)
    assert not marker.exists()
    one_line(e)


def test_a_program_that_is_not_an_archive_is_one_line(folder):
    (folder / "readout.pt2").write_bytes(b"not a zip archive")
    reseal(folder)
    with pytest.raises(UserError, match="readout.pt2") as e:
        StepProgram(folder)
    one_line(e)


# ------------------------------------------------------------------------ names in the manifest
def renamed(folder: Path, part: str, name: str) -> None:
    m = json.loads((folder / MANIFEST).read_text())
    old = m["programs"][part] if part == "embed" else m["programs"][part][0]
    if part == "embed":
        m["programs"]["embed"] = name
    else:
        m["programs"][part][0] = name
    if isinstance(m.get("integrity"), dict):
        m["integrity"]["sha256"][name] = m["integrity"]["sha256"].pop(old)
    (folder / MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("name", ["../other/embed.pt2", "ABSOLUTE", "/etc/passwd", "sub/embed.pt2", "..",
                                  "embed.pt2\\..\\x.pt2", ""])
def test_a_program_name_outside_the_folder_is_refused_before_anything_is_opened(folder, tmp_path, name):
    other = tmp_path / "other"
    other.mkdir()
    marker = tmp_path / "executed"
    shutil.copy(folder / "embed.pt2", other / "embed.pt2")
    rewrite(other / "embed.pt2", pickled_weight(marker))  # a doctored program where the name points
    name = str(other / "embed.pt2") if name == "ABSOLUTE" else name
    renamed(folder, "embed", name)
    with pytest.raises(UserError) as e:
        StepProgram(folder)
    msg = one_line(e)
    assert not marker.exists()
    assert "manifest.json" in msg and "inside" in msg, msg


def test_a_name_that_is_not_a_string_or_a_manifest_without_programs_is_one_line(folder):
    m = json.loads((folder / MANIFEST).read_text())
    for bad in ({"x": 1}, ["step.pt2"], None):
        m["programs"]["readout"] = [bad]
        (folder / MANIFEST).write_text(json.dumps(m))
        with pytest.raises(UserError, match="manifest.json") as e:
            StepProgram(folder)
        one_line(e)
    del m["programs"]
    (folder / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(UserError, match="manifest.json") as e:
        StepProgram(folder)
    one_line(e)


def test_a_program_file_that_is_a_link_is_refused(folder, tmp_path):
    target = tmp_path / "elsewhere.pt2"
    shutil.move(folder / "readout.pt2", target)
    (folder / "readout.pt2").symlink_to(target)
    with pytest.raises(UserError, match="link") as e:
        StepProgram(folder)
    one_line(e)


@NEEDS_ONNX
def test_int8_reads_and_writes_only_inside_the_folders(tmp_path):
    from recurvit.export.int8 import quantize_steps, weight_bytes

    steps = tmp_path / "steps"
    export_steps(build(), steps, "onnx")
    for name in ("../escape.onnx", str(tmp_path / "abs.onnx")):
        work = tmp_path / "work"
        shutil.copytree(steps, work)
        shutil.copy(steps / "step.onnx", tmp_path / "escape.onnx")
        renamed(work, "step", name)
        for call in (lambda: weight_bytes(work), lambda: quantize_steps(work, tmp_path / "q")):
            with pytest.raises(UserError, match="inside") as e:
                call()
            one_line(e)
        assert not (tmp_path / "q").exists()
        shutil.rmtree(work)
    q = quantize_steps(steps, tmp_path / "q")  # the int8 folder carries the fingerprints of its own files
    assert StepProgram(q, threads=1)(images()).shape == (4, 5)


# ------------------------------------------------------------------------ one export, one set
@pytest.mark.parametrize("name", ["step.pt2", "readout.pt2", "fused.pt2", "embed.pt2"])
def test_a_program_from_another_run_is_refused(exports, folder, name):
    shutil.copy(exports / "run1" / name, folder / name)  # the same architecture, another run's weights
    with pytest.raises(UserError) as e:
        StepProgram(folder)
    msg = one_line(e)
    assert name in msg and "re-export" in msg, msg


def test_the_manifest_fingerprints_the_run_weights_and_every_file(exports):
    a = json.loads((exports / "run0" / MANIFEST).read_text())["integrity"]
    b = json.loads((exports / "run1" / MANIFEST).read_text())["integrity"]
    assert sorted(a["sha256"]) == ["embed.pt2", "fused.pt2", "readout.pt2", "step.pt2"]
    assert a["weights"] != b["weights"] and len(a["weights"]) == 64
    # the weights fingerprint is the run's, whatever the export: the same weights, the same fingerprint
    export_steps(build(0), exports / "again", "torch-export")
    assert json.loads((exports / "again" / MANIFEST).read_text())["integrity"]["weights"] == a["weights"]
    assert StepProgram(exports / "run0").weights == a["weights"]


def test_a_folder_without_fingerprints_is_refused_with_the_fix(folder):
    m = json.loads((folder / MANIFEST).read_text())
    del m["integrity"]
    (folder / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(UserError) as e:
        StepProgram(folder)
    msg = one_line(e)
    assert "fingerprint" in msg and "recurvit export RUN" in msg, msg


# ------------------------------------------------------------------------ a study's base
@pytest.mark.parametrize("content", ["scalar", "list", "binary", "tag", "long-key"])
def test_a_study_base_that_is_not_a_config_is_named_not_echoed(tmp_path, content):
    from recurvit.study.spec import load_study

    secret = "SECRET" + "x" * 2500
    base = tmp_path / "notes.txt"
    if content == "scalar":
        base.write_text(" ".join([secret] * 2) + "\n")
    elif content == "list":
        base.write_text(f"- {secret}\n- b\n")
    elif content == "binary":
        base.write_bytes(b"\xbc\xff" + secret.encode())
    elif content == "tag":
        base.write_text(f"model: !!python/object/apply:os.system ['{secret}']\n")
    else:  # a key YAML reads (an implicit key is at most 1024 characters)
        base.write_text(f"{secret[:1000]}: 1\n")
    study = tmp_path / "study.yaml"
    study.write_text(f"name: s\nbase: {base}\ngrid: {{train.seed: [0]}}\n")
    with pytest.raises(UserError) as e:
        load_study(study)
    msg = one_line(e)
    assert "SECRET" not in msg and "xxxxxxxxxx" not in msg and "notes.txt" in msg, msg


def test_a_study_base_that_is_a_long_name_or_not_a_name_is_one_short_line(tmp_path):
    from recurvit.study.spec import load_study

    study = tmp_path / "study.yaml"
    for base in ("a" * 3000, "[1, 2]", "{a: 1}"):
        study.write_text(f"name: s\nbase: {base}\ngrid: {{train.seed: [0]}}\n")
        with pytest.raises(UserError) as e:
            load_study(study)
        assert "a" * 300 not in one_line(e)

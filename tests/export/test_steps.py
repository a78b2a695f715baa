"""The step-program export: embed / step / readout programs a runtime can stop between steps.

Against eager PyTorch, on tiny models: the programs run to a fixed depth give ``model(x)`` and every step
of ``model.forward_steps(x)``; ``StepProgram.adaptive`` gives the predictions and per-image exit steps of
``forward_adaptive`` at the same max-softmax threshold (exited images leave the batch); the certified
threshold computed with the programs is the one certified with the eager model; a fused program (``--fused``)
is the step and the readout after it in one call, and the exit run on it is the same; int8 programs store ~4x
smaller matmul weights and agree on most of the digits test split; the ODE core is refused in one line."""
import json
import pytest
import torch

import recurvit
from recurvit.errors import UserError
from recurvit.export.deploy import StepProgram, certified_threshold
from recurvit.export.steps import MANIFEST, export_steps
from recurvit.models.adaptive import forward_adaptive

pytestmark = pytest.mark.usefixtures("one_thread")

try:
    import onnx as onnx_lib
    import onnxruntime
    import onnxscript  # noqa: F401
    from onnx import numpy_helper

    HAS_ONNX = True
except ImportError:
    HAS_ONNX = False
NEEDS_ONNX = pytest.mark.skipif(not HAS_ONNX, reason="needs the onnx extra")


def onnx(variant):
    return pytest.param(variant, "onnx", marks=NEEDS_ONNX, id=f"{variant}-onnx")

SHAPE = dict(img_size=8, patch_size=4, in_chans=3, num_classes=5, embed_dim=24, num_heads=2)
VARIANTS = {
    "recurrent": ("bvit_tiny", dict(steps=3)),
    "recurrent-embed-reinject": ("bvit_tiny", dict(steps=3, step_cond="embed", reinject=True)),
    "recurrent-scale": ("bvit_tiny", dict(steps=3, step_cond="scale")),
    "stack": ("vit_tiny", dict(depth=3)),
    "stack-heads": ("vit_tiny", dict(depth=3, stage_heads=3)),  # a head per block (deep supervision)
    "softmor-inplace": ("srvit_tiny", dict(depth=2, recursions=2, router="query")),
    "softmor-cycle": ("srvit_tiny", dict(depth=2, recursions=3, layout="cycle", router="query")),
    "softmor-cycle-last": ("srvit_tiny", dict(depth=2, recursions=2, layout="cycle", mixture="last")),
}
# every variant as torch.export programs; in ONNX those whose step differs in kind (step index and
# re-injected input, per-block programs and heads, the running mixture)
CASES = [(v, "torch-export") for v in VARIANTS] + [
    onnx(v) for v in ("recurrent-embed-reinject", "stack-heads", "softmor-inplace", "softmor-cycle")]


def build(variant):
    name, kw = VARIANTS[variant]
    torch.manual_seed(0)
    model = recurvit.create_model(name, **SHAPE, **kw).eval()
    with torch.no_grad():  # the core's own weights start at zero / one: give them values that matter
        for n, p in model.named_parameters():
            if n.startswith("core."):
                p.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(variant, fmt):
        if (variant, fmt) not in cache:
            model = build(variant)
            out = tmp_path_factory.mktemp("steps") / f"{variant}-{fmt}"
            export_steps(model, out, fmt, fused=True)
            cache[variant, fmt] = model, StepProgram(out, threads=1)
        return cache[variant, fmt]

    return get


def images(n=6, seed=1):
    return torch.randn(n, SHAPE["in_chans"], SHAPE["img_size"], SHAPE["img_size"],
                       generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant,fmt", CASES)
def test_fixed_depth_and_every_step_equal_the_eager_model(exported, variant, fmt):
    model, prog = exported(variant, fmt)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(prog(x), model(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(prog.forward_steps(x), model.forward_steps(x), rtol=1e-4, atol=1e-5)
        # a batch of 1: the dynamic batch was not specialised to the traced example
        torch.testing.assert_close(prog(x[:1]), model(x[:1]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["recurrent-embed-reinject", "recurrent-scale"])
def test_a_conditioned_recurrence_runs_past_its_trained_steps_as_eager_does(exported, variant):
    """The step index is an input, clamped to the learned entries as StepConditioning.index does."""
    model, prog = exported(variant, "torch-export")
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(prog.forward_steps(x, 6), model.forward_steps(x, 6), rtol=1e-4, atol=1e-5)
        # the embedding of step 2 is not that of step 0: a program that ignored its index would fail above
        assert not torch.allclose(model.core.cond.step_embed[0] if variant.endswith("reinject")
                                  else model.core.cond.step_scale[0],
                                  model.core.cond.step_embed[2] if variant.endswith("reinject")
                                  else model.core.cond.step_scale[2])


def spread_threshold(model, x, K):
    """A max-softmax threshold that lets some images exit at each of several steps, half-way between two
    of the eager signals (no signal lies within float tolerance of it)."""
    with torch.no_grad():
        sig = torch.softmax(model.forward_steps(x, K).float(), -1).max(-1).values[:-1].flatten().sort().values
    i = len(sig) // 2
    while sig[i + 1] - sig[i] < 1e-4:
        i += 1
    return float((sig[i] + sig[i + 1]) / 2)


@pytest.mark.parametrize("fused", [False, True], ids=["step+readout", "fused"])
@pytest.mark.parametrize("variant,fmt", [("recurrent", "torch-export"), onnx("recurrent-embed-reinject"),
                                         ("recurrent-scale", "torch-export"), ("stack-heads", "torch-export"),
                                         onnx("stack-heads")])
def test_adaptive_gives_forward_adaptives_predictions_and_exit_steps(exported, variant, fmt, fused):
    model, prog = exported(variant, fmt)
    x = images(48, seed=2)
    K = 5 if model.cfg.core == "recurrent" else 3  # a recurrence may run past its trained depth
    with torch.no_grad():
        thr = spread_threshold(model, x, K)
        want_logits, want_steps = forward_adaptive(model, x, "max_prob", thr, max_steps=K)
        logits, steps = prog.adaptive(x, thr, max_steps=K, fused=fused)
    assert torch.equal(steps, want_steps)
    assert len(set(steps.tolist())) >= 2 and steps.min() < K  # images exited at different steps
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(logits.argmax(-1), want_logits.argmax(-1))
    with torch.no_grad():  # one image at a time (the fused programs take a path of their own at batch 1)
        one = [prog.adaptive(x[i:i + 1], thr, max_steps=K, fused=fused) for i in range(len(x))]
    assert torch.equal(torch.cat([s for _, s in one]), want_steps)
    torch.testing.assert_close(torch.cat([lg for lg, _ in one]), want_logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant,fmt", [("recurrent-scale", "torch-export"), ("stack-heads", "torch-export"),
                                         ("softmor-cycle", "torch-export"), onnx("recurrent-embed-reinject"),
                                         onnx("softmor-cycle")])
def test_a_fused_program_is_the_step_and_the_readout_after_it_in_one_call(exported, variant, fmt):
    """Its outputs: the step program's next state, the readout's logits of that step (the head of the step's
    stage) and their max softmax; a recurrence past its trained steps too."""
    model, prog = exported(variant, fmt)
    K = model.nominal_steps + 2 if model.core.limit is None else model.core.limit
    x = images()
    with torch.no_grad():
        a = b = prog.embed(x)
        for k in range(1, K + 1):
            a = prog.step(a, k)
            b, logits, conf = prog.step_read(b, k)
            for n in prog.manifest["state"]:
                torch.testing.assert_close(torch.as_tensor(b[n]), torch.as_tensor(a[n]), rtol=1e-5, atol=1e-6)
            want = torch.as_tensor(prog.readout(a, k))
            torch.testing.assert_close(torch.as_tensor(logits), want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(torch.as_tensor(conf), torch.softmax(want, -1).amax(-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.as_tensor(logits), model(x, steps=K), rtol=1e-4, atol=1e-5)


def test_adaptive_asked_to_fuse_an_export_without_fused_programs_says_how(tmp_path):
    model = build("recurrent")
    export_steps(model, tmp_path / "plain", "torch-export")
    prog = StepProgram(tmp_path / "plain")
    assert not prog.fused and "fused" not in prog.manifest["programs"]
    with pytest.raises(ValueError, match="--fused"):
        prog.adaptive(images(), 0.5, fused=True)
    logits, _ = prog.adaptive(images(), 0.5)  # the default: the step and readout programs
    assert logits.shape == (6, 5)


def test_a_stack_without_trained_readouts_refuses_an_early_exit_as_eager_does(exported):
    model, prog = exported("stack", "torch-export")
    x = images()
    with pytest.raises(ValueError, match="no readout trained after every block"):
        prog.adaptive(x, 0.5)
    with pytest.raises(ValueError, match="no readout trained after every block"):
        forward_adaptive(model, x, "max_prob", 0.5)
    logits, steps = prog.adaptive(x, 0.5, min_steps=3)  # every block runs: the model's own answer
    torch.testing.assert_close(logits, model(x), rtol=1e-4, atol=1e-5)
    assert steps.tolist() == [3] * len(x)


@pytest.mark.parametrize("variant,step_index,n_steps,max_steps,state,fused", [
    ("recurrent", False, 1, None, ["z"], [(0, 0)]),
    ("recurrent-embed-reinject", True, 1, None, ["z"], [(0, 0)]),
    ("stack", False, 3, 3, ["z"], [(0, 0), (1, 0), (2, 0)]),
    ("stack-heads", False, 3, 3, ["z"], [(0, 0), (1, 1), (2, 2)]),  # step k with the head of k's stage
    ("softmor-inplace", False, 2, 2, ["z"], [(0, 0), (1, 0)]),
    ("softmor-cycle", True, 1, 3, ["z", "mx", "den", "num"], [(0, 0)]),
    ("softmor-cycle-last", False, 1, 2, ["z"], [(0, 0)]),
])
def test_the_manifest_says_how_to_chain_the_programs(exported, variant, step_index, n_steps, max_steps, state,
                                                     fused):
    model, prog = exported(variant, "torch-export")
    m = json.loads((prog.folder / MANIFEST).read_text())
    assert m["format"] == "recurvit.step-program" and m["version"] == 1 and m["backend"] == "torch-export"
    assert m["step_index"] is step_index and ("step" in m["inputs"]["step"]) is step_index
    assert len(m["programs"]["step"]) == n_steps and m["max_steps"] == max_steps and m["state"] == state
    assert m["default_steps"] == model.nominal_steps
    assert [(f["step"], f["readout"]) for f in m["programs"]["fused"]] == fused
    assert m["inputs"]["fused"] == m["inputs"]["step"] and m["outputs"]["fused"] == state + ["logits", "confidence"]
    for name in [m["programs"]["embed"], *m["programs"]["step"], *m["programs"]["readout"],
                 *[f["file"] for f in m["programs"]["fused"]]]:
        assert (prog.folder / name).is_file()
    assert ("x0" in m["inputs"]["step"]) is variant.endswith("reinject")


def test_the_ode_core_is_refused_in_one_line_before_any_folder_is_made(tmp_path):
    model = recurvit.create_model("bvit_tiny", **SHAPE, steps=2, core="ode").eval()
    with pytest.raises(UserError) as e:
        export_steps(model, tmp_path / "ode", "torch-export")
    assert len(str(e.value).splitlines()) == 1 and "no step program" in str(e.value) and "torchdiffeq" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_out_is_refused(tmp_path, exported):
    model, _ = exported("recurrent", "torch-export")
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match="exists"):
        export_steps(model, tmp_path / "taken", "torch-export")


# ------------------------------------------------------------------------ a trained run (digits)
TRAIN = ["model.embed_dim=32", "model.num_heads=2", "model.steps=3", "train.batch_size=32", "train.progress=false",
         "train.epochs=4", "train.lr=5e-3", "train.warmup_epochs=0.5", "train.supervision.stages=3",
         "data.holdout=0.2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from recurvit.cli import main

    out = tmp_path_factory.mktemp("steps_run") / "run"
    assert main(["train", *TRAIN, "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def digits():
    """(calibration images: the run's held-out part of the training split, test images, test labels)."""
    from recurvit.config import DataConfig
    from recurvit.data import build_datasets
    from recurvit.data.calibration import holdout_split

    train, test, _ = build_datasets(DataConfig(name="digits"))
    calib = holdout_split(train, test, 0.2)
    stack = lambda ds: torch.stack([ds[i][0] for i in range(len(ds))])  # noqa: E731
    return stack(calib), stack(test), torch.as_tensor([test[i][1] for i in range(len(test))])


@pytest.fixture(scope="module")
def onnx_steps(run, tmp_path_factory):
    if not HAS_ONNX:
        pytest.skip("needs the onnx extra")
    out = tmp_path_factory.mktemp("steps_onnx") / "bvit"
    export_steps(run, out, "onnx")
    return out


def test_the_manifest_carries_the_runs_preprocessing(run, onnx_steps):
    from recurvit.export.program import preprocessing

    m = json.loads((onnx_steps / MANIFEST).read_text())
    assert m["preprocessing"] == preprocessing(recurvit.load_model(run))
    assert m["preprocessing"]["input_size"] == [1, 8, 8] and len(m["preprocessing"]["label_names"]) == 10


def test_the_certified_threshold_from_the_programs_is_the_eager_one_and_its_exits_match(run, onnx_steps, digits):
    from recurvit.analysis.anytime import trajectories
    from recurvit.analysis.certify import certify

    calib, test_x, _ = digits
    model = recurvit.load_model(run)
    prog = StepProgram(onnx_steps, threads=1)
    eager = certify(trajectories(model, [(calib, torch.zeros(len(calib)))], torch.device("cpu"), 3),
                    "max_prob", 0.1, 0.1, 3)
    got = certified_threshold(prog, calib, epsilon=0.1, delta=0.1)
    assert got["certified"] and got["threshold"] == eager["threshold"] and got["risk"] == eager["risk"]
    assert got["mean_steps"] == pytest.approx(eager["mean_steps"]) and got["mean_steps"] < 3  # it saves steps
    logits, steps = prog.adaptive(test_x, got["threshold"])
    want_logits, want_steps = forward_adaptive(model, test_x, "max_prob", got["threshold"])
    assert torch.equal(steps, want_steps) and torch.equal(logits.argmax(-1), want_logits.argmax(-1))


def test_int8_programs_store_4x_smaller_matmul_weights_and_agree_on_digits(onnx_steps, digits, tmp_path):
    from recurvit.export.int8 import quantization_error, quantize_steps, weight_bytes

    _, test_x, test_y = digits
    q = quantize_steps(onnx_steps, tmp_path / "int8")
    fp, i8 = weight_bytes(onnx_steps), weight_bytes(q)
    assert i8["int8"] > 0 and "int8" not in fp
    # the fp32 bytes that left are the int8 bytes times 4, less the per-tensor scales the int8 file adds
    assert 0.95 * 4 * i8["int8"] < fp["float32"] - i8["float32"] <= 4 * i8["int8"]
    report = quantization_error(onnx_steps, q, test_x, test_y, threads=1)
    assert report["agreement"] >= 0.9  # most of the digits test split: the same answer
    assert abs(report["accuracy"]["int8"] - report["accuracy"]["fp32"]) <= 0.05
    rows = report["per_step"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["max_abs_logit_diff"] > 0 and r["state_rel_error"] > 0 for r in rows)  # int8 changed something
    assert json.loads((q / MANIFEST).read_text())["quantization"]["weight_type"] == "QInt8"
    # the int8 programs run with an early exit as the fp32 ones do
    logits, steps = StepProgram(q, threads=1).adaptive(test_x[:64], 0.9)
    assert logits.shape == (64, 10) and steps.max() <= 3


@NEEDS_ONNX
def test_the_whole_model_onnx_stores_each_shared_weight_once_and_int8_reaches_every_one(tmp_path):
    """A bViT applies its block T times: the exported file holds the block's weights once (the exporter's own
    optimizer left one folded copy of a 64 x 64 projection per step), and int8 quantizes all of them."""
    from recurvit.export.int8 import quantize_model, weight_bytes
    from recurvit.export.program import export_program

    torch.manual_seed(0)
    model = recurvit.create_model("bvit_tiny", **{**SHAPE, "embed_dim": 64}, steps=3).eval()
    path = export_program(model, tmp_path / "bvit.onnx", "onnx")
    stored = [numpy_helper.to_array(i) for i in onnx_lib.load(str(path)).graph.initializer]
    held = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])
    assert sum(a.nbytes for a in stored) <= held
    assert len({(a.shape, a.tobytes()) for a in stored}) == len(stored)  # no two alike
    x = images()
    got = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": x.numpy()})[0]
    assert torch.allclose(torch.from_numpy(got), model(x).detach(), atol=1e-5)
    q = quantize_model(path, tmp_path / "bvit-int8.onnx")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # every Linear's weight (the block's four and the head) once, each with its one-byte zero point
    assert weight_bytes(q)["int8"] == sum(m.weight.numel() + 1 for m in linears)


def test_a_stacks_int8_error_is_reported_per_layer(exported, tmp_path):
    if not HAS_ONNX:
        pytest.skip("needs the onnx extra")
    from recurvit.export.int8 import quantization_error, quantize_steps

    model, prog = exported("stack-heads", "onnx")
    q = quantize_steps(prog.folder, tmp_path / "int8")
    report = quantization_error(prog, q, images(32))
    assert [r["step"] for r in report["per_step"]] == [1, 2, 3] and "accuracy" not in report
    assert all(r["max_abs_logit_diff"] > 0 for r in report["per_step"])


# ------------------------------------------------------------------------ the command line
def test_the_cli_writes_the_step_programs_of_a_run(run, tmp_path, capsys):
    from recurvit.cli import main

    out = tmp_path / "steps"
    assert main(["export", str(run), "--format", "torch-export", "--steps-program", "--fused", "--out", str(out),
                 "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["steps_program"] and sorted(p.split("/")[-1] for p in written["files"]) == [
        "embed.pt2", "fused.pt2", "manifest.json", "readout.pt2", "step.pt2"]
    model = recurvit.load_model(run)
    x = torch.randn(3, 1, 8, 8)
    prog = StepProgram(out)
    with torch.no_grad():
        torch.testing.assert_close(prog(x), model(x), rtol=1e-4, atol=1e-5)
        logits, steps = prog.adaptive(x, 0.5)  # the fused programs
        want_logits, want_steps = forward_adaptive(model, x, "max_prob", 0.5)
    assert prog.fused and torch.equal(steps, want_steps) and torch.equal(logits.argmax(-1), want_logits.argmax(-1))


def test_the_cli_refuses_the_ode_core_and_a_format_without_programs_in_one_line(run, tmp_path, capsys):
    from tests.conftest import fails_in_one_line

    ckpt = torch.load(run / "last.pt", weights_only=True)
    ckpt["config"]["model"]["core"] = "ode"  # the bViT's ODE twin: the same weights
    torch.save(ckpt, tmp_path / "ode.pt")
    fails_in_one_line(capsys, ["export", tmp_path / "ode.pt", "--format", "onnx", "--steps-program", "--out",
                               tmp_path / "ode"], "ode", "has no step program", "torchdiffeq")
    fails_in_one_line(capsys, ["export", run, "--steps-program", "--out", tmp_path / "hf"], "not hf", "--format onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ode.pt"]  # nothing written


@NEEDS_ONNX
def test_the_cli_writes_int8_step_programs_and_an_int8_whole_model(run, tmp_path, capsys):
    from tests.conftest import fails_in_one_line
    from recurvit.cli import main
    from recurvit.export.int8 import weight_bytes

    steps, whole = tmp_path / "steps-int8", tmp_path / "bvit-int8.onnx"
    assert main(["export", str(run), "--format", "onnx", "--steps-program", "--int8", "--out", str(steps)]) == 0
    assert main(["export", str(run), "--format", "onnx", "--int8", "--out", str(whole)]) == 0
    assert json.loads((steps / MANIFEST).read_text())["quantization"]["weight_type"] == "QInt8"
    assert weight_bytes(steps)["int8"] > 0 and weight_bytes(whole)["int8"] > 0
    x, model = torch.randn(16, 1, 8, 8), recurvit.load_model(run)
    got = onnxruntime.InferenceSession(str(whole), providers=["CPUExecutionProvider"]).run(None, {"images": x.numpy()})[0]
    assert (torch.from_numpy(got).argmax(-1) == model(x).argmax(-1)).float().mean() >= 0.8
    assert (StepProgram(steps)(x).argmax(-1) == model(x).argmax(-1)).float().mean() >= 0.8
    fails_in_one_line(capsys, ["export", run, "--format", "torch-export", "--int8", "--out", tmp_path / "x"],
                      "--int8", "--format onnx")
    fails_in_one_line(capsys, ["export", run, "--format", "onnx", "--int8", "--out", whole], "exists")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bvit-int8.onnx", "steps-int8"]  # no scratch left


def test_a_model_with_per_step_adapters_is_refused_and_one_shared_adapter_is_not(tmp_path):
    """Step-LoRA makes the block's weights differ per step: no ONE step program holds them."""
    from recurvit.errors import UserError
    from recurvit.models.adapters import adapter_spec, attach_adapters

    model = build("recurrent")
    attach_adapters(model, adapter_spec(model, "step_lora", rank=2))
    with pytest.raises(UserError, match="per-step LoRA"):
        export_steps(model, tmp_path / "step-lora", "torch-export")
    shared = build("recurrent")
    attach_adapters(shared, adapter_spec(shared, "lora", rank=2))
    export_steps(shared, tmp_path / "lora", "torch-export")  # one adapter for every step: one program
    torch.testing.assert_close(StepProgram(tmp_path / "lora")(images()), shared(images()), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mix", [{}, {"mlp_conv": True, "pos_embed": "none"}], ids=["mlp", "mix-ffn"])
def test_pt2e_int8_runs_any_batch_and_agrees_with_fp32(mix):
    pytest.importorskip("torchao")
    from recurvit.export.int8 import quantize_pt2e

    torch.manual_seed(0)  # mix-ffn: the shared block's depthwise conv runs at every step (one partition each)
    model = recurvit.create_model("bvit_tiny", img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32,
                         num_heads=2, steps=3, **mix).eval()
    calib = torch.rand(65, 3, 16, 16)  # batches of 32, 32 and 1: the lone image joins the batch before it
    q = quantize_pt2e(model, calib, batch_size=32)
    with torch.no_grad():
        for n in (1, 7, 200):  # smaller and larger than any calibration batch
            x = torch.rand(n, 3, 16, 16)
            assert (q(x).argmax(-1) == model(x).argmax(-1)).float().mean() >= 0.8
            assert (q(x) - model(x)).abs().max() < 0.5
    with pytest.raises(UserError, match="at least 2 images"):
        quantize_pt2e(model, calib[:1])

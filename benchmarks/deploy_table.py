"""The deployment table: what a trained run costs and scores where it is deployed, on CPU, in ONE process.

    python benchmarks/deploy_table.py RUN [RUN ...] [--rounds 5] [--calls 20] [--threads 1] [--out PATH]

For each trained run (a run directory; its last.pt by default, ``--checkpoint best`` for the best.pt its validation
split chose) the model runs as

- ``eager``: ``model(x)`` under ``torch.no_grad``;
- ``onnx`` / ``onnx int8``: the whole model (``recurvit export --format onnx``) in onnxruntime, and the same file
  after ``recurvit.export.int8.quantize_model`` (dynamic quantization: int8 MatMul weights);
- ``steps`` / ``steps int8``: the step programs (``recurvit export --format onnx --steps-program``) run to the
  trained depth by ``recurvit.export.deploy.StepProgram``, and after ``quantize_steps``;
- ``steps + certified exit``: the fused step programs (``--fused``: one call a step) with the max-softmax exit
  at the threshold that Learn-then-Test certifies (``certified_threshold``: disagreement with the full-depth
  answer at most epsilon = 0.5 points with confidence 1 - delta = 0.9), calibrated on the run's held-out
  validation split (``data.holdout``) and on nothing else: the test split is read only after the threshold is
  fixed. The readouts after each step are used whether or not training supervised them (the certificate holds
  either way; an untrained readout only makes it less aggressive); where the certificate returns full depth the
  row says "no certified savings" and is not timed (it would run as ``steps``).

Columns: stored weights (the initializers of the ONNX files a runtime loads, or the eager model's parameters
and buffers; int8 rows keep LayerNorms, biases, position embedding and the patch convolution in fp32), peak
memory of one batch-1 inference, batch-1 latency p50 / p99, batch-256 throughput, test accuracy (the whole
test split at batch 256) and the mean steps run. Peak memory is measured in a fresh subprocess per contender
(Linux): after the imports, RSS is read (the baseline); the model is loaded and one batch-1 inference run
(a warm-up: onnxruntime's arena and torch's kernels are set up); the peak-RSS mark is reset
(``/proc/self/clear_refs``) and one more batch-1 inference runs; the figure is ``VmHWM - baseline``: the model
as held in memory plus the inference's working memory, not the Python / library code. Latency and throughput are
timed as ``benchmarks/deploy_latency.py`` times them (interleaved rounds, the order rotated every round; at batch
1 a round makes ``--calls`` single-image calls of each contender on the first test images in turn; p50 / p99 are
over every call, and so is the mean, which with an exit is what the saved steps buy: the latency is bimodal);
the exit's speed-up over ``steps`` is the geometric mean of per-round ratios (batch 1: of the rounds' mean
latencies) with a 95% t-interval. The table records the load average before and after and is marked LOADED when the load before
exceeded half the cores.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from deploy_latency import geo_ci, quantile, run_rounds  # noqa: E402  (the same timing loop)

from recurvit.export.deploy import certified_threshold  # noqa: E402  (module names the test wraps)
from recurvit.run.loaders import held_out_sets  # noqa: E402

EPSILON, DELTA = 0.005, 0.1  # the certified exit: 0.5 points of disagreement with full depth, 1 - delta = 0.9
# (with n calibration images and no disagreement at all, the binomial test certifies epsilon only when
# (1 - epsilon)^n <= delta: at 0.5 points and delta 0.1 that takes n >= 460 images)
BATCH = 256
EXIT = "steps + certified exit"


@dataclass
class Contender:
    name: str
    fn: Callable[[torch.Tensor], Any]  # images -> logits (B, classes)
    weights: int  # stored bytes
    memory: Dict[str, Any]  # what the memory subprocess loads
    evaluate: Optional[Callable[[torch.Tensor], Tuple[Any, torch.Tensor]]] = None  # images -> (logits, steps run)
    note: str = ""
    figures: Dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ data
def stack(ds) -> Tuple[torch.Tensor, torch.Tensor]:
    items = [ds[i] for i in range(len(ds))]
    return torch.stack([x for x, _ in items]), torch.as_tensor([int(y) for _, y in items])


def batches(x: torch.Tensor) -> List[torch.Tensor]:
    return list(x.split(BATCH))


# ------------------------------------------------------------------------------------------------ memory
def _status() -> Dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _memory_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """In a fresh process: the peak RSS of one batch-1 inference above the post-import baseline (bytes)."""
    # every row's child imports the same code before its baseline (recurvit.tasks, which loading a run
    # needs, pulls in timm: ~190 MiB that is code, not the model)
    import numpy as np  # noqa: F401
    import onnxruntime as ort

    import recurvit
    import recurvit.run.load  # noqa: F401
    import recurvit.tasks  # noqa: F401
    from recurvit.export.deploy import StepProgram

    torch.set_num_threads(spec["threads"])
    x = torch.zeros(1, *spec["shape"])
    gc.collect()
    base = _status()["VmRSS"]
    if spec["kind"] == "eager":
        model = recurvit.load_model(spec["path"]).eval()

        def infer():
            with torch.no_grad():
                model(x)
    elif spec["kind"] == "onnx":
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = spec["threads"]
        session = ort.InferenceSession(spec["path"], opts, providers=["CPUExecutionProvider"])
        feed = {"images": x.numpy()}

        def infer():
            session.run(None, feed)
    else:
        prog = StepProgram(spec["path"], threads=spec["threads"])
        if spec["kind"] == "steps":
            def infer():
                prog(x)
        else:
            def infer():
                prog.adaptive(x, spec["threshold"], per_step_readouts=True)
    infer()  # warm-up: the runtime's arena and kernels
    gc.collect()
    loaded = _status()["VmRSS"]
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark to the current RSS
    infer()
    peak = _status()["VmHWM"]
    return {"peak": peak - base, "held": loaded - base}


def peak_memory(spec: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``_memory_child(spec)`` in a fresh Python process; None where /proc is missing (not Linux)."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-child", json.dumps(spec)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ one run
def param_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def onnx_session(path: Path, threads: int) -> Callable:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"images": x.numpy()})[0]


def label_of(run: Path, name: str, model) -> str:
    c = model.cfg
    n = sum(p.numel() for p in model.parameters())
    blocks = len(model.blocks)
    return (f"{run.name}: {name}, {c.core_cls.describe(c)}, {model.nominal_steps} steps, {blocks} "
            f"block{'s' if blocks > 1 else ''} of width {c.embed_dim}, {n:,} parameters")


def build(run: Path, tmp: Path, args, log) -> Tuple[str, int, List[Contender], Dict[str, Any], Callable]:
    """The contenders of one run, its certificate, and a function giving the test split (read only after
    the certificate is computed)."""
    import recurvit
    import recurvit.tasks  # noqa: F401  (registers the checkpoint readers export_program loads the run with)
    from recurvit.config import load_config
    from recurvit.export.deploy import StepProgram
    from recurvit.export.int8 import quantize_model, quantize_steps, weight_bytes
    from recurvit.export.program import export_program
    from recurvit.export.steps import export_steps

    threads = args.threads
    cfg = load_config(run / "config.yaml")
    source = run / "last.pt" if args.checkpoint == "last" else run  # a run directory gives its best.pt
    model = recurvit.load_model(source).eval()
    label = label_of(run, cfg.model.name, model)
    shape = [model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size]
    val_set, test_set = held_out_sets(cfg)  # the held-out part of the training split (or None), the test split
    log(f"{run.name}: exporting")
    whole, steps = tmp / f"{run.name}.onnx", tmp / f"{run.name}-steps"
    export_program(source, whole, "onnx")
    whole8 = quantize_model(whole, tmp / f"{run.name}-int8.onnx")
    export_steps(model, steps, "onnx", fused=True)
    steps8 = quantize_steps(steps, tmp / f"{run.name}-steps-int8")
    prog, prog8 = StepProgram(steps, threads=threads), StepProgram(steps8, threads=threads)
    mem = lambda kind, path, **kw: {"kind": kind, "path": str(path), "shape": shape, "threads": threads, **kw}  # noqa: E731
    contenders = [
        Contender("eager", lambda x: model(x), param_bytes(model), mem("eager", source), note="fp32"),
        Contender("onnx", onnx_session(whole, threads), weight_bytes(whole)["total"], mem("onnx", whole),
                  note="fp32"),
        Contender("onnx int8", onnx_session(whole8, threads), weight_bytes(whole8)["total"], mem("onnx", whole8),
                  note="int8 MatMuls"),
        Contender("steps", lambda x: prog(x), weight_bytes(steps)["total"], mem("steps", steps), note="fp32"),
        Contender("steps int8", lambda x: prog8(x), weight_bytes(steps8)["total"], mem("steps", steps8),
                  note="int8 MatMuls"),
    ]
    if val_set is None:
        cert = {"certified": False, "threshold": None, "reason": "the run has no validation split (data.holdout)"}
    else:
        log(f"{run.name}: certifying the exit on the {len(val_set)} validation images")
        val_x, _ = stack(val_set)  # labels are not read: the loss is the disagreement with full depth
        cert = certified_threshold(prog, val_x, epsilon=args.epsilon, delta=args.delta, per_step_readouts=True)
        cert["calibration_images"] = len(val_x)
    if cert["certified"]:
        thr = cert["threshold"]
        m = prog.manifest["programs"]
        fused_bytes = sum(weight_bytes(steps / n)["total"] for n in [m["embed"], *[f["file"] for f in m["fused"]]])
        contenders.append(Contender(
            EXIT, lambda x: prog.adaptive(x, thr, per_step_readouts=True)[0], fused_bytes,
            mem("exit", steps, threshold=thr), lambda x: prog.adaptive(x, thr, per_step_readouts=True),
            "fp32, embed + fused programs"))

    def test_split():
        return stack(test_set)

    return label, model.nominal_steps, contenders, cert, test_split


def measure(run: Path, tmp: Path, args, log) -> Dict[str, Any]:
    label, steps, contenders, cert, test_split = build(run, tmp, args, log)
    log(f"{run.name}: test accuracy")
    test_x, test_y = test_split()  # only now: the threshold above was fixed without it
    preds: Dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for c in contenders:
            out = [c.evaluate(x) if c.evaluate else (c.fn(x), None) for x in batches(test_x)]
            preds[c.name] = torch.cat([torch.as_tensor(logits).argmax(-1) for logits, _ in out])
            c.figures["accuracy"] = float((preds[c.name] == test_y).double().mean())
            if c.evaluate:
                c.figures["mean_steps"] = float(torch.cat([s for _, s in out]).double().mean())
    if EXIT in preds:  # the certified quantity on the test split: disagreement with the full-depth answer
        cert["test_disagreement"] = float((preds[EXIT] != preds["steps"]).double().mean())
        cert["test_accuracy_loss"] = (float((preds["steps"] == test_y).double().mean())
                                      - float((preds[EXIT] == test_y).double().mean()))
    log(f"{run.name}: timing, {args.rounds} rounds")
    fns = {(label, c.name): c.fn for c in contenders}
    x = test_x[:BATCH]
    per_round1, every1 = run_rounds(fns, list(x.split(1)), args.rounds, args.calls)
    per_round256, _ = run_rounds(fns, [x], args.rounds, 1)
    for c in contenders:
        k = (label, c.name)
        c.figures.update(p50_ms=1e3 * quantile(every1[k], 0.5), p99_ms=1e3 * quantile(every1[k], 0.99),
                         mean_ms=1e3 * statistics.fmean(every1[k]),
                         images_per_s=BATCH / statistics.median(per_round256[k]))
    speedup = {}
    if EXIT in preds:
        # batch 1: the MEAN of a round's calls (with an exit the latency is bimodal, images leaving after step
        # 1 or running on: its median is one of the modes); the same images in the same round for both
        s, e = (label, "steps"), (label, EXIT)
        mean1 = {n: [statistics.fmean(every1[n][i:i + args.calls]) for i in range(0, len(every1[n]), args.calls)]
                 for n in (s, e)}
        speedup = {"batch1": geo_ci([a / b for a, b in zip(mean1[s], mean1[e])]),
                   "batch256": geo_ci([a / b for a, b in zip(per_round256[s], per_round256[e])])}
    if not args.no_memory:
        log(f"{run.name}: peak memory, one subprocess per contender")
        for c in contenders:
            c.figures["memory"] = peak_memory(c.memory)
    return {"run": str(run), "label": label, "steps": steps, "certificate": cert, "exit_speedup": speedup,
            "test_images": len(test_x),
            "rows": [{"runs_as": c.name, "weights_bytes": c.weights, "weights": c.note, **c.figures}
                     for c in contenders]}


# ------------------------------------------------------------------------------------------------ the page
COLUMNS = ["runs as", "stored weights (KiB)", "peak memory, batch 1 (MiB)", "latency p50 (ms)", "p99 (ms)",
           "mean (ms)", "batch 256 (images/s)", "test accuracy", "mean steps"]


def render(results: List[Dict[str, Any]], header: List[str]) -> str:
    lines = list(header)
    for r in results:
        cert = r["certificate"]
        lines += [f"### {r['label']}", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for row in r["rows"]:
            mem = row.get("memory")
            peak = "—" if not mem else f"{mem['peak'] / 2 ** 20:.1f}"
            steps = f"{row['mean_steps']:.2f}" if "mean_steps" in row else str(r["steps"])
            lines.append(f"| {row['runs_as']} | {row['weights_bytes'] / 1024:,.0f} ({row['weights']}) | {peak} | "
                         f"{row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['mean_ms']:.3f} | "
                         f"{row['images_per_s']:,.0f} | "
                         f"{100 * row['accuracy']:.2f}% | {steps} |")
        if not cert["certified"]:
            why = cert.get("reason") or (f"on the {cert['n']} validation images not even the least aggressive "
                                         "threshold of the grid passed the test")
            lines.append(f"| {EXIT} | no certified savings: the certificate returns full depth ({why}); it runs "
                         "as `steps` | | | | | | |")
            lines += [""]
        else:
            lines += ["", f"Certified exit: max-softmax threshold {cert['threshold']:.4f} (epsilon "
                          f"{100 * cert['epsilon']:g} points, 1 - delta = {1 - cert['delta']:g}), calibrated on the "
                          f"{cert['n']} images of the validation split: disagreement with full depth "
                          f"{100 * cert['risk']:.2f}% there, mean steps {cert['mean_steps']:.2f} of "
                          f"{cert['max_steps']}. On the {r['test_images']:,} test images: disagreement with full "
                          f"depth {100 * cert['test_disagreement']:.2f}% (the certificate bounds the rate on new "
                          f"images at {100 * cert['epsilon']:g}% with confidence {1 - cert['delta']:g}"
                          f"{': this test split is above it' if cert['test_disagreement'] > cert['epsilon'] else ''}), "
                          f"accuracy lost against `steps` "
                          f"{100 * cert['test_accuracy_loss']:.2f} points. Speed of the exit against `steps`, the "
                          f"geometric mean of per-round ratios [95%]: batch 1 {r['exit_speedup']['batch1']} (mean "
                          f"latency of a round), batch 256 {r['exit_speedup']['batch256']} (images/s).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="trained run directories")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (fewer while the machine is loaded)")
    p.add_argument("--calls", type=int, default=20, help="single-image calls per contender and round at batch 1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="which weights of each run: last.pt (default: nothing chosen on any split, so the validation "
                        "split that calibrates the exit is fresh to them) or best.pt (chosen on that same split)")
    p.add_argument("--machine", default=f"cpu-{os.cpu_count()}c")
    p.add_argument("--out", type=Path, default=None,
                   help="the page to write (default benchmarks/results/deploy-table-<machine>.md)")
    p.add_argument("--epsilon", type=float, default=EPSILON,
                   help="the certified exit's tolerated disagreement with full depth, a fraction (default 0.005)")
    p.add_argument("--delta", type=float, default=DELTA, help="1 - the certificate's confidence (default 0.1)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child is not None:
        print(json.dumps(_memory_child(json.loads(args.memory_child))))
        return 0
    if not args.runs:
        p.error("give at least one run directory")
    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(run, Path(tmp), args, log) for run in args.runs]
    load_after = os.getloadavg()
    loaded = load_before[0] > cores * 0.5
    import onnxruntime

    cmd = "python benchmarks/deploy_table.py " + " ".join(
        str(a) for a in (argv if argv is not None else sys.argv[1:]) if a != "--json")
    header = [
        f"Generated by `{cmd.strip()}`; do not edit by hand. On {args.machine}: torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds "
        f"({args.calls} single-image calls a round at batch 1), wall-clock; {time.process_time() - cpu0:.0f} s of "
        f"CPU in {time.perf_counter() - wall0:.0f} s.", "",
        f"Load average (1 / 5 / 15 min) before: {' / '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{' / '.join(f'{v:.2f}' for v in load_after)}; {cores} cores. " + (
            f"**LOADED**: the load before the run exceeded {cores * 0.5:g} (half the cores): other processes "
            "shared the CPU, so latency and throughput are low and noisy; weights, memory and accuracy are not "
            "affected. Rerun on a quiet machine before quoting any speed." if loaded else
            "Quiet: the load before the run was at most half the cores."), "",
        "Peak memory: RSS high-water mark of one batch-1 inference (after a warm-up one) above the RSS after the "
        "imports, in a fresh subprocess per row (the model as held plus the inference's working memory). "
        "Stored weights: the ONNX initializers a runtime loads (the eager row: parameters and buffers). The "
        f"certified exit: Learn-then-Test at epsilon = {100 * args.epsilon:g} points of disagreement with the "
        f"full-depth answer, 1 - delta = {1 - args.delta:g}, calibrated on the run's validation split only ("
        + ("the weights are last.pt: nothing was chosen on that split" if args.checkpoint == "last" else
           "the weights are best.pt, chosen on that same split")
        + "; the test split is read after the threshold is fixed).", ""]
    text = render(results, header)
    out = args.out or HERE / "results" / f"deploy-table-{args.machine}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    if args.json:
        print(json.dumps({"loaded": loaded, "load_before": load_before, "load_after": load_after, "out": str(out),
                          "runs": results}, indent=1, default=str))
    else:
        print(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

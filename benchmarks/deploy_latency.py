"""Deployed speed on CPU: eager against exported, exported with an early exit, and int8, for the bViT and the
ViT of equal FLOPs, at batch 1 (latency) and batch 256 (throughput), in ONE process.

    python benchmarks/deploy_latency.py [--rounds 15] [--calls 20] [--threads 1]

Models: the Fashion-MNIST shape of the Crossroads studies (28 px, 7 px patches: 16 tokens, width 64), the bViT
at T = 6 and the ViT with 6 blocks (equal FLOPs), random weights (speed does not depend on them; the exit does,
see below). Each runs as

- ``eager``: ``model(x)`` under ``torch.no_grad``;
- ``onnx``: the whole model (``recurvit export --format onnx``) in onnxruntime;
- ``steps``: the step programs (``recurvit export --format onnx --steps-program``) run to the trained depth by
  ``recurvit.export.deploy.StepProgram`` (one onnxruntime call per program: embed, T steps, readout);
- ``steps+exit`` (bViT only): the same with the max-softmax exit, exited images leaving the batch. Random weights
  have no meaningful confidence, so the threshold is the median of the max-softmax after steps 1..T-1 on a
  separate batch: the row measures the mechanism at the mean steps it reports, not a calibrated exit. (A ViT
  exits only with a head trained after every block, which a random ViT does not have.)
- ``steps+exit fused`` (bViT only): the same exit on the fused programs (``--steps-program --fused``): the step
  and the readout after it (with its max softmax) in ONE onnxruntime call a step, where ``steps+exit`` makes two
  (step, readout) and computes the softmax in numpy; the same threshold, so the same exits;
- ``steps int8``: the step programs after ``recurvit.export.int8.quantize_steps`` (dynamic int8 MatMuls).

Timing is interleaved: every round times every (model, contender) once, the order rotated per round; at batch 1
a round times ``--calls`` single-image calls of each (the 256 images in turn, the same for every contender) and
takes their median, and p50 / p99 / mean are over every call (with the exit, images that stop at step 1 and images
that run all T steps make the latency bimodal: the mean is what the saved steps buy).
Ratios are taken within a round (x eager: the model's eager time / this one; bViT / ViT: the ViT's time / the
bViT's for the same contender, > 1 means the bViT is faster) and summarised by their geometric mean with a 95%
t-interval over rounds. The table records the load average before and after the run; it is marked LOADED when
the load before it exceeded half the cores (other processes then share the CPU and every figure is suspect,
the ratios less so). Writes ``benchmarks/results/deploy-<machine>.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

SHAPE = dict(img_size=28, in_chans=1, num_classes=10, patch_size=7, embed_dim=64, num_heads=2,
             global_pool="avg", class_token=False)
MODELS = {"bViT (T = 6)": ("bvit_tiny", dict(steps=6)), "ViT (6 blocks)": ("vit_tiny", dict(depth=6))}


def whole_onnx(model, path: Path, threads: int):
    import onnxruntime as ort

    batch = torch.export.Dim("batch", min=1, max=4096)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(model, (torch.zeros(2, 1, 28, 28),), None, dynamo=True, dynamic_shapes=({0: batch},),
                          input_names=["images"], output_names=["logits"]).save(str(path))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"images": x.numpy()})[0]


def build(tmp: Path, threads: int, log) -> Tuple[Dict[Tuple[str, str], Callable], Dict[str, dict]]:
    import recurvit
    from recurvit.export.deploy import StepProgram
    from recurvit.export.int8 import quantize_steps, weight_bytes
    from recurvit.export.steps import export_steps

    fns, info = {}, {}
    calib = torch.randn(256, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    for label, (name, kw) in MODELS.items():
        torch.manual_seed(0)
        model = recurvit.create_model(name, **SHAPE, **kw).eval()
        log(f"exporting {label}")
        folder = tmp / name
        export_steps(model, folder, "onnx", fused=True)
        steps = StepProgram(folder, threads=threads)
        int8 = StepProgram(quantize_steps(folder, tmp / f"{name}-int8"), threads=threads)
        fns[label, "eager"] = lambda x, m=model: m(x)
        fns[label, "onnx"] = whole_onnx(model, tmp / f"{name}.onnx", threads)
        fns[label, "steps"] = steps
        fns[label, "steps int8"] = int8
        info[label] = {"weights_fp32": weight_bytes(folder)["total"], "weights_int8": weight_bytes(tmp / f"{name}-int8")}
        if model.cfg.core_cls.shares_blocks:
            T = model.nominal_steps
            with torch.no_grad():
                sig = torch.softmax(steps.forward_steps(calib).float(), -1).max(-1).values[:T - 1]
            thr = float(sig.median())
            fns[label, "steps+exit"] = lambda x, p=steps, t=thr: p.adaptive(x, t, fused=False)[0]
            fns[label, "steps+exit fused"] = lambda x, p=steps, t=thr: p.adaptive(x, t, fused=True)[0]
            info[label].update(threshold=thr, steps=steps)
    return fns, info


def run_rounds(fns: Dict[Tuple[str, str], Callable], xs: List[torch.Tensor], rounds: int, calls: int
               ) -> Tuple[Dict[Tuple[str, str], List[float]], Dict[Tuple[str, str], List[float]]]:
    """(per-round figure: median seconds of this round's calls, every call's seconds) of each contender.
    Call i of round r reads ``xs[(r * calls + i) % len(xs)]``: every contender sees the same inputs."""
    names = list(fns)
    with torch.no_grad():
        for k in names:  # warm-up
            fns[k](xs[0])
            fns[k](xs[-1])
        per_round = {k: [] for k in names}
        every = {k: [] for k in names}
        for r in range(rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                ts = []
                for i in range(calls):
                    x = xs[(r * calls + i) % len(xs)]
                    t0 = time.perf_counter()
                    fns[k](x)
                    ts.append(time.perf_counter() - t0)
                per_round[k].append(statistics.median(ts))
                every[k] += ts
    return per_round, every


def geo_ci(ratios: List[float], figures: Optional[Dict[str, dict]] = None, key: str = "") -> str:
    """Geometric mean of per-round ratios with its 95% t-interval, as text; also stored under ``key`` in
    ``figures`` (mean, lo, hi, rounds) where given."""
    from recurvit.export.certified import geometric_ratio

    g = geometric_ratio(ratios, [1.0] * len(ratios))
    if figures is not None:
        figures[key] = g
    if math.isnan(g["lo"]):
        return f"{g['mean']:.2f}"
    return f"{g['mean']:.2f} [{g['lo']:.2f}, {g['hi']:.2f}]"


def quantile(v: List[float], q: float) -> float:
    return float(torch.quantile(torch.tensor(v, dtype=torch.float64), q))


def table(batch: int, per_round, every, info, x, figures: Dict[str, dict]) -> List[str]:
    (bvit, vit) = list(MODELS)
    if batch == 1:
        head = ["| model | runs as | latency p50 (ms) | p99 (ms) | mean (ms) | × eager [95%] | bViT / ViT [95%] "
                "| mean steps |", "|---|---|---|---|---|---|---|---|"]
    else:
        head = ["| model | runs as | images/s (median) | × eager [95%] | bViT / ViT [95%] | mean steps |",
                "|---|---|---|---|---|---|"]
    rows = []
    for (m, c), ts in per_round.items():
        who = "bvit" if m == bvit else "vit"
        vs_eager = geo_ci([e / t for e, t in zip(per_round[m, "eager"], ts)], figures,
                          f"b{batch} {c} {who} over eager")
        vs = "—"  # on the bViT's row: the ViT's time / the bViT's, for the same contender
        if m == bvit and (vit, c) in per_round:
            vs = geo_ci([tv / tb for tb, tv in zip(ts, per_round[vit, c])], figures, f"b{batch} {c} bvit over vit")
        steps = "6"  # every fixed-depth contender runs T = 6 steps (blocks)
        if c.startswith("steps+exit"):  # the exit steps of the timed images
            with torch.no_grad():
                steps = f"{float(info[m]['steps'].adaptive(x, info[m]['threshold'])[1].double().mean()):.2f}"
        if batch == 1:
            rows.append(f"| {m} | {c} | {1e3 * quantile(every[m, c], 0.5):.3f} | {1e3 * quantile(every[m, c], 0.99):.3f} "
                        f"| {1e3 * statistics.fmean(every[m, c]):.3f} | {vs_eager} | {vs} | {steps} |")
        else:
            rows.append(f"| {m} | {c} | {batch / statistics.median(ts):,.0f} | {vs_eager} | {vs} | {steps} |")
    return head + rows


def fused_note(batch: int, every, calls: int) -> List[str]:
    """At batch 1: the exit on the fused programs against the exit on step + readout programs and against
    ``steps``, as the geometric mean of per-round ratios of MEAN latency (the exit makes the latency bimodal,
    so a round's median is one of its modes), the same images in the same round."""
    bvit = list(MODELS)[0]
    if batch != 1 or (bvit, "steps+exit fused") not in every:
        return []
    mean = {c: [statistics.fmean(every[bvit, c][i:i + calls]) for i in range(0, len(every[bvit, c]), calls)]
            for c in ("steps", "steps+exit", "steps+exit fused")}
    vs = lambda a, b: geo_ci([u / v for u, v in zip(mean[a], mean[b])])  # noqa: E731
    return ["", f"Mean latency, ratio of per-round means [95%] (> 1: the second is faster): `steps+exit` / "
                f"`steps+exit fused` {vs('steps+exit', 'steps+exit fused')}; `steps` / `steps+exit fused` "
                f"{vs('steps', 'steps+exit fused')}; `steps` / `steps+exit` {vs('steps', 'steps+exit')}."]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (each gives one ratio)")
    p.add_argument("--calls", type=int, default=20, help="single-image calls per contender and round at batch 1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--machine", default=f"cpu-{os.cpu_count()}c")
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/deploy-<machine>.md")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    sections, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        fns, info = build(Path(tmp), args.threads, log)
        # the same 256 images at both batch sizes: one batch of 256, or one image per call in turn
        x = torch.randn(256, 1, 28, 28, generator=torch.Generator().manual_seed(2))
        for batch, calls in ((1, args.calls), (256, 1)):
            xs = list(x.split(batch))
            log(f"batch {batch}: {args.rounds} rounds x {len(fns)} contenders x {calls} calls")
            per_round, every = run_rounds(fns, xs, args.rounds, calls)
            sections.append((batch, table(batch, per_round, every, info, x, figures) + fused_note(batch, every, calls)))
    load_after = os.getloadavg()
    # loaded before it, or something else started during it (the load after includes this benchmark's own thread)
    loaded = load_before[0] > cores * 0.5 or load_after[0] - 1 > cores * 0.5
    import onnxruntime

    cmd = "python benchmarks/deploy_latency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"Generated by `{cmd.strip()}` on {args.machine}: torch {torch.__version__}, onnxruntime "
             f"{onnxruntime.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds, wall-clock; "
             f"{time.process_time() - cpu0:.0f} s of CPU in {time.perf_counter() - wall0:.0f} s.", "",
             f"Load average (1 / 5 / 15 min) before: {' / '.join(f'{v:.2f}' for v in load_before)}; after: "
             f"{' / '.join(f'{v:.2f}' for v in load_after)} (after includes this benchmark's own thread); {cores} "
             "cores. " + (f"**LOADED**: the load before the run exceeded {cores * 0.5:g} (half the cores): other "
                          "processes shared the CPU, so absolute figures are low and noisy; read the ratios, and "
                          "rerun on a quiet machine before quoting any." if loaded else
                          "Quiet: the load before the run was at most half the cores."), "",
             "Random weights (speed does not depend on them). `steps+exit` uses the median max-softmax of a separate "
             "batch as its threshold, so it shows the mechanism's cost at the mean steps given, not a calibrated "
             "exit; `steps+exit fused` is the same exit making one call a step (the fused programs). Stored weights of "
             "the step programs: " + "; ".join(
                 f"{m} {i['weights_fp32'] / 1024:.0f} KiB fp32, {i['weights_int8']['total'] / 1024:.0f} KiB int8 "
                 f"({i['weights_int8'].get('int8', 0) / 1024:.0f} KiB of it int8 MatMul weights)"
                 for m, i in info.items()) + ".", ""]
    for batch, rows in sections:
        lines += [f"### Batch {batch}" + (" (latency of one image)" if batch == 1 else " (throughput)"), "", *rows, ""]
    out = args.out or Path(__file__).parent / "results" / f"deploy-{args.machine}.md"
    out.write_text("\n".join(lines))
    # the ratios as figures (the findings table's deployment targets read them): {"b1 onnx bvit over vit":
    # {mean, lo, hi, rounds}, ...}, with whether the machine was loaded
    out.with_suffix(".json").write_text(json.dumps(
        {"command": cmd.strip(), "machine": args.machine, "loaded": loaded, "load_before": load_before,
         "load_after": load_after, "rounds": args.rounds, "ratios": figures}, indent=1) + "\n")
    print("\n".join(lines))
    print(f"wrote {out} and {out.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

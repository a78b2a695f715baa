"""Speed and memory of the recurrence, side by side with timm, in ONE process.

    python benchmarks/throughput.py [--json] [--quick]                       # CIFAR-100 shape, this machine
    python benchmarks/throughput.py --img-size 224 --patch-size 16 --width base --classes 1000 \\
        --amp bf16 --batch 128 --tag imagenet-base                           # ImageNet shape (benchmarks/gpu.sh)
    python benchmarks/throughput.py --report benchmarks/results/cpu-2c.csv   # markdown table of a results file

What it measures (default shape: 32x32 images, 4x4 patches, 100 classes, width "tiny",
depth = steps = 12):

1. Training and inference images per second of our ``bvit`` (ONE block x 12 steps), our ``vit``
   (12 blocks) and timm's ``VisionTransformer`` of the same shape (timm is the peer: same width,
   depth = steps), plus bViT with activation checkpointing (its time cost). A training step is
   forward + cross-entropy + backward + AdamW (fused on CUDA), the same for every model.
2. Achieved FLOP/s of each training step (counted FLOPs, ``recurvit.analysis.accounting``) as a
   fraction of a dense-matmul peak measured in the same run (an n x n matmul in the run's dtype).
3. Peak training memory (forward + backward) of bViT against steps T = 6, 12, 24, 48, with and
   without activation checkpointing, as :func:`recurvit.analysis.memory.peak_train_memory` measures it
   (the one definition `recurvit flops` reports too): CUDA ``torch.cuda.max_memory_allocated`` during
   the step; CPU the bytes autograd saves for the backward pass (activations).
4. ``forward_steps(K=48)`` (logits after every step in one pass) against 48 separate forward
   passes ``model(x, steps=k)``, k = 1..48.

Timing is INTERLEAVED: every round times each contender in turn (order rotated per round), so
machine drift hits all alike; ratios are taken within a round, then the median over rounds.
Results go to ``benchmarks/results/<machine>[-<tag>].csv`` (machine: ``cpu-<N>c`` or the GPU's
name), one row per figure, and its generated table to ``<machine>[-<tag>].md`` (for the README's
``<!-- include: ... -->`` blocks, see scripts/update_readme.py); ``--json`` prints them with the
summary.

On a shared CPU machine run it with ``--threads 1``: the timer is then the process's CPU time,
which other processes do not distort (``--clock``).
"""
from __future__ import annotations

import argparse
import copy
import csv
import datetime as _dt
import json
import os
import re
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent

from recurvit import create_model  # noqa: E402  (the installed package: pip install -e .)
from recurvit.analysis.accounting import measure_flops  # noqa: E402
from recurvit.analysis.memory import peak_train_memory  # noqa: E402  (one definition of the figure)
from recurvit.analysis.timing import CLOCKS, interleaved_rounds, sync  # noqa: E402
from recurvit.models.speed import compile_blocks, set_activation_checkpointing  # noqa: E402

WIDTHS = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}
MEMORY_STEPS = (6, 12, 24, 48)
HORIZON = 48
TARGETS = {  # the speed and memory goals the benchmark reports against
    "train_speed_bvit_vs_timm": (">=", 1.0),
    "train_flops_fraction_of_matmul_peak": (">=", 0.70),
    "memory_ratio_checkpointing_T48": ("<=", 0.30),
    "forward_steps_speedup_K48": (">=", 10.0),
}
FIELDS = ["machine", "section", "name", "metric", "value", "unit", "batch", "img_size", "patch_size", "embed_dim",
          "steps", "dtype", "threads", "clock", "torch", "date"]


# ------------------------------------------------------------------------------- utilities
def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu-{os.cpu_count()}c"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ---------------------------------------------------------------------------------- models
def build_models(args, device: torch.device) -> Dict[str, nn.Module]:
    try:
        from timm.models.vision_transformer import VisionTransformer as TimmViT
    except ImportError:
        sys.exit("error: the peer model needs timm; install it with `pip install -e .[dev]` (or `pip install timm`)")

    D, heads = WIDTHS[args.width]
    shape = dict(img_size=args.img_size, patch_size=args.patch_size, num_classes=args.classes)
    torch.manual_seed(0)
    models = {
        f"bvit_{args.width}": create_model(f"bvit_{args.width}", steps=args.steps, **shape),
        f"vit_{args.width}": create_model(f"vit_{args.width}", depth=args.steps, **shape),
        f"timm_vit_{args.width}": TimmViT(embed_dim=D, depth=args.steps, num_heads=heads, mlp_ratio=4.0,
                                          qkv_bias=True, **shape),
    }
    return {k: m.to(device) for k, m in models.items()}


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp, device: torch.device) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)

    def step():
        opt.zero_grad(set_to_none=True)
        with amp():
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()

    return step


def infer_step(model: nn.Module, x: torch.Tensor, amp) -> Callable[[], None]:
    def step():
        with torch.inference_mode(), amp():
            model(x)

    return step


def matmul_step(n: int, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return lambda: torch.mm(a, b)


# --------------------------------------------------------------------------------- measures
def median_ratio(a: List[float], b: List[float]) -> float:
    """Median over rounds of a[i] / b[i]."""
    return statistics.median(x / y for x, y in zip(a, b))


# --------------------------------------------------------------------------------- the run
@dataclass
class Bench:
    """What every measurement shares: settings, the three models, one input batch, the rows."""

    args: argparse.Namespace
    device: torch.device
    amp: Callable[[], Any]
    amp_on: bool
    batch: int
    rounds: int
    log: Callable[..., None]
    machine: str
    common: Dict[str, Any]
    models: Dict[str, nn.Module] = field(default_factory=dict)
    g: Optional[torch.Generator] = None
    x: Optional[torch.Tensor] = None
    y: Optional[torch.Tensor] = None
    rows: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def names(self) -> List[str]:
        """bViT, ViT, timm (the order of ``build_models``)."""
        return list(self.models)

    def add(self, section, name, metric, value, unit, **over) -> None:
        self.rows.append({**self.common, **over, "section": section, "name": name, "metric": metric,
                          "value": value, "unit": unit})


def setup(args) -> Bench:
    """Device, threads, clock, autocast, batch and rounds from ``args``; the models and the batch."""
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = args.clock
    if clock == "auto":  # one CPU thread: its CPU time is immune to other processes on a shared machine
        clock = "cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    machine = machine_name(device) + (f"-{args.tag}" if args.tag else "")
    amp_on = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if amp_on else nullcontext
    dtype_name = "bf16" if amp_on else "fp32"
    batch = args.batch or (8 if args.quick else 32) * (8 if device.type == "cuda" else 1)
    rounds = args.rounds or (3 if args.quick else 5)
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    D, _ = WIDTHS[args.width]
    common = dict(batch=batch, img_size=args.img_size, patch_size=args.patch_size, embed_dim=D, steps=args.steps,
                  dtype=dtype_name, threads=torch.get_num_threads(), clock=clock, torch=torch.__version__,
                  date=_dt.date.today().isoformat(), machine=machine)
    b = Bench(args, device, amp, amp_on, batch, rounds, log, machine, common)
    log(f"{machine}: torch {torch.__version__}, {torch.get_num_threads()} threads, {clock} clock, {dtype_name}, batch {batch}, "
        f"{args.img_size}px / patch {args.patch_size}, width {args.width}, steps {args.steps}")
    b.models = build_models(args, device)
    b.g = torch.Generator().manual_seed(0)
    b.x = torch.randn(batch, 3, args.img_size, args.img_size, generator=b.g).to(device)
    b.y = torch.randint(0, args.classes, (batch,), generator=b.g).to(device)
    return b


def counted_flops(b: Bench) -> Dict[str, Dict[str, Any]]:
    """Counted FLOPs per image (forward, training step) of every model."""
    flops = {}
    for name, m in b.models.items():
        f = measure_flops(m, (3, b.args.img_size, b.args.img_size), batch=1)
        flops[name] = f
        b.add("flops", name, "flops_forward_per_image", f["flops_forward"], "FLOP")
        b.add("flops", name, "flops_train_per_image", f["flops_train"], "FLOP")
    return flops


def timed_steps(b: Bench) -> Tuple[Dict[str, List[float]], int, torch.dtype]:
    """Seconds per call, interleaved, of every training step (+ bViT checkpointed, + compiled with
    ``--compile``), every inference pass and the peak-measuring matmul: (times, matmul n, its dtype)."""
    args, device, models = b.args, b.device, b.models
    bvit_name = b.names[0]
    contenders: Dict[str, Callable[[], None]] = {}
    ckpt_name = f"{bvit_name}+ckpt"
    train_models = {n: copy.deepcopy(m) for n, m in models.items()}
    train_models[ckpt_name] = set_activation_checkpointing(copy.deepcopy(models[bvit_name]))
    if args.compile:
        for n in list(train_models):
            if n == ckpt_name:
                continue
            c = copy.deepcopy(models[n])
            compile_blocks(c)
            train_models[f"{n}+compile"] = c
    for n, m in train_models.items():
        m.train()
        contenders[f"train:{n}"] = train_step(m, b.x, b.y, b.amp, device)
    infer_models = {n: copy.deepcopy(m).eval() for n, m in models.items()}
    if args.compile:
        for n in list(infer_models):
            infer_models[f"{n}+compile"] = compile_blocks(copy.deepcopy(models[n]).eval())
    for n, m in infer_models.items():
        contenders[f"infer:{n}"] = infer_step(m, b.x, b.amp)
    mm_n = args.matmul_n or (4096 if device.type == "cuda" else (1024 if args.quick else 2048))
    mm_dtype = torch.bfloat16 if b.amp_on else torch.float32
    contenders["matmul"] = matmul_step(mm_n, mm_dtype, device)
    iters = {k: (1 if args.quick else 2) * (1 if k.startswith("train") else 2) for k in contenders}
    iters["matmul"] = 10 if device.type == "cpu" else 50
    if device.type == "cuda":
        iters = {k: v * 10 for k, v in iters.items()}
    b.log(f"throughput: {b.rounds} interleaved rounds")
    return interleaved_rounds(contenders, b.rounds, iters, device, b.log, clock=CLOCKS[b.common["clock"]]), mm_n, mm_dtype


def throughput(b: Bench, times: Dict[str, List[float]], flops: Dict[str, Dict[str, Any]], mm_n: int,
               mm_dtype: torch.dtype) -> Tuple[List[float], Dict[str, Any]]:
    """The matmul peak; images per second of every contender and, for training, its achieved
    FLOP/s and their fraction of the peak (per round). Returns (peak per round, summary)."""
    peak = [2 * mm_n ** 3 / t for t in times["matmul"]]
    b.add("peak", "matmul", "matmul_flops_per_s", statistics.median(peak), "FLOP/s", batch=mm_n,
          dtype=str(mm_dtype).split(".")[-1])
    for key, ts in times.items():
        if key == "matmul":
            continue
        kind, name = key.split(":", 1)
        img_s = [b.batch / t for t in ts]
        b.add(kind, name, "img_per_s", statistics.median(img_s), "img/s")
        if kind == "train":
            base = name.split("+")[0]
            achieved = [flops[base]["flops_train"] * v for v in img_s]
            b.add(kind, name, "achieved_flops_per_s", statistics.median(achieved), "FLOP/s")
            b.add(kind, name, "fraction_of_matmul_peak", statistics.median(a / p for a, p in zip(achieved, peak)), "")
    return peak, {"matmul_peak_flops_per_s": statistics.median(peak)}


def speed_vs_timm(b: Bench, times: Dict[str, List[float]]) -> Dict[str, Any]:
    """Training and inference speed of our ViT and bViT relative to timm's (median per-round ratio)."""
    bvit_name, vit_name, timm_name = b.names
    summary: Dict[str, Any] = {}
    for kind in ("train", "infer"):
        for name in (vit_name, bvit_name):
            r = median_ratio(times[f"{kind}:{timm_name}"], times[f"{kind}:{name}"])  # speed ratio = inverse time ratio
            b.add(kind, name, f"speed_vs_{timm_name}", r, "x")
            summary[f"{kind}_speed_{name}_vs_timm"] = r
    summary["train_speed_bvit_vs_timm"] = summary[f"train_speed_{bvit_name}_vs_timm"]
    return summary


def checkpointing_time_cost(b: Bench, times: Dict[str, List[float]]) -> Dict[str, Any]:
    """Training time of bViT with activation checkpointing relative to without."""
    bvit_name = b.names[0]
    ckpt_name = f"{bvit_name}+ckpt"
    cost = median_ratio(times[f"train:{ckpt_name}"], times[f"train:{bvit_name}"])
    b.add("train", ckpt_name, f"time_vs_{bvit_name}", cost, "x")
    return {"checkpointing_time_cost": cost}


def flops_fraction(b: Bench, times: Dict[str, List[float]], flops: Dict[str, Dict[str, Any]],
                   peak: List[float]) -> Dict[str, Any]:
    """Achieved training FLOP/s of bViT (and timm) as a fraction of the matmul peak, median over rounds."""
    bvit_name, _, timm_name = b.names
    fr = [flops[bvit_name]["flops_train"] * b.batch / t / p for t, p in zip(times[f"train:{bvit_name}"], peak)]
    return {"train_flops_fraction_of_matmul_peak": statistics.median(fr),
            "train_flops_fraction_of_matmul_peak_timm": statistics.median(
                flops[timm_name]["flops_train"] * b.batch / t / p for t, p in zip(times[f"train:{timm_name}"], peak))}


def compile_speedups(b: Bench, times: Dict[str, List[float]]) -> Dict[str, Any]:
    """With ``--compile``: compiled bViT against timm and against eager bViT."""
    bvit_name, _, timm_name = b.names
    summary: Dict[str, Any] = {}
    if b.args.compile:
        for kind in ("train", "infer"):
            key = f"{kind}:{bvit_name}+compile"
            summary[f"{kind}_speed_{bvit_name}_compile_vs_timm"] = median_ratio(times[f"{kind}:{timm_name}"], times[key])
            summary[f"{kind}_speed_{bvit_name}_compile_vs_eager"] = median_ratio(times[f"{kind}:{bvit_name}"], times[key])
    return summary


def checkpointing_memory(b: Bench) -> Dict[str, Any]:
    """Peak training memory of bViT against steps, with and without activation checkpointing."""
    args, device = b.args, b.device
    bvit_name = b.names[0]
    mem_batch = args.mem_batch or b.batch
    b.log(f"memory: bViT training step at T = {', '.join(map(str, MEMORY_STEPS))}, batch {mem_batch}")
    # recurvit.analysis.memory.peak_train_memory: the figure `recurvit flops` and accounting report too
    method = "cuda_max_allocated" if device.type == "cuda" else "saved_activations"
    mem = {}
    for T in MEMORY_STEPS:
        for ckpt in (False, True):
            torch.manual_seed(0)
            m = create_model(f"bvit_{args.width}", steps=T, img_size=args.img_size, patch_size=args.patch_size,
                             num_classes=args.classes).to(device)
            set_activation_checkpointing(m, ckpt)
            with b.amp():
                mem[T, ckpt] = peak_train_memory(m, mem_batch, (3, args.img_size, args.img_size), device)
            b.add("memory", bvit_name + ("+ckpt" if ckpt else ""), f"peak_train_bytes_{method}", mem[T, ckpt], "B",
                  steps=T, batch=mem_batch)
            del m
        b.add("memory", bvit_name, "checkpointing_memory_ratio", mem[T, True] / mem[T, False], "", steps=T,
              batch=mem_batch)
        b.log(f"  T={T:>2}: {mem[T, False] / 2**20:8.1f} MiB, checkpointed {mem[T, True] / 2**20:7.1f} MiB "
              f"({mem[T, True] / mem[T, False]:.2f})")
    return {"memory_ratio_checkpointing_T48": mem[48, True] / mem[48, False],
            "memory_growth_per_step_plain": (mem[48, False] - mem[6, False]) / 42,
            "memory_growth_per_step_checkpointed": (mem[48, True] - mem[6, True]) / 42}


def forward_steps_speedup(b: Bench) -> Dict[str, Any]:
    """``forward_steps(K=48)`` (every step's logits in one pass) against 48 separate passes and one K=48 pass."""
    device, amp, x = b.device, b.amp, b.x
    bvit_name = b.names[0]
    quick = b.args.quick
    fs_batch = b.args.fs_batch or ((2 if quick else 8) * (16 if device.type == "cuda" else 1))
    b.log(f"horizon: forward_steps(K={HORIZON}) vs {HORIZON} separate passes, batch {fs_batch}")
    model = copy.deepcopy(b.models[bvit_name]).eval()
    xs = x[:fs_batch] if fs_batch <= b.batch else torch.randn(fs_batch, *x.shape[1:], generator=b.g).to(device)

    def one_pass():
        with torch.inference_mode(), amp():
            model.forward_steps(xs, steps=HORIZON)

    def separate():
        with torch.inference_mode(), amp():
            for k in range(1, HORIZON + 1):
                model(xs, steps=k)

    def single_deep():
        with torch.inference_mode(), amp():
            model(xs, steps=HORIZON)

    with torch.inference_mode():  # the readouts agree
        ref = torch.stack([model(xs, steps=k) for k in (1, HORIZON // 2, HORIZON)])
        got = model.forward_steps(xs, steps=HORIZON)[[0, HORIZON // 2 - 1, HORIZON - 1]]
        assert torch.allclose(ref.float(), got.float(), rtol=1e-3, atol=1e-3)
    ht = interleaved_rounds({"forward_steps": one_pass, "separate": separate, "single_pass_K48": single_deep},
                     2 if quick else 3, {"forward_steps": 1, "separate": 1, "single_pass_K48": 1}, device, b.log,
                     warmup=1, clock=CLOCKS[b.common["clock"]])
    summary = {"forward_steps_speedup_K48": median_ratio(ht["separate"], ht["forward_steps"]),
               "forward_steps_overhead_vs_one_pass_K48": median_ratio(ht["forward_steps"], ht["single_pass_K48"])}
    for k, v in ht.items():
        b.add("horizon", bvit_name, f"seconds_{k}", statistics.median(v), "s", batch=fs_batch, steps=HORIZON)
    b.add("horizon", bvit_name, "forward_steps_speedup", summary["forward_steps_speedup_K48"], "x", batch=fs_batch,
          steps=HORIZON)
    b.add("horizon", bvit_name, "forward_steps_overhead_vs_one_pass", summary["forward_steps_overhead_vs_one_pass_K48"],
          "x", batch=fs_batch, steps=HORIZON)
    return summary


def check_targets(b: Bench, summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every figure of ``TARGETS`` against its goal."""
    verdict = {}
    for key, (op, bound) in TARGETS.items():
        v = summary[key]
        verdict[key] = {"value": v, "target": f"{op} {bound}", "met": v >= bound if op == ">=" else v <= bound}
        b.add("target", key, key, v, "", batch="", steps="")
    return verdict


def run(args) -> Dict[str, Any]:
    """Every measurement in turn (the order of the results file); rows, summary and settings."""
    b = setup(args)
    flops = counted_flops(b)
    times, mm_n, mm_dtype = timed_steps(b)
    peak, rates = throughput(b, times, flops, mm_n, mm_dtype)
    summary: Dict[str, Any] = {"machine": b.machine, **rates}
    summary.update(speed_vs_timm(b, times))
    summary.update(checkpointing_time_cost(b, times))
    summary.update(flops_fraction(b, times, flops, peak))
    summary.update(compile_speedups(b, times))
    summary.update(checkpointing_memory(b))
    summary.update(forward_steps_speedup(b))
    summary["targets"] = check_targets(b, summary)
    return {"rows": b.rows, "summary": summary, "settings": {k: v for k, v in vars(args).items()}}


def write_csv(rows: List[Dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in FIELDS})
    os.replace(tmp, path)


def markdown(path: Path) -> str:
    """The README table of a results CSV (generated, never typed by hand)."""
    rows = list(csv.DictReader(open(path)))
    get = {(r["section"], r["name"], r["metric"], r["steps"]): r for r in rows}
    first = rows[0]
    lines = [f"Machine `{first['machine']}`, torch {first['torch']}, {first['threads']} threads ({first['clock']} time), {first['dtype']}, "
             f"{first['img_size']}px / patch {first['patch_size']}, width {first['embed_dim']}, "
             f"steps {first['steps']}, batch {first['batch']} ({first['date']}; `benchmarks/throughput.py`).", "",
             "| model | train img/s | infer img/s | train speed vs timm | train FLOP/s / matmul peak |",
             "|---|---:|---:|---:|---:|"]
    names = [r["name"] for r in rows if r["section"] == "train" and r["metric"] == "img_per_s"]
    for n in names:
        tr = get.get(("train", n, "img_per_s", first["steps"]))
        inf = get.get(("infer", n, "img_per_s", first["steps"]))
        vs = next((r for r in rows if r["section"] == "train" and r["name"] == n and r["metric"].startswith("speed_vs_")), None)
        fr = get.get(("train", n, "fraction_of_matmul_peak", first["steps"]))
        cells = [n, f"{float(tr['value']):.0f}", f"{float(inf['value']):.0f}" if inf else "-",
                 f"{float(vs['value']):.2f}x" if vs else "-", f"{float(fr['value']):.0%}" if fr else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    def value(section, metric, name=None):
        r = next((r for r in rows if r["section"] == section and r["metric"] == metric
                  and (name is None or r["name"] == name)), None)
        return None if r is None else (float(r["value"]), r)

    notes = []
    peak = value("peak", "matmul_flops_per_s")
    if peak:
        notes.append(f"dense-matmul peak {peak[0] / 1e9:.0f} GFLOP/s ({peak[1]['batch']}x{peak[1]['batch']} {peak[1]['dtype']} matmul)")
    ck = next((r for r in rows if r["section"] == "train" and r["metric"].startswith("time_vs_")), None)
    if ck:
        notes.append(f"activation checkpointing costs {float(ck['value']) - 1:+.0%} training time "
                     "(its FLOP/s count useful FLOPs only)")
    fs, sep = value("horizon", "seconds_forward_steps"), value("horizon", "seconds_separate")
    speedup = value("horizon", "forward_steps_speedup")
    if fs and sep and speedup:  # the speedup is the median of per-round ratios (the target's figure), not of medians
        notes.append(f"`forward_steps(K=48)` {fs[0] * 1e3:.0f} ms vs 48 separate passes {sep[0] * 1e3:.0f} ms "
                     f"(medians over rounds; {speedup[0]:.1f}x faster, the median of per-round ratios, "
                     f"batch {fs[1]['batch']})")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", "| steps T | peak train memory | with activation checkpointing | ratio |", "|---:|---:|---:|---:|"]
    mem = [r for r in rows if r["section"] == "memory"]
    for T in sorted({int(r["steps"]) for r in mem}):
        plain = next(float(r["value"]) for r in mem if int(r["steps"]) == T and r["metric"].startswith("peak") and "+ckpt" not in r["name"])
        ck = next(float(r["value"]) for r in mem if int(r["steps"]) == T and r["metric"].startswith("peak") and "+ckpt" in r["name"])
        lines.append(f"| {T} | {plain / 2**20:.1f} MiB | {ck / 2**20:.1f} MiB | {ck / plain:.2f} |")
    lines += ["", "| target (issue 6) | measured | goal | met |", "|---|---:|---:|:---:|"]
    for r in rows:
        if r["section"] == "target":
            op, bound = TARGETS[r["name"]]
            v = float(r["value"])
            met = v >= bound if op == ">=" else v <= bound
            lines.append(f"| {r['name']} | {v:.3g} | {op} {bound:g} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print rows and summary as JSON (progress goes to stderr)")
    p.add_argument("--quick", action="store_true", help="smaller batches and fewer rounds (a few minutes on 2 CPU cores)")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--width", choices=sorted(WIDTHS), default="tiny")
    p.add_argument("--steps", type=int, default=12, help="bViT steps = ViT depth")
    p.add_argument("--batch", type=int, help="training / inference batch (default: 32 CPU, 256 CUDA; --quick: 8, 64)")
    p.add_argument("--mem-batch", type=int, help="batch of the memory measurement (default: --batch)")
    p.add_argument("--fs-batch", type=int, help="batch of the forward_steps comparison")
    p.add_argument("--rounds", type=int, help="interleaved timing rounds (default 5, --quick 3)")
    p.add_argument("--matmul-n", type=int, help="side of the square matmul that measures the peak")
    p.add_argument("--amp", choices=["auto", "bf16", "off"], default="auto", help="bf16 autocast (auto: on CUDA only)")
    p.add_argument("--compile", action="store_true", help="also time models with compiled blocks (torch.compile)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("--clock", choices=["auto", "wall", "cpu"], default="auto",
                   help="timer: wall time, or process CPU time (auto: cpu for a 1-thread CPU run, which other "
                        "processes on a shared machine do not distort; wall otherwise)")
    p.add_argument("--device", default="auto")
    p.add_argument("--tag", default="", help="suffix of the results file name")
    p.add_argument("--out", type=Path, default=ROOT / "results", help="results directory")
    p.add_argument("--report", type=Path, metavar="CSV", help="print the markdown table of a results file and exit")
    args = p.parse_args(argv)
    if args.report:
        print(markdown(args.report))
        return 0
    t0 = time.perf_counter()
    result = run(args)
    path = args.out / f"{result['summary']['machine']}.csv"
    write_csv(result["rows"], path)
    command = "python benchmarks/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path.with_suffix(".md").write_text(f"# Benchmarks: {result['summary']['machine']}\n\n{markdown(path)}\n\n"
                                       f"Command: `{command.strip()}`\n")
    result["summary"]["csv"] = str(path)
    result["summary"]["seconds"] = time.perf_counter() - t0
    if args.json:
        json.dump(result, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    s = result["summary"]
    print(f"\nwrote {path} ({s['seconds']:.0f} s)")
    for k, v in s.items():
        if k not in ("targets", "machine", "csv", "seconds"):
            print(f"  {k:48s} {v:.4g}" if isinstance(v, float) else f"  {k:48s} {v}")
    print("targets (issue 6):")
    for k, v in s["targets"].items():
        print(f"  {k:40s} {v['value']:8.3g}  goal {v['target']:8s} {'met' if v['met'] else 'NOT met'}")
    print()
    print(markdown(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

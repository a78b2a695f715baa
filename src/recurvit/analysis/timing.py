"""Timing peers side by side in one process, so that a speed is a ratio measured under the same load
(this machine's timings are noisy; benchmarks/ and ``recurvit exit`` time this way).

- :func:`interleaved_rounds`: seconds per call of each contender, round by round, the order rotated
  every round (benchmarks: training steps, inference passes, the matmul peak).
- :func:`interleaved_batches`: images/s of each function over the same batches, alternating them
  batch by batch (anytime exit against fixed depth).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], iters: int, device: torch.device,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    sync(device)
    t0 = clock()
    for _ in range(iters):
        fn()
    sync(device)
    return (clock() - t0) / iters


def interleaved_rounds(contenders: Dict[str, Callable[[], None]], rounds: int, iters: Dict[str, int],
                       device: torch.device, log: Optional[Callable[[str], None]] = None, warmup: int = 2,
                       clock: Callable[[], float] = time.perf_counter) -> Dict[str, List[float]]:
    """Seconds per call of every contender, round by round (order rotated per round), after ``warmup``
    calls each (allocator, kernels, compilation)."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(seconds_per_call(contenders[name], iters[name], device, clock))
        if log is not None:
            log(f"  round {r + 1}/{rounds}: " + "  ".join(f"{n} {times[n][-1] * 1e3:.0f}ms" for n in names))
    return times


def interleaved_batches(fns: Dict[str, Callable], batches: Sequence[torch.Tensor], device: torch.device,
                        repeats: int = 1) -> Dict[str, float]:
    """Images/s of each function over the same batches, alternating them batch by batch (the order
    flips every batch) after one warm-up call each; from the median per-image time."""
    names = list(fns)
    for name in names:
        fns[name](batches[0])
    per_image: Dict[str, List[float]] = {n: [] for n in names}
    i = 0
    for _ in range(repeats):
        for x in batches:
            for name in (names if i % 2 == 0 else names[::-1]):
                sync(device)
                t0 = time.perf_counter()
                fns[name](x)
                sync(device)
                per_image[name].append((time.perf_counter() - t0) / len(x))
            i += 1
    return {n: 1.0 / statistics.median(v) for n, v in per_image.items()}

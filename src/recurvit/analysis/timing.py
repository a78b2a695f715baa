"""Timing peers side by side in one process, so that a speed is a ratio measured under the same load
(this machine's timings are noisy; benchmarks/ and ``recurvit exit`` time this way).

- :func:`interleaved_rounds`: seconds per call of each contender, round by round, the order rotated
  every round (benchmarks: training steps, inference passes, the matmul peak).
- :func:`interleaved_batches`: images/s of each function over the same batches, alternating them
  batch by batch (anytime exit against fixed depth).
- :func:`geometric_ratio`: the geometric mean of paired per-round (or per-batch) time ratios with its 95%
  t-interval, the form every speed-up a claim decides on takes.
- :class:`LoadWatch`: the machine's 1-minute load average before a timing and the highest reading during it,
  and the cores it is read against (:mod:`recurvit.study.speed` decides nothing from a loaded machine).
"""
from __future__ import annotations

import math
import os
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


def geometric_ratio(num: Sequence[float], den: Sequence[float]) -> Dict[str, float]:
    """The geometric mean of the paired ratios num / den (e.g. seconds of the slower peer over the faster one,
    round by round) and its 95% t-interval on the log scale (nan with one pair)."""
    from scipy import stats

    logs = [math.log(a / b) for a, b in zip(num, den)]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return {"mean": math.exp(m), "lo": math.nan, "hi": math.nan, "rounds": len(logs)}
    half = float(stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)))
    return {"mean": math.exp(m), "lo": math.exp(m - half), "hi": math.exp(m + half), "rounds": len(logs)}


def load_average() -> Optional[float]:
    """The machine's 1-minute load average (``os.getloadavg()[0]``); None where the system keeps none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where the system has none): at
    most the machine's, so a load average read per core is never spread over cores the timing cannot use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LoadWatch:
    """The 1-minute load average around a timing, as :mod:`recurvit.study.speed` reads it::

        with LoadWatch() as load:
            interleaved_rounds(..., log=load.sample)   # a reading after every round
        load.before, load.during, load.cores

    ``before``: the reading on entering (just before the timing); ``during``: the HIGHEST of the readings
    taken by :meth:`sample` (after each round) and on leaving, so a load that rose at any point of the timing
    shows, and the average's lag (it trails the runnable threads by about a minute) only delays it, never
    hides it from the last reading. Both include the timing's own threads (the reader subtracts them). None
    where the system keeps no load average."""

    def __init__(self) -> None:
        self.before: Optional[float] = None
        self.readings: List[float] = []
        self.cores = cores()

    def __enter__(self) -> "LoadWatch":
        self.before = load_average()
        return self

    def sample(self, *_ignored: Any) -> None:
        """Take a reading (any arguments, e.g. a round's log line, are ignored)."""
        v = load_average()
        if v is not None:
            self.readings.append(v)

    def __exit__(self, *exc: Any) -> None:
        self.sample()

    @property
    def during(self) -> Optional[float]:
        return max(self.readings) if self.readings else None

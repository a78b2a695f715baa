"""Training-batch loading time of an in-memory data set: our table-lookup transform against torchvision's.

    python benchmarks/data_pipeline.py [--data fashion_mnist] [--batches 40] [--rounds 5]

Both contenders load the same training batches (batch 128, one process, one thread) through the same
``DataLoader`` from the same ``TensorImageDataset``; only the per-item transform differs:
torchvision's ``v2.Compose([RandomCrop(pad), RandomHorizontalFlip(), ToDtype, Normalize])`` (the peer)
and ``PadCropFlipNormalize``, which returns the same tensors bit for bit (``tests/data/test_transforms.py``).
Timing is interleaved (each round times both, order alternating) on the process's CPU time, and the
figure is the median per-round ratio. Writes ``benchmarks/results/data-<machine>.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2


def seconds_per_batch(dataset, batches: int, batch_size: int) -> float:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    start = time.process_time()
    for i, _ in enumerate(loader):
        if i + 1 == batches:
            break
    return (time.process_time() - start) / batches


def main(argv=None) -> int:
    from recurvit.config import DataConfig
    from recurvit.data import build_datasets
    from recurvit.data.transforms import PadCropFlipNormalize

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="fashion_mnist", help="an in-memory data set (digits, fashion_mnist, ...)")
    p.add_argument("--batches", type=int, default=40, help="batches timed per contender per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the figure is their median ratio)")
    p.add_argument("--batch-size", type=int, default=128, help="images per batch")
    p.add_argument("--out", type=Path, help="the markdown table (default benchmarks/results/data-<machine>.md)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ours, _, _ = build_datasets(DataConfig(name=args.data))
    if not isinstance(ours.transform, PadCropFlipNormalize):
        raise SystemExit(f"{args.data}: its training transform is not the table lookup (resized or RandAugment)")
    peer = type(ours)(ours.images, ours.labels, transform=v2.Compose(ours.transform.transforms))
    times = {"torchvision": [], "ours": []}
    for r in range(args.rounds):
        for name in (("torchvision", "ours") if r % 2 == 0 else ("ours", "torchvision")):
            times[name].append(seconds_per_batch(peer if name == "torchvision" else ours, args.batches,
                                                 args.batch_size))
    ratio = statistics.median(t / o for t, o in zip(times["torchvision"], times["ours"]))
    machine = f"cpu-{os.cpu_count()}c"
    lines = [f"Machine `{machine}`, torch {torch.__version__}, 1 thread (CPU time), {args.data}, batch "
             f"{args.batch_size}, {args.rounds} interleaved rounds of {args.batches} batches "
             f"(`python benchmarks/data_pipeline.py`).", "",
             "| transform | ms per batch (median) |", "|---|---:|"]
    lines += [f"| {name} | {1000 * statistics.median(t):.1f} |" for name, t in times.items()]
    lines += ["", f"Table lookup vs torchvision: **{ratio:.1f}x** faster per batch (median of per-round ratios)."]
    out = args.out or Path(__file__).parent / "results" / f"data-{machine}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Transfer study (issue 8): pretrain a small bViT on Fashion-MNIST and on digits (resized to 28x28),
fine-tune each on the other with every method, against the same model trained from scratch on the
target with the same budget; then look inside the Fashion-MNIST bViT and its ViT partner.

    python experiments/transfer.py                 # everything (skips steps whose outputs exist)
    python experiments/transfer.py --skip-analysis # transfer table only

Runs go to runs/transfer/ (git-ignored: checkpoints), results to results/transfer/:
transfer.csv, transfer.md (the table, generated from the runs' finetune.json files), and
analysis/{bvit,vit}/ (``recurvit analyze`` outputs). Every step is a ``recurvit`` command, printed
before it runs; each runs with one CPU thread at niceness 10 (the machine is shared).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = Path("runs/transfer")  # relative to ROOT (the script works from there)
RESULTS = Path("results/transfer")
RECIPE = "configs/fashion_mnist/crossroads/naive.yaml"  # bViT: D=64, 2 heads, 6 steps, patch 7
CLI = [sys.executable, "-m", "recurvit"]

# pretraining: the same model on each source (digits 8x8 -> 28x28 so the input matches Fashion-MNIST)
PRETRAIN = {
    "fashion_mnist": [RECIPE, "train.epochs=3"],
    "digits": [RECIPE, "data.name=digits", "data.img_size=28", "train.epochs=30", "train.batch_size=64",
               "train.lr=1e-3", "train.warmup_epochs=2"],
}
# fine-tuning budget on each TARGET (the same for every method, scratch included). The Fashion-MNIST
# target is a low-data transfer: the first FASHION_SUBSET training images (IDX copies written by
# this script), the full 10k test set.
FASHION_SUBSET = 10_000
SUBSET_ROOT = RUNS / f"fashion_mnist_{FASHION_SUBSET // 1000}k"
BUDGET = {
    "digits": ["train.epochs=10", "train.batch_size=64", "train.warmup_epochs=1"],
    "fashion_mnist": [f"data.root={SUBSET_ROOT}", "train.epochs=3", "train.batch_size=128",
                      "train.warmup_epochs=0.3", "train.eval_every=3"],
}
# (label, method, rank, lr); lora r=6 and step_lora r=1 have exactly the same trainable parameters
METHODS = [
    ("scratch", "scratch", None, None),  # None: the target's own pretraining lr
    ("full", "full", None, 5e-4),
    ("head", "head", None, 5e-3),
    ("lora r=4", "lora", 4, 3e-3),
    ("step_lora r=4", "step_lora", 4, 3e-3),
    ("lora r=6", "lora", 6, 3e-3),
    ("step_lora r=1", "step_lora", 1, 3e-3),
]
SCRATCH_LR = {"digits": 1e-3, "fashion_mnist": 1.5e-3}


def sh(args, log, needed: bool = True):
    """Record the command in commands.txt; run it (at niceness 10, one thread) unless its output exists."""
    cmd = CLI + [str(a) for a in args]
    shown = "recurvit " + " ".join(str(a) for a in args)
    log.write(shown + "\n")
    if not needed:
        return
    print(f"$ {shown}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    t0 = time.time()
    bump = max(0, 10 - os.nice(0))  # run at niceness 10 (not 10 more than an already niced parent)
    subprocess.run(["nice", "-n", str(bump)] + cmd, cwd=ROOT, env=env, check=True)
    print(f"  ({time.time() - t0:.0f}s)", flush=True)


def done(run: Path, name: str = "best.pt") -> bool:
    return (run / name).is_file() and (run / "metrics.jsonl").is_file()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-analysis", action="store_true")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    RUNS.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    log = open(RESULTS / "commands.txt", "w")
    log.write("# every command `python experiments/transfer.py` runs (it skips those whose outputs exist), in order\n")

    pre = {}
    for src, extra in PRETRAIN.items():
        run = RUNS / f"pretrain-{src}"
        needed = not done(run, "last.pt") or _epochs(run) < _want_epochs(extra)
        if needed and run.exists():
            if not done(run, "last.pt"):
                raise SystemExit(f"{run} exists but is incomplete; remove it and rerun")
            sh(["train", "--resume", run, "train.progress=false"], log)  # an interrupted pretraining
            needed = False
        sh(["train", *extra, "train.progress=false", "--out", run], log, needed)
        pre[src] = run

    write_fashion_subset(SUBSET_ROOT, FASHION_SUBSET)
    rows = []
    for src, tgt in (("fashion_mnist", "digits"), ("digits", "fashion_mnist")):
        for label, method, rank, lr in METHODS:
            run = RUNS / f"{src}-to-{tgt}-{label.replace(' ', '').replace('=', '')}"
            lr = lr if lr is not None else SCRATCH_LR[tgt]
            recipe = run / "finetune.json"  # the recipe from the start; test_acc once the fine-tune is done
            needed = not (recipe.is_file() and "test_acc" in json.loads(recipe.read_text()))
            cmd = ["finetune", pre[src], "--data", tgt, "--method", method, *BUDGET[tgt], f"train.lr={lr}",
                   "train.progress=false", "--out", run]
            if rank is not None:
                cmd += ["--rank", rank]
            if needed and run.exists():  # a killed fine-tune goes on from its last.pt
                cmd = ["finetune", "--resume", run]
            sh(cmd, log, needed)
            r = json.loads((run / "finetune.json").read_text())
            rows.append({"source": src, "target": tgt, "method": label, "trainable_params": r["trainable_params"],
                         "total_params": r["total_params"], "lr": r["lr"], "epochs": r["epochs"],
                         "test_acc": r["test_acc"], "best_acc": r["best_acc"],
                         "train_cpu_seconds": round(r["train_cpu_seconds"], 1),
                         "train_wall_seconds": round(r["train_seconds"], 1)})
    write_table(rows, pre)

    if not args.skip_analysis:
        vit = RUNS / "vit-fashion_mnist"  # the stack partner: 6 independent blocks, the same recipe
        sh(["train", *PRETRAIN["fashion_mnist"], "model.name=vit_tiny", "model.depth=6", "model.steps=null",
            "train.progress=false", "--out", vit], log, not done(vit))
        for name, run in (("bvit", pre["fashion_mnist"]), ("vit", vit)):
            out = RESULTS / "analysis" / name
            sh(["analyze", run, "--images", "1000", "--out", out], log, not (out / "summary.json").is_file())
        md = RESULTS / "transfer.md"
        md.write_text(md.read_text().rstrip("\n") + "\n\n" + "\n".join(analysis_section()))
    log.close()
    print(f"total {time.time() - t_start:.0f}s wall")
    return 0


def write_fashion_subset(root: Path, n: int) -> None:
    """The first n Fashion-MNIST training images and labels (+ the whole test set) as IDX files."""
    from recurvit.data.datasets import (FASHION_FILES, FASHION_MNIST_ROOT, IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC,
                                        _find_idx, read_idx)

    if all((root / name).is_file() for name in FASHION_FILES.values()):
        return
    root.mkdir(parents=True, exist_ok=True)
    for key, name in FASHION_FILES.items():
        magic = IDX_IMAGES_MAGIC if key.endswith("images") else IDX_LABELS_MAGIC
        arr = read_idx(_find_idx(Path(FASHION_MNIST_ROOT), name), magic)
        if key.startswith("train"):
            arr = arr[:n]
        header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
        (root / name).write_bytes(header + arr.tobytes())


def _want_epochs(extra) -> int:
    for a in extra:
        if a.startswith("train.epochs="):
            return int(a.split("=")[1])
    return 0


def _epochs(run: Path) -> int:
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
    return json.loads(lines[-1])["epoch"] if lines else 0


def write_table(rows, pre) -> None:
    keys = list(rows[0])
    with open(RESULTS / "transfer.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    lines = ["# Transfer: Fashion-MNIST <-> digits (28x28), bViT D=64, 2 heads, 1 shared block x 6 steps", "",
             "Generated by `python experiments/transfer.py` from the runs' `finetune.json` files "
             "(raw numbers: `transfer.csv`; commands: `commands.txt`).", ""]
    for src, run in pre.items():
        m = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        lines.append(f"- pretrained on {src}: test accuracy {m.get('test_acc', float('nan')):.4f} "
                     f"after {m['epoch']} epochs ({m['train_seconds']:.0f} s wall)")
    lines += ["", "Every row on a target has the same budget (epochs, batch size, schedule); `scratch` is the same "
              "model re-initialised and trained fully on the target. Seconds are the CPU time of the training epochs "
              "(one thread; the 2-core machine was shared with other jobs, so wall time, in `transfer.csv`, is "
              "not comparable between rows). One seed each: the binomial standard error of an accuracy near 0.7 is about "
              "2.4 points on the 360 digits test images and 0.5 points on the 10,000 Fashion-MNIST ones.", ""]
    sizes = {"digits": "digits resized to 28x28: 1,437 train / 360 test",
             "fashion_mnist": f"Fashion-MNIST, first {FASHION_SUBSET:,} train images / 10,000 test"}
    for src, tgt in (("fashion_mnist", "digits"), ("digits", "fashion_mnist")):
        sub = [r for r in rows if r["source"] == src and r["target"] == tgt]
        if not sub:
            continue
        lines += [f"## {src} -> {tgt} ({sizes[tgt]}; {sub[0]['epochs']} epochs)", "",
                  "| method | trainable params | % of params | lr | test accuracy | CPU seconds |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in sub:
            lines.append(f"| {r['method']} | {r['trainable_params']:,} | "
                         f"{100 * r['trainable_params'] / r['total_params']:.1f} | {r['lr']:g} | "
                         f"{r['test_acc']:.4f} | {r['train_cpu_seconds']:.1f} |")
        lines.append("")
    (RESULTS / "transfer.md").write_text("\n".join(lines))
    print((RESULTS / "transfer.md").read_text())


def analysis_section():
    """Per-step figures of the Fashion-MNIST bViT and its ViT partner, from analysis/*/summary.json."""
    sums = {name: json.loads((RESULTS / "analysis" / name / "summary.json").read_text()) for name in ("bvit", "vit")}
    lines = ["## Inside the Fashion-MNIST models: bViT (1 shared block x 6 steps) vs ViT (6 blocks)", "",
             "`recurvit analyze RUN --images 1000` on each pretrained model (plots and CSVs in `analysis/bvit`, "
             "`analysis/vit`). Step k of the bViT is the k-th application of the shared block; layer k of the ViT "
             "is block k. CKA: linear CKA of the token states of step k and k-1 (step 0 = the embedding). Drops: "
             "accuracy points lost when ONE head / one half of the MLP hidden units is masked at that step only "
             "(mean over the 2 heads / 2 slices), or when the block is skipped there. Attention under uniform "
             f"weights: entropy {sums['bvit']['attn_entropy_uniform']:.2f} nats, distance "
             f"{sums['bvit']['attn_distance_uniform']:.2f} patches (4x4 patch grid).", ""]
    for name, s in sums.items():
        with open(RESULTS / "analysis" / name / "cka_tokens.csv") as f:
            emb_cka = float(list(csv.reader(f))[1][2])  # CKA(embedding, step 1)
        c = s["cka_tokens"]
        lines += [f"### {name} (test accuracy on the 1000 images {s['base_acc']:.3f}; CKA step 1 vs step 6 "
                  f"{c['first_last']:.2f}, mean over all step pairs {c['mean_offdiag']:.2f})",
                  "", "| step | readout acc | rel. update | CKA(k, k-1) | attn distance h0 / h1 | attn entropy | "
                      "head-mask drop | MLP-slice drop | skip drop |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for k in range(s["steps"]):
            cka_prev = emb_cka if k == 0 else s["cka_tokens"]["adjacent"][k - 1]
            d = s["attn_distance_by_head"][k]
            lines.append(f"| {k + 1} | {s['acc_per_step'][k]:.3f} | {s['rel_update'][k]:.3f} | {cka_prev:.3f} | "
                         f"{d[0]:.2f} / {d[1]:.2f} | {s['attn_entropy_per_step'][k]:.2f} | "
                         f"{100 * s['heads_mean_drop_per_step'][k]:.1f} | {100 * s['mlp_mean_drop_per_step'][k]:.1f} | "
                         f"{100 * s['skip_drop'][k]:.1f} |")
        lines.append("")
    lines += ["For the plain bViT, skipping step k leaves F^5(z_0) whatever k, so every skip drop equals the cost "
              "of running 5 steps instead of 6 (a check of the machinery, not a finding).", ""]
    return lines


if __name__ == "__main__":
    sys.exit(main())

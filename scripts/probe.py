"""The fault-and-bad-input probe: what a careless or unlucky user does to recurvit, and what it survives.

    python scripts/probe.py                  # -> results/probe/report.md and probe.json (about 10 minutes)
    python scripts/probe.py --kills 2        # fewer kill -9 trials per kind
    python scripts/probe.py --only bad --only payloads --out /tmp/probe   # parts of it, elsewhere

Three figures, each from the command line in subprocesses (one CPU thread each):
- kills: ``kill -9`` at a random moment of a training (train, finetune, vae train, a study's main
  process, one study worker, the ``train --nproc 2`` launcher) or of ``export --format hf``, then the documented way on
  (``--resume`` or the same study command); survived = the per-epoch metrics (timings aside)
  equal those of an uninterrupted run of the same command;
- malicious payloads: pickles whose unpickling runs code, in every checkpoint slot a command
  reads, and YAML tags that construct Python objects, in every YAML a command reads; executed =
  the payload's marker file exists afterwards;
- bad inputs: mistakes a user makes on the command line (issue 39's among them); clear = exit status 2
  with one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=128"]
TIMING = {"seconds", "img_per_s", "train_seconds", "train_cpu_seconds"}
VAE = [str(ROOT / "configs/vae/digits.yaml"), "model.embed_dim=8", "train.batch_size=128"]


def cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recurvit", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=ROOT)


def start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recurvit", *map(str, args)], env=ENV, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def epochs(run: Path) -> list:
    f = run / "metrics.jsonl"
    if not f.is_file():
        return []
    out = []
    for ln in f.read_text().splitlines():
        try:
            out.append({k: v for k, v in json.loads(ln).items() if k not in TIMING})
        except ValueError:
            out.append(None)  # a line torn by the kill (past the checkpoint: dropped on resume)
    return out


def kill_when(p: subprocess.Popen, ready, rng: random.Random, pid=None) -> None:
    """SIGKILL ``pid`` (default: p) once ``ready()`` and after a random part of a second."""
    deadline = time.time() + 600
    while time.time() < deadline and not ready() and p.poll() is None:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.6))
    try:
        os.kill(pid() if callable(pid) else (pid or p.pid), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
        pass
    p.wait()
    time.sleep(0.5)  # children that end with their parent


# ------------------------------------------------------------------------------------- kills
def kill_trials(tmp: Path, n: int, rng: random.Random) -> list:
    trials = []

    def trial(kind, start_args, resume_args, run, ref, lines, killed_pid=None):
        p = start(*start_args)
        k = rng.randint(1, lines)
        kill_when(p, lambda: len([e for e in epochs(run) if e]) >= k, rng, killed_pid)
        r = cli(*resume_args)
        ok = r.returncode == 0 and epochs(run) == epochs(ref)
        trials.append({"kind": kind, "killed_after_epochs": k, "survived": ok,
                       "note": "" if ok else (r.stderr.strip().splitlines() or ["metrics differ"])[-1][:200]})

    ref = tmp / "ref-train"
    base = ["train", *TINY, "train.epochs=6"]
    cli(*base, "--out", ref)
    for i in range(n):
        run = tmp / f"train-{i}"
        trial("train", [*base, "--out", run], ["train", "--resume", run], run, ref, 5)

    src = ref
    ft = ["finetune", src, "--data", "digits", "--method", "lora", "--rank", "2", "train.epochs=6",
          "train.batch_size=128"]
    cli(*ft, "--out", tmp / "ref-ft")
    for i in range(n):
        run = tmp / f"ft-{i}"
        trial("finetune", [*ft, "--out", run], ["finetune", "--resume", run], run, tmp / "ref-ft", 5)

    vae = ["vae", "train", *VAE, "train.epochs=6"]
    cli(*vae, "--out", tmp / "ref-vae")
    for i in range(n):
        run = tmp / f"vae-{i}"
        trial("vae train", [*vae, "--out", run], ["vae", "train", "--resume", run], run, tmp / "ref-vae", 5)

    ddp = ["train", *TINY, "train.epochs=4", "train.device=cpu", "--nproc", "2"]
    cli(*ddp, "--out", tmp / "ref-ddp")
    run = tmp / "ddp"
    trial("train --nproc 2 (launcher)", [*ddp, "--out", run], ["train", "--nproc", "2", "--resume", run],
          run, tmp / "ref-ddp", 3)

    study = tmp / "study.yaml"
    study.write_text(f"name: probe\nbase: {ROOT / 'configs/digits/bvit.yaml'}\n"
                     f"overrides: {{{', '.join(o.replace('=', ': ') for o in TINY)}, train.epochs: 4}}\n"
                     "grid:\n  train.seed: [0, 1]\neval:\n  max_steps_factor: 1\nruns: runs\nresults: results\n")
    cli("study", study, "--workers", "1", "--out", tmp / "ref-study")
    ref_runs = sorted(d.name for d in (tmp / "ref-study" / "runs").iterdir() if d.is_dir())
    for i, kind in enumerate(["study (main process)"] * max(1, n // 2) + ["study worker"]):
        out = tmp / f"study-{i}"
        runs = out / "runs"
        p = start("study", study, "--workers", "1", "--out", out)

        def worker():  # the process training the study's current run (its run directory's lock)
            locks = sorted(runs.glob("*/.lock"))
            return int(locks[0].read_text()) if locks and locks[0].read_text().strip() else p.pid

        def ready():
            return any(len(epochs(d)) >= 2 for d in runs.glob("*") if d.is_dir())

        kill_when(p, ready, rng, worker if kind == "study worker" else None)
        r = cli("study", study, "--workers", "1", "--out", out)
        ok = r.returncode == 0 and all(epochs(runs / name) == epochs(tmp / "ref-study" / "runs" / name)
                                       for name in ref_runs)
        trials.append({"kind": kind, "killed_after_epochs": 2, "survived": ok,
                       "note": "" if ok else (r.stderr.strip().splitlines() or ["metrics differ"])[-1][:200]})
    return trials


# ---------------------------------------------------------------------------------- payloads
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def payload_trials(tmp: Path, runs: dict) -> list:
    """``runs``: a trained run of each kind ("classify", "finetune", "vae"); each payload goes into a copy."""
    import torch

    trials = []

    def one(what, make, args):
        marker = tmp / f"executed-{len(trials)}"
        target = make(marker)
        r = cli(*[a if a != "TARGET" else target for a in args], timeout=300)
        trials.append({"payload": what, "executed": marker.exists(), "exit": r.returncode,
                       "message": (r.stderr.strip().splitlines() or [""])[-1][:160]})

    def run_with(kind, name, writer):
        def make(marker):
            run = tmp / f"evil-run-{len(trials)}"
            shutil.copytree(runs[kind], run)
            writer(run / name, marker)
            return run
        return make

    def torch_pickle(path, marker):
        torch.save({"format": "recurvit-checkpoint-v1", "config": {}, "model": _Payload(marker)}, path)

    def plain_pickle(path, marker):
        with open(path, "wb") as f:
            pickle.dump({"model": _Payload(marker)}, f)

    slots = [("classify", "last.pt", ["train", "--resume", "TARGET"]),
             ("finetune", "last.pt", ["finetune", "--resume", "TARGET"]),
             ("vae", "last.pt", ["vae", "train", "--resume", "TARGET"]),
             ("vae", "last.pt", ["vae", "eval", "TARGET"])]
    slots += [("classify", "best.pt", cmd) for cmd in (
        ["eval", "TARGET"], ["horizon", "TARGET", "--steps", "2"], ["analyze", "TARGET"], ["mixture", "TARGET"],
        ["predict", "TARGET", str(tmp)], ["export", "TARGET", "--format", "hf", "--out", str(tmp / "x")],
        ["finetune", "TARGET", "--data", "digits"], ["exit", "TARGET"])]
    for writer, kind_name in ((torch_pickle, "torch.save"), (plain_pickle, "pickle.dump")):
        for run_kind, name, cmd in slots:
            one(f"{kind_name} in a {run_kind} run's {name}, {' '.join(c for c in cmd[:2] if c != 'TARGET')}",
                run_with(run_kind, name, writer), cmd)

    def yaml_file(path_fn):
        def make(marker):
            path = path_fn(len(trials))
            path.write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
            return path
        return make

    one("YAML tag in a train config", yaml_file(lambda i: tmp / f"evil-{i}.yaml"), ["train", "TARGET"])
    one("YAML tag in a vae config", yaml_file(lambda i: tmp / f"evil-{i}.yaml"), ["vae", "train", "TARGET"])
    one("YAML tag in a study file", yaml_file(lambda i: tmp / f"evil-{i}.yaml"), ["study", "TARGET"])

    def evil_config(marker):
        run = tmp / f"evil-cfg-{len(trials)}"
        shutil.copytree(runs["classify"], run)
        (run / "config.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
        return run
    one("YAML tag in a run's config.yaml, train --resume", evil_config, ["train", "--resume", "TARGET"])
    return trials


# -------------------------------------------------------------------------------- bad inputs
def bad_input_trials(tmp: Path, trained: Path) -> list:
    (tmp / "garbage.pt").write_bytes(os.urandom(4096))
    (tmp / "empty.pt").write_bytes(b"")
    shutil.copytree(trained, tmp / "truncated")
    last = tmp / "truncated" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    (tmp / "truncated" / "best.pt").unlink(missing_ok=True)
    (tmp / "not-an-image.png").write_text("hello")
    (tmp / "afile").write_text("x")
    (tmp / "one-class" / "train" / "a").mkdir(parents=True)
    (tmp / "study-bad.yaml").write_text("name: x\nbase: configs/digits/bvit.yaml\ngrid: {train.seed: [0, 0]}\n")
    (tmp / "study-escape.yaml").write_text("name: x\nbase: configs/digits/bvit.yaml\ngrid: {regime: {'../../x': {}}}\n")
    (tmp / "study-typo.yaml").write_text("name: x\nbase: configs/digits/bvit.yaml\ngrid: {train.seed: [0]}\nwokers: 2\n")
    cases = [
        ["train", "nosuch.yaml"], ["train", "train.epochs=0"], ["train", "train.batch_size=0"], ["train", "train.lr=0"],
        ["train", "train.lr=-1"], ["train", "train.epochs=abc"], ["train", "train.epoch=3"], ["train", "model.nosuch=1"],
        ["train", "model.name=nosuch"], ["train", "model.num_classes=0"], ["train", "model.num_classes=1"],
        ["train", "train.betas=[0.9,1.5]"], ["train", "model.drop_path=1.5"], ["train", "train.grad_clip=nan"],
        ["train", "train.weight_decay=nan"], ["train", "data.name=nosuch"], ["train", "data.holdout=1.5"],
        ["train", "data.name=cifar10", "data.root=/nonexistent"], ["train", "data.name=imagefolder", f"data.root={tmp / 'one-class'}"],
        ["train", "model.steps=0"], ["train", "model.core=nosuch"], ["train", "model.method=rk4"],
        ["train", "--out", tmp / "afile"], ["train", "--resume", tmp / "nosuch"], ["train", "--resume", tmp / "afile"],
        ["train", "--resume", tmp / "truncated"], ["train", "--data-root", tmp],
        ["eval", tmp / "nosuch"], ["eval", tmp / "garbage.pt"], ["eval", tmp / "empty.pt"], ["eval", tmp],
        ["eval", trained, "--steps", "0"], ["eval", trained, "--steps", "-3"], ["horizon", trained, "--steps", "0"],
        ["predict", trained, tmp / "not-an-image.png"], ["predict", trained, tmp / "nosuch.png"],
        ["predict", trained, tmp / "not-an-image.png", "--topk", "0"], ["export", trained, "--format", "nosuch", "--out", tmp / "e"],
        ["export", tmp / "garbage.pt", "--format", "hf", "--out", tmp / "e2"], ["finetune", trained], ["finetune", "--resume", trained],
        ["finetune", trained, "--data", "digits", "--method", "nope"], ["finetune", trained, "--data", "digits", "model.steps=3"],
        ["finetune", trained, "--data", "digits", "--rank", "0", "--method", "lora"],
        ["vae", "train", "train.recon=l3"], ["vae", "train", "train.epochs=0"], ["vae", "eval", trained],
        ["vae"], ["study", tmp / "nosuch.yaml"], ["study", tmp / "study-bad.yaml"], ["study", tmp / "study-escape.yaml"],
        ["study", tmp / "study-typo.yaml"], ["flops", "nosuch"], ["flops", "bvit_tiny", "depth=3"], ["match", "nosuch"],
        ["nosuch-command"], ["train", "--nproc", "0"], ["train", "train.batch_size=127", "--nproc", "2"],
    ] + issue39_cases(tmp, trained)
    out = []
    for args in cases:
        r = cli(*args, timeout=300)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        out.append({"args": " ".join(map(str, args)).replace(str(tmp), "TMP"), "exit": r.returncode,
                    "stderr_lines": len(lines), "clear": r.returncode == 2 and len(lines) == 1,
                    "message": (lines[-1] if lines else "")[:200].replace(str(tmp), "TMP")})
    return out


def issue39_cases(tmp: Path, trained: Path) -> list:
    """Issue 39's bad inputs (items 1, 5-12) and a few more of the same kinds: each must be one line, exit 2."""
    import torch
    from PIL import Image

    nan = tmp / "nan-run"
    shutil.copytree(trained, nan)
    for name in ("last.pt", "best.pt"):
        if (nan / name).is_file():
            ck = torch.load(nan / name, weights_only=True)
            key = next(iter(ck["model"]))
            ck["model"][key] = torch.full_like(ck["model"][key], float("nan"))
            torch.save(ck, nan / name)
    img = tmp / "img.png"
    Image.new("L", (8, 8), 3).save(img)
    base = ROOT / "configs/digits/bvit.yaml"
    studies = {"escape": "name: ../../../../elsewhere/x\ngrid: {train.seed: [0]}\n", "listname": "name: [1, 2]\n"
               "grid: {train.seed: [0]}\n", "empty": "name: e\ngrid: {}\n",
               "twice": "name: t\ngrid:\n  regime:\n    a: {train.epochs: 1}\n    a: {train.epochs: 2}\n"}
    for name, text in studies.items():
        (tmp / f"study-{name}.yaml").write_text(f"base: {base}\n{text}")
    (tmp / "text.pt").write_text("hello\n")
    (tmp / "dir-as-csv").mkdir()
    (tmp / "ro-run").mkdir()
    exported = tmp / "exported-bad"
    cli("export", trained, "--format", "hf", "--out", exported)
    (exported / "config.json").write_text("{not json")
    t = [*TINY, "train.epochs=1", "--out", tmp / "never"]
    return [
        ["predict", trained, img, "--csv", trained / "last.pt"], ["predict", nan, img],
        ["export", nan, "--format", "hf", "--out", tmp / "nan-export"], ["study", tmp / "study-escape.yaml"],
        ["study", tmp / "study-listname.yaml"], ["study", tmp / "study-empty.yaml"], ["study", tmp / "study-twice.yaml"],
        ["predict", trained, img, "--steps", "1000000000"], ["flops", "bvit_tiny", "steps=1000000000000"],
        ["finetune", trained, "--data", "digits", "--rank", "100000"], ["flops", "bvit_tiny", "--batch-size", "1000000000"],
        ["predict", trained, img, "--csv", "/sys/p.csv"], ["predict", trained, img, "--csv", tmp / "dir-as-csv"],
        ["export", trained, "--format", "hf", "--out", "/sys/x"], ["export", trained, "--format", "safetensors", "--out", "/sys/x.st"],
        ["horizon", trained, "--steps", "2", "--out", "/sys/h"], ["horizon", trained, "--steps", "2", "--out", img],
        ["train", "model.mlp_ratio=-1", *t], ["train", "model.mlp_ratio=inf", *t], ["train", "model.mlp_ratio=0", *t],
        ["train", "model.num_classes=5", *t], ["train", "model.in_chans=3", *t], ["train", "model.img_size=16", "data.img_size=8", *t],
        ["train", "data.holdout=0.9999", *t], ["train", "train.seed=99999999999999999999", *t],
        ["eval", trained, "steps=!!python/object/apply:os.system"], ["match", "loopvae_conv", "--by", "params"],
        ["eval", exported], ["eval", tmp / "text.pt"], ["train", "data.name=synthetic", "data.synthetic_classes=1", *t],
        ["train", "train.depth.sigma=-1", *t], ["train", "train.depth.truncate=-1", *t], ["train", "train.log_every=-1", *t],
        ["train", "model.stage_heads=-2", *t], ["train", "train.supervision.stages=100", *t],
        ["finetune", trained, "--data", "digits", "--alpha", "-1"], ["finetune", trained, "--data", "digits", "--alpha", "0"],
    ]


def export_kill_trials(tmp: Path, trained: Path, n: int, rng: random.Random) -> list:
    """``kill -9`` of ``export --format hf`` at a random moment, then the same export: survived = it ends with
    exit 0 and a folder that loads (a kill never leaves half a folder that the export then refuses)."""
    trials = []
    for i in range(n):
        out = tmp / f"export-{i}"
        p = start("export", trained, "--format", "hf", "--out", out)
        time.sleep(rng.uniform(0.5, 4.0))  # the import of torch, the load, the writes: somewhere in there
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finished = p.wait() == 0  # it was done before the kill came
        whole = ["config.json", "model.safetensors"]
        if out.exists():  # after a kill: the whole folder or none, never a part
            ok, note = sorted(x.name for x in out.iterdir()) == whole, "a half folder was left"
        else:  # none: the same export, again, makes it
            r = cli("export", trained, "--format", "hf", "--out", out)
            ok = r.returncode == 0 and sorted(x.name for x in out.iterdir()) == whole
            note = (r.stderr.strip().splitlines() or ["incomplete folder"])[-1][:200]
        trials.append({"kind": "export --format hf" + (" (finished before the kill)" if finished else ""),
                       "killed_after_epochs": "-", "survived": ok, "note": "" if ok else note})
    return trials


def report(kills, payloads, bad, out: Path) -> None:
    survived = sum(t["survived"] for t in kills)
    executed = sum(t["executed"] for t in payloads)
    clear = sum(t["clear"] for t in bad)
    lines = ["# Fault-and-bad-input probe", "", "Generated by `python scripts/probe.py`; do not edit by hand.", "",
             f"- kill -9 at a random moment, then the documented way on: **{survived} of {len(kills)}** resumed to "
             "per-epoch metrics identical to an uninterrupted run",
             f"- malicious payloads (code-running pickles in checkpoints, object-constructing YAML tags): "
             f"**{executed} of {len(payloads)}** executed",
             f"- bad inputs: **{clear} of {len(bad)}** gave one clear line on stderr and exit status 2", "",
             "## Kills", "", "| kind | killed after epoch | survived | note |", "|---|---|---|---|"]
    lines += [f"| {t['kind']} | {t['killed_after_epochs']} | {t['survived']} | {t['note']} |" for t in kills]
    lines += ["", "## Payloads", "", "| payload | executed | exit | message |", "|---|---|---|---|"]
    lines += [f"| {t['payload']} | {t['executed']} | {t['exit']} | {t['message'].replace('|', '/')} |" for t in payloads]
    lines += ["", "## Bad inputs", "", "| command | exit | stderr lines | message |", "|---|---|---|---|"]
    lines += [f"| `recurvit {t['args']}` | {t['exit']} | {t['stderr_lines']} | {t['message'].replace('|', '/')} |"
              for t in bad]
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "probe.json").write_text(json.dumps({"kills": kills, "payloads": payloads, "bad_inputs": bad}, indent=1) + "\n")
    print("\n".join(lines[4:7]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "probe")
    ap.add_argument("--kills", type=int, default=4, help="kill -9 trials per single-process kind (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("bad", "payloads", "kills"), action="append",
                    help="run only these parts (repeatable; default: all three)")
    args = ap.parse_args()
    parts = set(args.only or ("bad", "payloads", "kills"))
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="recurvit-probe-") as d:
        tmp = Path(d)
        trained = tmp / "trained"
        r = cli("train", *TINY, "train.epochs=2", "data.holdout=0.1", "--out", trained)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        runs = {"classify": trained, "finetune": tmp / "trained-ft", "vae": tmp / "trained-vae"}
        for r in (cli("finetune", trained, "--data", "digits", "--method", "lora", "train.epochs=1", "--out",
                      runs["finetune"]), cli("vae", "train", *VAE, "train.epochs=1", "--out", runs["vae"])):
            if r.returncode != 0:
                raise SystemExit(r.stderr)
        for part in ("bad", "payload", "kills"):
            (tmp / part).mkdir()
        bad = bad_input_trials(tmp / "bad", trained) if "bad" in parts else []
        payloads = payload_trials(tmp / "payload", runs) if "payloads" in parts else []
        kills = kill_trials(tmp / "kills", args.kills, rng) if "kills" in parts else []
        if "kills" in parts:
            kills += export_kill_trials(tmp / "kills", trained, args.kills, rng)
        hide = lambda rows: json.loads(json.dumps(rows).replace(str(tmp), "TMP"))  # noqa: E731
        report(hide(kills), hide(payloads), hide(bad), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

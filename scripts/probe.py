"""The fault-and-bad-input probe: what a careless or unlucky user does to recurvit, and what it survives.

    python scripts/probe.py                  # -> results/probe/report.md and probe.json (about 50 minutes)
    python scripts/probe.py --kills 2        # fewer kill -9 trials per kind
    python scripts/probe.py --only bad --only payloads --out /tmp/probe   # parts of it, elsewhere

Three figures, each from the command line in subprocesses (one CPU thread each):
- kills: ``kill -9`` at a random moment of a training (train, finetune, vae train, a study's main
  process, one study worker, the ``train --nproc 2`` launcher) or of ``export --format hf``, then the documented way on
  (``--resume`` or the same study command); survived = the per-epoch metrics (timings aside)
  equal those of an uninterrupted run of the same command; a fused step-program export killed, then run again:
  survived = a folder that loads and no scratch folder left beside it;
- malicious payloads, each a file (or an argument) someone else could hand a user, in a fresh copy of a
  trained run: pickles whose unpickling runs code (torch.save, a bare pickle, a real checkpoint with its
  data.pkl swapped) in every checkpoint slot of every run kind for every command that reads it, in the
  checkpoint file given directly, as LPIPS / rFID weights and in an exported folder; names in an exported
  config.json that an import would resolve; YAML tags that construct Python objects or import a module
  (!!python/object/apply, /name, /module) in every YAML a command reads and in key=value overrides; CIFAR
  archives whose members escape data.root (.., absolute, symlinks, hard links, devices, FIFOs) and CIFAR
  batches that are code-running pickles; symlinks planted in a run folder where a command writes;
  step-program folders (scripts/probe_steps.py, through the Python API): doctored .pt2 archives (pickled
  weights, constants and sample inputs, exec'd guards, eval'd symbolic sizes) and manifest file names that
  lead outside the folder. Executed = the payload's marker file exists afterwards, or anything outside the
  folder it came in was written;
- bad inputs: mistakes a user makes on the command line (issue 39's among them), step-program folders mixed
  from two runs or without fingerprints, study bases that are no config (their content must not be echoed),
  hf exports whose config.json lies, an export's OUT a symbolic link, a full disk in the middle of the files
  horizon and exit write (those of the run before must all be kept, the line must name them all);
  clear = exit status 2 with one line on stderr (and none of the content a case says must not appear).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from probe_steps import api, step_program_bad_inputs, step_program_payloads, study_base_cases

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=128"]
TIMING = {"seconds", "img_per_s", "train_seconds", "train_cpu_seconds"}
VAE = [str(ROOT / "configs/vae/digits.yaml"), "model.embed_dim=8", "train.batch_size=128"]


def cli(*args, timeout=600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recurvit", *map(str, args)], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=timeout, cwd=ROOT)


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
    """Unpickling it runs ``touch MARKER``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def torch_pickle(path: Path, marker: Path) -> None:
    """A torch.save file (a zip archive) holding a code-running object where a checkpoint keeps its weights."""
    import torch

    torch.save({"format": "recurvit-checkpoint-v1", "config": {}, "model": _Payload(marker)}, path)


def plain_pickle(path: Path, marker: Path) -> None:
    """A bare pickle (what torch.load read before its zip format) of a code-running object."""
    with open(path, "wb") as f:
        pickle.dump({"format": "recurvit-checkpoint-v1", "config": {}, "model": _Payload(marker)}, f)


def zip_pickle(path: Path, marker: Path) -> None:
    """A real checkpoint (the file at ``path``, else a fresh torch.save) whose ``data.pkl`` member is swapped
    for a code-running pickle: the tensors, the version and the byte order stay those of the real archive."""
    import io
    import zipfile

    import torch

    if Path(path).is_file() and zipfile.is_zipfile(path):
        src = Path(path).read_bytes()
    else:
        buf = io.BytesIO()
        torch.save({"format": "recurvit-checkpoint-v1", "config": {}, "model": {"w": torch.zeros(4)}}, buf)
        src = buf.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                data = pickle.dumps({"format": "recurvit-checkpoint-v1", "config": {}, "model": _Payload(marker)},
                                    protocol=2)
            zout.writestr(info.filename, data)
    Path(path).write_bytes(out.getvalue())


PICKLES = ((torch_pickle, "torch.save"), (plain_pickle, "pickle.dump"), (zip_pickle, "a zip with data.pkl swapped"))
TAGS = ("object/apply", "python/name", "python/module")


def yaml_tag(kind: str, marker: Path, mods: Path) -> str:
    """A YAML value whose construction runs code: ``touch MARKER`` through os.system, or the import of a
    module (written into ``mods``, on the subprocess's PYTHONPATH) whose top level creates the marker."""
    if kind == "object/apply":
        return f"!!python/object/apply:os.system ['touch {marker}']"
    mod = evil_module(marker, mods)
    return f"!!python/name:{mod}.x" if kind == "python/name" else f"!!python/module:{mod}"


def evil_module(marker: Path, mods: Path) -> str:
    """The name of a module in ``mods`` whose import creates ``marker``."""
    mod = f"probe_evil_{marker.name.replace('-', '_')}"
    (mods / f"{mod}.py").write_text(f"open({str(marker)!r}, 'w').close()\nx = 1\n")
    return mod


def _snapshot(folder: Path, skip: Path) -> dict:
    """Every entry under ``folder`` outside ``skip``: path -> (kind, a file's bytes / a link's target)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p == skip or skip in p.parents:
            continue
        if p.is_symlink():
            out[p] = ("link", os.readlink(p))
        elif p.is_file():
            out[p] = ("file", p.read_bytes())
        else:
            out[p] = ("dir" if p.is_dir() else "special", None)
    return out


def _specials(folder: Path) -> list:
    """Device files, FIFOs and sockets under ``folder``."""
    return [p for p in folder.rglob("*") if not p.is_symlink() and not p.is_file() and not p.is_dir()]


def _watch(folder: Path, skip: Path):
    """A check: whether anything under ``folder`` outside ``skip`` was written, or a special file made anywhere
    in ``folder``, since now."""
    before = _snapshot(folder, skip)
    return lambda: _snapshot(folder, skip) != before or bool(_specials(folder))


def payload_trials(tmp: Path, runs: dict) -> list:
    """Malicious files given to the CLI, each in a fresh copy, each trial one CLI call. ``runs``: a trained
    run of each kind ("classify", "finetune", "vae", "srvit": a SoftMoR run for mixture), "study" (a finished
    one-run study folder) with its "study_file", and "hf" (an export of the classify run). Executed: the marker file the payload would create
    exists afterwards, or (archive members, links planted in a run) something outside the folder the command
    was given was written."""
    from PIL import Image

    trials = []
    mods = tmp / "modules"
    mods.mkdir()
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(mods), os.environ.get("PYTHONPATH")]))}  # the payloads' modules
    img = tmp / "img.png"
    Image.new("L", (8, 8), 3).save(img)

    def one(what, make, command, run=cli):
        """``make(marker, i)`` -> (target, a check of what the payload would write, or None);
        ``command(target, out)`` -> the CLI's arguments (``out``: a fresh path for outputs), or those of ``run``
        (a Python API call in a fresh interpreter, scripts/probe_steps.py)."""
        i = len(trials)
        marker = tmp / f"executed-{i}"
        target, check = make(marker, i)
        r = run(*command(target, tmp / f"out-{i}"), timeout=300, env=env)
        trials.append({"payload": what, "executed": marker.exists() or bool(check and check()),
                       "exit": r.returncode, "message": (r.stderr.strip().splitlines() or [""])[-1][:160]})

    def copy(kind, i):
        run = tmp / f"evil-{kind}-{i}"
        shutil.copytree(runs[kind], run, symlinks=True)
        return run

    def study_run(study):  # the study's one run folder, made to look unfinished: the study takes it up again
        run = next(d for d in (study / "runs").iterdir() if d.is_dir())
        (run / "result.json").unlink(missing_ok=True)
        return run

    def study_cmd(t, o):
        return ["study", runs["study_file"], "--out", t]

    # -- code-running pickles in every checkpoint slot a command reads: (kind, file, how the command is
    # given it: its run folder, the file itself or a study folder, command; T: the target, O: an output path)
    def c(*a):
        return lambda t, o: [str(t) if x == "T" else str(x).replace("O", str(o)) if isinstance(x, str)
                             and x.startswith("O") else str(x) for x in a]

    export_to = {"hf": "O", "safetensors": "O.safetensors", "torch-export": "O.pt2", "onnx": "O.onnx"}
    slots = [("classify", "best.pt", "run", c("eval", "T")),
             ("classify", "best.pt", "run", c("horizon", "T", "--steps", 2, "--out", "O")),
             ("classify", "best.pt", "run", c("analyze", "T", "--num-images", 64, "--out", "O")),
             ("srvit", "best.pt", "run", c("mixture", "T", "--out", "O")),
             ("classify", "best.pt", "run", c("predict", "T", img)),
             *[("classify", "best.pt", "run", c("export", "T", "--format", f, "--out", o))
               for f, o in export_to.items()],
             ("classify", "best.pt", "run", c("finetune", "T", "--data", "digits", "train.epochs=1", "--out", "O")),
             ("classify", "best.pt", "run", c("exit", "T", "--out", "O")),
             ("classify", "last.pt", "run", c("train", "--resume", "T", "train.epochs=3")),
             ("classify", "best.pt", "file", c("eval", "T")),
             ("classify", "best.pt", "file", c("horizon", "T", "--steps", 2, "--out", "O")),
             ("classify", "best.pt", "file", c("predict", "T", img)),
             ("classify", "best.pt", "file", c("export", "T", "--format", "hf", "--out", "O")),
             ("classify", "best.pt", "file", c("finetune", "T", "--data", "digits", "train.epochs=1", "--out", "O")),
             ("finetune", "last.pt", "run", c("finetune", "--resume", "T", "train.epochs=2")),
             ("finetune", "best.pt", "run", c("eval", "T")),
             ("finetune", "best.pt", "run", c("predict", "T", img)),
             ("finetune", "best.pt", "run", c("export", "T", "--format", "hf", "--out", "O")),
             ("vae", "last.pt", "run", c("vae", "train", "--resume", "T", "train.epochs=2")),
             ("vae", "last.pt", "run", c("vae", "eval", "T", "--num-images", 64)),
             ("vae", "last.pt", "run", c("vae", "intervene", "T", "--num-images", 64, "--out", "O")),
             ("vae", "last.pt", "file", c("vae", "eval", "T", "--num-images", 64)),
             ("study", "last.pt", "study", study_cmd)]
    for writer, wname in PICKLES:
        for kind, name, how, command in slots:
            def make(marker, i, kind=kind, name=name, how=how, writer=writer):
                run = copy(kind, i)
                writer((study_run(run) if how == "study" else run) / name, marker)
                return (run / name if how == "file" else run), None
            shown = [str(a) for a in command("RUN" if how != "file" else name.upper().replace(".", "_"), "OUT")]
            where = {"run": f"a {kind} run's {name}", "file": f"a {kind} checkpoint given as the file {name}",
                     "study": "a study run's last.pt (the study resumes it)"}[how]
            one(f"{wname} in {where}: recurvit {' '.join(a for a in shown if not a.startswith('/'))}", make, command)
        for flags in (["--vgg-weights", "W", "--lpips-weights", "W"], ["--inception-weights", "W"]):
            def make(marker, i, writer=writer):  # the weight files a LoopVAE evaluation reads for LPIPS / rFID
                writer(tmp / f"weights-{i}.pth", marker)
                return tmp / f"weights-{i}.pth", None
            one(f"{wname} as the weights of vae eval {' / '.join(f for f in flags if f != 'W')}", make,
                lambda t, o, flags=flags: ["vae", "eval", runs["vae"], "--num-images", 64,
                                           *[str(t) if a == "W" else a for a in flags]])

    # -- an exported folder (export --format hf), doctored: weights as pickles, names resolved by import
    def hf_case(edit):
        def make(marker, i):
            folder = copy("hf", i)
            edit(folder, marker)
            return folder, None
        return make

    def bin_only(f, m):
        (f / "model.safetensors").unlink()
        torch_pickle(f / "pytorch_model.bin", m)

    def named(key):
        def edit(f, m):
            cfg = json.loads((f / "config.json").read_text())
            name = f"{evil_module(m, mods)}.x"
            if key == "model":
                cfg["recurvit"]["model"] = name
            elif key == "architecture":
                cfg["architecture"] = name
            else:
                cfg["model_args"][key] = name
            (f / "config.json").write_text(json.dumps(cfg))
        return edit

    hf_cases = [("model.safetensors replaced by a torch.save pickle", lambda f, m: torch_pickle(f / "model.safetensors", m),
                 ["eval"]),
                ("model.safetensors replaced by a zip with data.pkl swapped",
                 lambda f, m: zip_pickle(f / "model.safetensors", m), ["eval"]),
                ("pytorch_model.bin (a torch.save pickle) instead of model.safetensors", bin_only, ["eval", "predict"]),
                ("pytorch_model.bin (a torch.save pickle) beside model.safetensors",
                 lambda f, m: torch_pickle(f / "pytorch_model.bin", m), ["eval", "predict"]),
                ("config.json's recurvit.model a module.attr to import", named("model"), ["eval"]),
                ("config.json's architecture a module.attr to import", named("architecture"), ["eval"]),
                ("config.json's model_args.act_layer a module.attr to import", named("act_layer"), ["eval"]),
                ("config.json's model_args.core a module.attr to import", named("core"), ["eval"])]
    for label, edit, commands in hf_cases:
        for command in commands:
            one(f"exported folder, {label}: recurvit {command}", hf_case(edit),
                lambda t, o, command=command: [command, t, *([img] if command == "predict" else [])])

    # -- YAML tags that construct Python objects, in every YAML a command reads (and in overrides)
    base = ROOT / "configs/digits/bvit.yaml"
    head = f"base: {base}\noverrides: {{{', '.join(o.replace('=', ': ') for o in TINY)}, train.epochs: 1}}\n"

    def text_file(text_of):  # a file of its own: text_of(tag, path) -> the file's text
        def prepare(tag, i):
            path = tmp / f"evil-{i}.yaml"
            path.write_text(text_of(tag, path))
            return path
        return prepare

    def study_over(kind):  # a study file whose base: config (or from: study) holds the tag
        def text_of(tag, path):
            other = path.with_suffix(f".{kind}.yaml")
            if kind == "base":
                other.write_text(f"model:\n  steps: {tag}\n")
                return f"name: s\nbase: {other}\ngrid: {{train.seed: [0]}}\n"
            other.write_text(f"name: {tag}\n{head}grid: {{train.seed: [0]}}\n")
            return f"name: s\n{head}from: {{study: {other}}}\ngrid: {{train.seed: [1]}}\n"
        return text_file(text_of)

    def run_config(kind):  # the tag as train.epochs in a run's config.yaml
        def prepare(tag, i):
            run = copy(kind, i)
            cfg = (study_run(run) if kind == "study" else run) / "config.yaml"
            text, n = re.subn(r"(\ntrain:\n(?:  .*\n)*?  epochs: ).*", lambda m: m.group(1) + tag, cfg.read_text(),
                              count=1)
            assert n == 1, f"no train.epochs in {cfg}"
            cfg.write_text(text)
            return run
        return prepare

    def nothing(tag, i):
        return None

    def resumable(tag, i):
        return copy("classify", i)

    yaml_slots = [  # (where, prepare(tag, i) -> target, command(target, out, tag)); * : every tag kind
        ("a train config*", text_file(lambda tag, p: f"model:\n  steps: {tag}\n"), lambda t, o, g: ["train", t, "--out", o]),
        ("a vae config*", text_file(lambda tag, p: f"model:\n  name: {tag}\n"), lambda t, o, g: ["vae", "train", t, "--out", o]),
        ("a study file*", text_file(lambda tag, p: f"name: {tag}\n{head}grid: {{train.seed: [0]}}\n"),
         lambda t, o, g: ["study", t, "--out", o]),
        ("a study's base: config", study_over("base"), lambda t, o, g: ["study", t, "--out", o]),
        ("a study's from: study", study_over("from"), lambda t, o, g: ["study", t, "--out", o]),
        ("a run's config.yaml: recurvit train --resume RUN*", run_config("classify"),
         lambda t, o, g: ["train", "--resume", t]),
        ("a fine-tune's config.yaml: recurvit finetune --resume RUN", run_config("finetune"),
         lambda t, o, g: ["finetune", "--resume", t]),
        ("a vae run's config.yaml: recurvit vae train --resume RUN", run_config("vae"),
         lambda t, o, g: ["vae", "train", "--resume", t]),
        ("a run's config.yaml: recurvit eval RUN", run_config("classify"), lambda t, o, g: ["eval", t]),
        ("a run's config.yaml: recurvit predict RUN", run_config("classify"), lambda t, o, g: ["predict", t, img]),
        ("a run's config.yaml: recurvit export RUN", run_config("classify"), lambda t, o, g: ["export", t, "--out", o]),
        ("a run's config.yaml: recurvit horizon RUN", run_config("classify"),
         lambda t, o, g: ["horizon", t, "--steps", 2, "--out", o]),
        ("a run's config.yaml: recurvit finetune RUN", run_config("classify"),
         lambda t, o, g: ["finetune", t, "--data", "digits", "train.epochs=1", "--out", o]),
        ("a study run's config.yaml: recurvit study", run_config("study"), None),
        ("an override: recurvit train train.epochs=TAG*", nothing, lambda t, o, g: ["train", f"train.epochs={g}", "--out", o]),
        ("an override: recurvit train --resume RUN train.epochs=TAG", resumable,
         lambda t, o, g: ["train", "--resume", t, f"train.epochs={g}"]),
        ("an override: recurvit finetune RUN train.epochs=TAG", nothing,
         lambda t, o, g: ["finetune", runs["classify"], "--data", "digits", f"train.epochs={g}", "--out", o]),
        ("an override: recurvit vae train train.epochs=TAG", nothing,
         lambda t, o, g: ["vae", "train", *VAE, f"train.epochs={g}", "--out", o]),
        ("a core option: recurvit eval RUN steps=TAG*", nothing, lambda t, o, g: ["eval", runs["classify"], f"steps={g}"]),
    ]
    for where, prepare, command in yaml_slots:
        command = command or (lambda t, o, g: study_cmd(t, o))
        for kind in TAGS if where.endswith("*") else TAGS[:1]:
            def make(marker, i, prepare=prepare, kind=kind):
                tag = yaml_tag(kind, marker, mods)
                return (prepare(tag, i), tag), None
            one(f"YAML !!python/{kind.removeprefix('python/')} in {where.rstrip('*')}", make,
                lambda t, o, command=command: command(t[0], o, t[1]))

    def recipe_with_tag(marker, i):
        run = copy("finetune", i)
        recipe = json.loads((run / "finetune.json").read_text())
        recipe["method"] = yaml_tag("object/apply", marker, mods)
        (run / "finetune.json").write_text(json.dumps(recipe))
        return run, None
    one("a YAML tag as the method in a fine-tune's finetune.json: recurvit finetune --resume RUN", recipe_with_tag,
        lambda t, o: ["finetune", "--resume", t, "train.epochs=2"])

    archive_payloads(tmp, runs, one)
    planted_links(tmp, runs, one)
    steps = tmp / "steps-src"  # step programs of the classify run: doctored archives, names leading outside
    r = cli("export", runs["classify"], "--format", "torch-export", "--steps-program", "--fused", "--out", steps)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    onnx = tmp / "steps-onnx"
    has_onnx = cli("export", runs["classify"], "--format", "onnx", "--steps-program", "--out", onnx).returncode == 0
    step_program_payloads(tmp, steps, onnx if has_onnx else None, one, _watch)
    return trials


def _add(tar, name: str, data: bytes = b"x\n", kind=None, link: str = "") -> None:
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    if kind is None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return
    info.type, info.linkname, info.devmajor, info.devminor = kind, link, 1, 3
    tar.addfile(info)


def archive_payloads(tmp: Path, runs: dict, one) -> None:
    """CIFAR's official .tar.gz with members that would write outside ``data.root`` (read by data/archives.py
    when only the archive is there), and CIFAR's batch pickles replaced by code-running ones."""
    import tarfile

    B = "cifar-10-batches-py"
    train = lambda name: lambda t, o: ["train", f"data.name={name}", f"data.root={t}", *TINY, "train.epochs=1",  # noqa
                                       "--out", o]

    def tar_case(members, archive="cifar-10-python.tar.gz"):
        """``members(tar, folder)``: the bad members, after a good one; ``folder``: the data root's parent,
        which holds outside/victim.txt. Executed: anything under ``folder`` outside the root was written, or a
        device file or FIFO was made."""
        def make(marker, i):
            folder = tmp / f"tar-{i}"
            root = folder / "root"
            root.mkdir(parents=True)
            (folder / "outside").mkdir()
            (folder / "outside" / "victim.txt").write_text("precious\n")
            with tarfile.open(root / archive, "w:gz") as tar:
                _add(tar, f"{'cifar-100-python' if '100' in archive else B}/readme.html", b"a good member first\n")
                members(tar, folder)
            return root, _watch(folder, root)
        return make

    cases = [
        ("a member ../escaped.txt", lambda t, f: _add(t, "../escaped.txt")),
        (f"a member {B}/../../escaped.txt", lambda t, f: _add(t, f"{B}/../../escaped.txt")),
        ("a member with an absolute path", lambda t, f: _add(t, str(f / "outside" / "absolute.txt"))),
        ("a symlink to an absolute folder outside, then a file through it",
         lambda t, f: (_add(t, f"{B}/out", kind=tarfile.SYMTYPE, link=str(f / "outside")),
                       _add(t, f"{B}/out/through.txt"))),
        ("a symlink ../../outside, then a file through it",
         lambda t, f: (_add(t, f"{B}/out", kind=tarfile.SYMTYPE, link="../../outside"), _add(t, f"{B}/out/through.txt"))),
        ("a symlink .. then a member up/../escaped.txt",
         lambda t, f: (_add(t, f"{B}/up", kind=tarfile.SYMTYPE, link=".."), _add(t, f"{B}/up/../escaped.txt"))),
        ("a hard link to ../outside/victim.txt, then a file of that name",
         lambda t, f: (_add(t, f"{B}/h", kind=tarfile.LNKTYPE, link="../outside/victim.txt"), _add(t, f"{B}/h", b"pwned\n"))),
        ("a hard link to the victim's absolute path, then a file of that name",
         lambda t, f: (_add(t, f"{B}/h", kind=tarfile.LNKTYPE, link=str(f / "outside" / "victim.txt")),
                       _add(t, f"{B}/h", b"pwned\n"))),
        ("a character device member (/dev/null's numbers)", lambda t, f: _add(t, f"{B}/null", kind=tarfile.CHRTYPE)),
        ("a block device member", lambda t, f: _add(t, f"{B}/disk", kind=tarfile.BLKTYPE)),
        ("a FIFO member", lambda t, f: _add(t, f"{B}/pipe", kind=tarfile.FIFOTYPE)),
    ]
    for label, members in cases:
        one(f"cifar-10-python.tar.gz with {label}: recurvit train data.name=cifar10 data.root=DIR", tar_case(members),
            train("cifar10"))
    one("cifar-100-python.tar.gz with a member ../escaped.txt: recurvit train data.name=cifar100 data.root=DIR",
        tar_case(lambda t, f: _add(t, "../escaped.txt"), "cifar-100-python.tar.gz"), train("cifar100"))
    one("cifar-10-python.tar.gz with a member ../escaped.txt: recurvit finetune RUN --data cifar10 data.root=DIR",
        tar_case(lambda t, f: _add(t, "../escaped.txt")),
        lambda t, o: ["finetune", runs["classify"], "--data", "cifar10", f"data.root={t}", "train.epochs=1", "--out", o])

    # CIFAR's batches are pickles that torchvision unpickles in full; what stands between them and the
    # user is its md5 check of every file. The other files hold junk here (no real CIFAR is at hand).
    files = {"cifar10": (B, ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                             "test_batch", "batches.meta"]),
             "cifar100": ("cifar-100-python", ["train", "test", "meta"])}

    def cifar_folder(name, slots):
        def make(marker, i):
            root = tmp / f"cifar-{i}"
            folder, names = files[name]
            (root / folder).mkdir(parents=True)
            for n in names:
                if n in slots or slots == "all":
                    plain_pickle(root / folder / n, marker)
                else:
                    (root / folder / n).write_bytes(b"junk\n")
            return root, None
        return make

    for name, slot in [("cifar10", "data_batch_1"), ("cifar10", "test_batch"), ("cifar10", "batches.meta"),
                       ("cifar100", "train"), ("cifar100", "test"), ("cifar100", "meta")]:
        one(f"{files[name][0]}/{slot} a code-running pickle: recurvit train data.name={name} data.root=DIR",
            cifar_folder(name, [slot]), train(name))
    one(f"every file of {B}/ a code-running pickle: recurvit train data.name=cifar10 data.root=DIR",
        cifar_folder("cifar10", "all"), train("cifar10"))

    def archive_of_pickles(marker, i):
        root = tmp / f"cifar-{i}"
        root.mkdir()
        stage = tmp / f"cifar-stage-{i}"
        cifar_folder("cifar10", "all")(marker, f"stage-{i}")
        with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
            tar.add(tmp / f"cifar-stage-{i}" / B, arcname=B)
        shutil.rmtree(stage)
        return root, None
    one(f"cifar-10-python.tar.gz of code-running pickles: recurvit train data.name=cifar10 data.root=DIR",
        archive_of_pickles, train("cifar10"))

    def exported_reading(marker, i):
        folder = tmp / f"evil-hf-{i}"
        shutil.copytree(runs["hf"], folder)
        root, _ = cifar_folder("cifar10", "all")(marker, i)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["recurvit"]["data"] = {**cfg["recurvit"]["data"], "name": "cifar10", "root": str(root)}
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder, None
    one(f"an exported folder whose config.json reads CIFAR from a folder of code-running pickles: recurvit eval",
        exported_reading, lambda t, o: ["eval", t])


def planted_links(tmp: Path, runs: dict, one) -> None:
    """A run folder from someone else with a symlink where recurvit writes, pointing at a file outside
    (victim.txt beside the run): executed = anything outside the run folder was written."""
    def with_link(kind, name, victim_text=None, study=False, extra=None, dangling=False):
        def make(marker, i):
            folder = tmp / f"links-{i}"
            folder.mkdir()
            run = folder / "run"
            shutil.copytree(runs[kind], run, symlinks=True)
            inner = study_run(run) if study else run
            link = inner / name
            victim = folder / "victim.txt"
            if victim_text is None and link.is_file():  # the victim holds what the run's own file held
                victim.write_bytes(link.read_bytes())
            else:
                victim.write_text(victim_text or "precious\n")
            if link.is_dir() and not link.is_symlink():
                shutil.rmtree(link)
            link.unlink(missing_ok=True)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(victim)
            if dangling:  # a link to a file not there yet: opening it to create it would create it outside
                victim.unlink()
            if extra:
                extra(inner, marker)
            return run, _watch(folder, run)
        return make

    def study_run(study):
        run = next(d for d in (study / "runs").iterdir() if d.is_dir())
        (run / "result.json").unlink(missing_ok=True)
        return run

    study = lambda t, o: ["study", runs["study_file"], "--out", t]  # noqa: E731
    cases = [
        ("classify", ".lock", "train --resume RUN train.epochs=3", lambda t, o: ["train", "--resume", t, "train.epochs=3"],
         {}),
        ("finetune", ".lock", "finetune --resume RUN train.epochs=2",
         lambda t, o: ["finetune", "--resume", t, "train.epochs=2"], {}),
        ("vae", ".lock", "vae train --resume RUN train.epochs=2",
         lambda t, o: ["vae", "train", "--resume", t, "train.epochs=2"], {}),
        ("study", ".lock", "study (the run resumed)", study, {"study": True}),
        ("study", ".study.lock", "study (a link to no file yet)", study, {"dangling": True}),
        ("study", "error.txt", "study (the run fails: its last.pt is a pickle)", study,
         {"study": True, "extra": lambda run, m: torch_pickle(run / "last.pt", m)}),
        ("classify", "metrics.jsonl", "train --resume RUN train.epochs=3",
         lambda t, o: ["train", "--resume", t, "train.epochs=3"], {}),
        ("classify", "config.yaml", "train --resume RUN train.epochs=3",
         lambda t, o: ["train", "--resume", t, "train.epochs=3"], {}),
        ("classify", "last.pt", "train --resume RUN train.epochs=3",
         lambda t, o: ["train", "--resume", t, "train.epochs=3"], {}),
        ("classify", "horizon.csv", "horizon RUN --steps 2", lambda t, o: ["horizon", t, "--steps", 2],
         {"victim_text": "step,accuracy,loss,rel_change\nprecious\n"}),
        ("classify", "exit.json", "exit RUN", lambda t, o: ["exit", t], {"victim_text": "precious\n"}),
        ("classify", "analysis/summary.json", "analyze RUN --what readout",
         lambda t, o: ["analyze", t, "--what", "readout", "--num-images", 64], {"victim_text": "precious\n"}),
        ("classify", "analysis/steps.csv", "analyze RUN --what readout",
         lambda t, o: ["analyze", t, "--what", "readout", "--num-images", 64],
         {"victim_text": "step,accuracy\nprecious\n"}),
        ("srvit", "mixture_mean.csv", "mixture RUN", lambda t, o: ["mixture", t], {"victim_text": "unit,step_1\nprecious\n"}),
        ("vae", "recon_grid.png", "vae eval RUN", lambda t, o: ["vae", "eval", t, "--num-images", 64],
         {"victim_text": "precious\n"}),
        ("vae", "intervene.csv", "vae intervene RUN",
         lambda t, o: ["vae", "intervene", t, "--num-images", 64, "--truncate", 1, "--extra", 1, "--factors", 0.5],
         {"victim_text": "kind,side\nprecious\n"}),
    ]
    for kind, name, shown, command, opts in cases:
        owner = "a study run" if opts.get("study") else f"a {kind} run" if kind != "study" else "a study folder"
        one(f"{owner}'s {name} a symlink to a file outside: recurvit {shown}",
            with_link(kind, name, **opts), command)

    def fresh_with_lock(marker, i):
        folder = tmp / f"links-{i}"
        (folder / "run").mkdir(parents=True)
        (folder / "victim.txt").write_text("precious\n")
        (folder / "run" / ".lock").symlink_to(folder / "victim.txt")
        return folder / "run", _watch(folder, folder / "run")
    one("an empty --out folder whose .lock is a symlink to a file outside: recurvit train --out DIR", fresh_with_lock,
        lambda t, o: ["train", *TINY, "train.epochs=1", "--out", t])


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
    ] + issue39_cases(tmp, trained) + study_base_cases(tmp) + lying_export_cases(tmp, trained)
    out = []  # a case is argv, or (argv, text stderr must not echo)

    def record(args, r, hidden=None, kept=True):
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        clear = r.returncode == 2 and len(lines) == 1 and not (hidden and hidden in r.stderr) and kept
        out.append({"args": args.replace(str(tmp), "TMP"), "exit": r.returncode, "stderr_lines": len(lines),
                    "clear": clear, "message": (lines[-1] if lines else "")[:200].replace(str(tmp), "TMP")})

    for args in cases:
        args, hidden = args if isinstance(args, tuple) else (args, None)
        record(" ".join(map(str, args)), cli(*args, timeout=300), hidden)
    for label, args, r, kept in disk_full_sets(tmp, trained):  # the old set kept whole, the set named
        record(f"{' '.join(map(str, args))}   ({label})", r, kept=kept)
    # step-program folders through the Python API (scripts/probe_steps.py): a program of another run, names
    # a program may not have, a folder without fingerprints
    other = tmp / "other-run"  # another run of the same architecture
    for r in (cli("train", *TINY, "train.epochs=1", "train.seed=1", "--out", other),
              cli("export", trained, "--format", "torch-export", "--steps-program", "--fused", "--out", tmp / "steps"),
              cli("export", other, "--format", "torch-export", "--steps-program", "--fused", "--out", tmp / "steps-b")):
        if r.returncode != 0:
            raise SystemExit(r.stderr)
    for label, folder in step_program_bad_inputs(tmp, tmp / "steps", tmp / "steps-b"):
        record(f"(API) StepProgram(DIR), {label}", api("run", folder))
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
    crafted = {"huge-header": struct.pack("<Q", 1 << 62) + b"{}",  # a header length of 4 EiB
               "past-end": _header_past_end()}  # a tensor whose offsets lie past the end of the file
    for name, data in crafted.items():
        shutil.copytree(exported, tmp / f"exported-{name}")
        (tmp / f"exported-{name}" / "model.safetensors").write_bytes(data)
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
        ["eval", exported], *[["eval", tmp / f"exported-{name}"] for name in crafted],
        ["train", "train.epochs=!!python/object/apply:os.system ['true']", *t], ["eval", tmp / "text.pt"], ["train", "data.name=synthetic", "data.synthetic_classes=1", *t],
        ["train", "train.depth.sigma=-1", *t], ["train", "train.depth.truncate=-1", *t], ["train", "train.log_every=-1", *t],
        ["train", "model.stage_heads=-2", *t], ["train", "train.supervision.stages=100", *t],
        ["finetune", trained, "--data", "digits", "--alpha", "-1"], ["finetune", trained, "--data", "digits", "--alpha", "0"],
    ]


def lying_export_cases(tmp: Path, trained: Path) -> list:
    """An hf export whose config.json lies (an unknown data set, a zero std, model_args a string, a record or
    model_args of another image size or channel count) read by predict and eval; an export whose OUT is a
    symbolic link (to an empty folder, to a file, to nothing); model values no run can train on (a NaN,
    infinite or negative LayerScale init, a NaN dropout)."""
    from PIL import Image

    exported = tmp / "exported-57"
    r = cli("export", trained, "--format", "hf", "--out", exported)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    img = tmp / "img-57.png"
    Image.new("L", (8, 8), 3).save(img)
    lies = {"data.name nosuchdata": lambda c: c["recurvit"]["data"].update(name="nosuchdata"),
            "data.std [0]": lambda c: c["recurvit"]["data"].update(std=[0]),
            "data.in_chans 3": lambda c: c["recurvit"]["data"].update(in_chans=3),
            "data.img_size 16": lambda c: c["recurvit"]["data"].update(img_size=16),
            "model_args a string": lambda c: c.update(model_args="bvit"),
            "model_args.in_chans 3": lambda c: c["model_args"].update(in_chans=3),
            "model_args.img_size 16": lambda c: c["model_args"].update(img_size=[16, 16])}
    cases = []
    for i, (lie, edit) in enumerate(lies.items()):
        folder = tmp / f"exported-lie-{i}"
        shutil.copytree(exported, folder)
        cfg = json.loads((folder / "config.json").read_text())
        edit(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
        cases.append(["predict", folder, img])
        if lie != "data.img_size 16":  # eval reads the data set at the model's own size: a correct answer
            cases.append(["eval", folder])
    (tmp / "empty-57").mkdir()
    (tmp / "file-57").write_text("x\n")
    links = {"link-to-empty": tmp / "empty-57", "link-to-file": tmp / "file-57", "link-to-nothing": tmp / "nothing"}
    for name, target in links.items():
        (tmp / name).symlink_to(target)
    t = [*TINY, "train.epochs=1", "--out", tmp / "never-57"]
    return cases + [
        *[["export", trained, "--format", f, "--out", tmp / name] for f in ("hf", "timm") for name in links],
        ["export", trained, "--format", "torch-export", "--steps-program", "--out", tmp / "link-to-empty"],
        ["train", "model.init_values=nan", *t], ["train", "model.init_values=inf", *t],
        ["train", "model.init_values=-1", *t], ["train", "model.drop_rate=nan", *t],
    ]


FULL_DISK = """import errno
import recurvit.run.atomic as atomic
_write, _calls = atomic.atomic_write, []
def _no_space(f):
    raise OSError(errno.ENOSPC, "No space left on device")
def _full(path, write, needed=None):  # the second file of the command finds the disk full as it is written
    _calls.append(path)
    return _write(path, _no_space if len(_calls) == 2 else write, needed)
atomic.atomic_write = _full
"""


def disk_full_sets(tmp: Path, trained: Path) -> list:
    """horizon and exit run twice into one folder, the second time with the disk full at its second file
    (a sitecustomize on the subprocess's path): (label, argv, result, whether every file of the first run is
    there as it was and the line names the whole set)."""
    hook = tmp / "full-disk"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_DISK)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    out = []
    sets = [(["horizon", trained, "--steps", 2], ["horizon", trained, "--steps", 3],  # a sweep of other files
             ["horizon.csv", "horizon.png"]),
            (["exit", trained, "--time-batches", 1], ["exit", trained, "--time-batches", 1],  # (other timings)
             ["exit.csv", "exit.png", "exit.json"])]
    for command, again, names in sets:
        folder = tmp / f"set-{command[0]}"
        first = cli(*command, "--out", folder)
        if first.returncode != 0:
            raise SystemExit(first.stderr)
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        args = [*again, "--out", folder]
        r = cli(*args, env=env)
        after = {p.name: p.read_bytes() for p in folder.iterdir()}
        named = all(n in r.stderr for n in names)
        out.append((f"disk full at the second of {', '.join(names)}", args, r, before == after and named))
    return out


def _header_past_end() -> bytes:
    """A safetensors file whose one tensor (4 MB by its header) has 8 bytes of data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000000], "data_offsets": [0, 4000000]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(8)


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


def steps_kill_trials(tmp: Path, trained: Path, n: int, rng: random.Random) -> list:
    """``kill -9`` of a fused step-program export while it writes its programs (its scratch folder is there),
    then the same export: survived = it ends with exit 0 and a folder that loads, and no scratch folder of the
    export is left beside it."""
    trials = []
    for i in range(n):
        out = tmp / f"steps-{i}"
        cmd = ["export", trained, "--format", "torch-export", "--steps-program", "--fused", "--out", out]
        p = start(*cmd)
        kill_when(p, lambda: any(tmp.glob(f".{out.name}*")), rng)  # tracing into the scratch folder
        finished = p.returncode == 0
        r = cli(*cmd) if not out.exists() else None  # (a folder there is whole: it loads, or it is refused)
        ok = (r is None or r.returncode == 0) and (out / "manifest.json").is_file() and api("run", out).returncode == 0
        left = [x.name for x in tmp.glob(f".{out.name}*")]  # the killed export's scratch folder
        note = "" if ok else (r.stderr.strip().splitlines() or ["no folder"])[-1][:200] if r else "it does not load"
        trials.append({"kind": "export --steps-program --fused" + (" (finished before the kill)" if finished else ""),
                       "killed_after_epochs": "-", "survived": ok and not left,
                       "note": note + (f" left {', '.join(left)}" if left else "")})
    return trials


def report(kills, payloads, bad, out: Path) -> None:
    survived = sum(t["survived"] for t in kills)
    executed = sum(t["executed"] for t in payloads)
    clear = sum(t["clear"] for t in bad)
    lines = ["# Fault-and-bad-input probe", "", "Generated by `python scripts/probe.py`; do not edit by hand.", "",
             f"- kill -9 at a random moment, then the documented way on: **{survived} of {len(kills)}** resumed to "
             "per-epoch metrics identical to an uninterrupted run",
             "- malicious payloads (code-running pickles in every checkpoint and weights slot, object-constructing "
             "YAML tags in every YAML and override, tar escapes and pickles in CIFAR's files, links planted in a run "
             "folder, doctored step programs and manifest names leading outside their folder): "
             f"**{executed} of {len(payloads)}** executed or wrote outside the folder they came in",
             f"- bad inputs: **{clear} of {len(bad)}** gave one clear line on stderr and exit status 2", "",
             "## Kills", "", "| kind | killed after epoch | survived | note |", "|---|---|---|---|"]
    lines += [f"| {t['kind']} | {t['killed_after_epochs']} | {t['survived']} | {t['note']} |" for t in kills]
    lines += ["", "## Payloads", "", "| payload | executed or wrote outside | exit | message |", "|---|---|---|---|"]
    lines += [f"| {t['payload']} | {t['executed']} | {t['exit']} | {t['message'].replace('|', '/')} |" for t in payloads]
    lines += ["", "## Bad inputs", "", "| command | exit | stderr lines | message |", "|---|---|---|---|"]
    lines += [f"| `{'' if t['args'].startswith('(API)') else 'recurvit '}{t['args']}` | {t['exit']} | "
              f"{t['stderr_lines']} | {t['message'].replace('|', '/')} |" for t in bad]
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
        if "payloads" in parts:  # a finished one-run study and an export, for the payloads to go into
            runs["study_file"] = tmp / "study-payload.yaml"
            runs["study_file"].write_text(
                f"name: probe\nbase: {ROOT / 'configs/digits/bvit.yaml'}\n"
                f"overrides: {{{', '.join(o.replace('=', ': ') for o in TINY)}, train.epochs: 1}}\n"
                "grid:\n  train.seed: [0]\neval:\n  max_steps_factor: 1\n")
            runs["study"], runs["hf"], runs["srvit"] = tmp / "trained-study", tmp / "trained-hf", tmp / "trained-srvit"
            for r in (cli("study", runs["study_file"], "--out", runs["study"]),
                      cli("export", trained, "--format", "hf", "--out", runs["hf"]),
                      cli("train", "model.name=srvit_tiny", *TINY, "model.depth=2", "train.epochs=1", "data.holdout=0.1",
                          "--out", runs["srvit"])):
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
        for part in ("bad", "payload", "kills"):
            (tmp / part).mkdir()
        bad = bad_input_trials(tmp / "bad", trained) if "bad" in parts else []
        payloads = payload_trials(tmp / "payload", runs) if "payloads" in parts else []
        kills = kill_trials(tmp / "kills", args.kills, rng) if "kills" in parts else []
        if "kills" in parts:
            kills += export_kill_trials(tmp / "kills", trained, args.kills, rng)
            kills += steps_kill_trials(tmp / "kills", trained, args.kills, rng)
        hide = lambda rows: json.loads(json.dumps(rows).replace(str(tmp), "TMP"))  # noqa: E731
        report(hide(kills), hide(payloads), hide(bad), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

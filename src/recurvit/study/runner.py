"""Running a study: train (or resume) every grid point, evaluate it, write its ``result.json``.

A run's evaluation is recorded with the study's ``eval_spec``; when a study asks for more (a longer
horizon, another solver), finished runs are re-evaluated from their checkpoint without training.
Runs go to worker processes (``--workers N``, one thread each by default) or, with ``--launcher
submitit``, to cluster jobs (:mod:`recurvit.study.launch`); a run that fails with a user error
(diverged, bad option) is reported in the study, not fatal to it.

``run_one(..., nproc=N)`` trains a classification run data-parallel in N processes (torchrun, one GPU
each: ``recurvit train --nproc N``'s processes) and evaluates it in this process; a cluster job with
``--gpus-per-run N`` runs that way.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import UserError
from .archive import archive, archived, read_result
from .workers import estimate, in_processes
from .spec import Study



def _quiet(*args, **kwargs) -> None:
    return None


def _write_result(out: Path, res: Dict[str, Any]) -> None:
    from ..train.rundir import write_atomic

    write_atomic(out / "result.json", json.dumps(res, indent=1))


def _load_config(load: Callable, out: Path, base: str, overrides: List[str]):
    """A run's config: its own config.yaml once it exists (resolved values), else the study's."""
    return load(out / "config.yaml" if (out / "config.yaml").is_file() else base, overrides)


# ----------------------------------------------------------------------------- classification
def run_classify(base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
                 threads: Optional[int] = None) -> Dict[str, Any]:
    from ..analysis.accounting import account
    from ..analysis.horizon import horizon_sweep, summarize
    from ..config import load_config
    from ..train.checkpoint import load_model_and_config
    from ..tasks.classify import evaluate, train
    from ..train.rundir import RunDir
    from ..train.runtime import build_test_loader, pick_device
    from .plateau import plateau_change

    cfg = _load_config(load_config, out, base, overrides)
    cfg.train.progress = False
    if nproc > 1:
        metrics = _train_ddp(base, overrides, out, nproc, threads)
    else:
        metrics = train(cfg, out, resume=out.is_dir(), log=_quiet)
    t0 = time.perf_counter()
    model, cfg = load_model_and_config(out / "last.pt")
    device = pick_device(cfg.train.device)
    model.to(device)
    T = model.nominal_steps
    K = eval_spec["max_steps_factor"] * T
    if model.core.limit is not None:
        K = min(K, model.core.limit)
    test_loader, info = build_test_loader(cfg)
    sweep = horizon_sweep(model, test_loader, device, K)
    variants: Dict[str, Any] = {}
    for name, opts in eval_spec.get("variants", {}).items():
        try:
            other, _ = load_model_and_config(out / "last.pt", **opts)
        except UserError as e:
            if "does not apply" not in str(e) and "applies to" not in str(e):
                raise
            variants[name] = None  # an option this run's core does not have: not applicable
            continue
        ev = evaluate(other.to(device), test_loader, device, amp="off")  # fp32, as the sweep above
        variants[name] = {"acc_T": ev["accuracy"], "nfe": other.nfe}
    acct = account(model.cpu(), memory=False)
    mc = model.cfg
    logged = RunDir(out, created=False, owner=False).read_metrics()
    curve = [m.get("test_acc") for m in logged]
    val_curve = [m.get("val_acc") for m in logged] if any("val_acc" in m for m in logged) else None
    return {
        "model": cfg.model.name, "core": mc.core, "runs_as": mc.core_cls.describe(mc),
        "shares_blocks": mc.core_cls.shares_blocks, "embed_dim": mc.embed_dim, "depth": mc.depth, "steps": T,
        "seed": cfg.train.seed, "epochs": cfg.train.epochs, "params": acct["params"],
        "params_stored": acct["params_stored"], "flops_forward": acct["flops_forward"], "nfe": acct["nfe"],
        "chance": 1.0 / info.num_classes,
        **{k: v for k, v in summarize(sweep, T).items() if k.startswith("acc_")},
        "test_acc_final": metrics.get("test_acc"), "train_seconds": metrics.get("train_seconds"),
        "eval_seconds": time.perf_counter() - t0, "horizon_accuracy": sweep["accuracy"],
        "test_acc_curve": curve, "val_acc_curve": val_curve, "variants": variants,
        "plateau_val": plateau_change(val_curve), "plateau_test": plateau_change(curve),
    }


def _train_ddp(base: str, overrides: List[str], out: Path, nproc: int, threads: Optional[int]) -> Dict[str, Any]:
    """Train (or resume) ``out`` in ``nproc`` processes under torchrun (DDP, one GPU each when the run
    is on CUDA); returns the last metrics line. The ranks' output goes to this process's (the job's log)."""
    import subprocess

    from ..train import distributed as dist_io
    from ..train.rundir import RunDir

    resume = (out / "config.yaml").is_file()  # else: a new run (or one killed before it wrote anything)
    args = ["train", *([] if resume else [str(base)]), *overrides, "train.progress=false",
            *(["--resume", str(out)] if resume else ["--out", str(out)])]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (threads or nproc) // nproc))}
    proc = subprocess.Popen(dist_io.torchrun_command(nproc, args), env=env)
    try:
        rc = proc.wait()
    except BaseException:  # preempted (submitit's handler exits this process): stop the ranks first
        proc.terminate()  # torchrun passes it on to its workers; last.pt stays the last whole epoch's
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if rc != 0:
        raise UserError(f"recurvit train in {nproc} processes (torchrun) ended with exit status {rc}; "
                        "its own message is above in this run's log")
    rows = RunDir(out, created=False, owner=False).read_metrics()
    return rows[-1] if rows else {}


# ------------------------------------------------------------------------------------- LoopVAE
def run_vae(base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Dict[str, Any]:
    import torch

    from ..analysis.accounting import count_params, measure_flops
    from ..train.rundir import RunDir
    from ..train.runtime import pick_device
    from ..vae.config import load_vae_config
    from ..vae.data import build_vae_datasets
    from ..vae.evaluate import evaluate_vae, load_vae_run, make_test_loader
    from ..tasks.vae import train_vae

    if nproc > 1:
        raise UserError("LoopVAE runs train in one process: use one GPU per run (--gpus-per-run 1)")
    cfg = _load_config(load_vae_config, out, base, overrides)
    cfg.train.progress = False
    metrics = train_vae(cfg, out, resume=out.is_dir(), log=_quiet)
    t0 = time.perf_counter()
    model, cfg, _ = load_vae_run(out / "last.pt")  # best.pt is chosen on the test split: not for reporting
    device = pick_device(cfg.train.device)
    model.to(device)
    _, test_set, info = build_vae_datasets(cfg.data, cfg.train.seed)
    loader = make_test_loader(test_set, 64)
    ev = evaluate_vae(model, loader, device, cfg.train.amp)
    x = next(iter(loader))[:16].to(device)
    with torch.no_grad():
        model.reconstruct(x, sample=False)  # warm-up
        times = []
        for _ in range(3):
            s = time.perf_counter()
            model.reconstruct(x, sample=False)
            times.append(time.perf_counter() - s)
    flops = measure_flops(model.cpu(), tuple(x.shape[1:]), train=False)
    counts = count_params(model, block_uses=flops["block_uses"])
    curve = [m.get("test_psnr") for m in RunDir(out, created=False, owner=False).read_metrics()]
    return {
        "model": cfg.model.name, "core": model.cfg.core, "operator": model.cfg.operator, "seed": cfg.train.seed,
        "epochs": cfg.train.epochs, "params_stored": counts["params_stored"],
        "params_effective": counts["params_effective"], "flops_forward": flops["flops_forward"],
        "block_applications": model.block_applications()["total"], "psnr": ev["psnr"], "ssim": ev["ssim"],
        "out_of_range": ev["out_of_range"], "baseline_psnr": metrics.get("baseline_psnr"),
        "ms_per_img": 1000 * min(times) / len(x), "train_seconds": metrics.get("train_seconds"),
        "eval_seconds": time.perf_counter() - t0, "test_psnr_curve": curve,
    }


TASK_RUNNERS = {"classify": run_classify, "vae": run_vae}


def run_one(task: str, base: str, overrides: List[str], out: str, eval_spec: Dict[str, Any],
            labels: Dict[str, str], threads: Optional[int] = None, nproc: int = 1) -> Dict[str, Any]:
    """Train (or resume) one grid point, evaluate it and write its result.json.

    ``nproc`` > 1: train in that many processes (torchrun, DDP), evaluate here."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    out_p = Path(out)
    (out_p / "error.txt").unlink(missing_ok=True)  # of an earlier, failed attempt
    t0 = time.perf_counter()
    res = TASK_RUNNERS[task](base, overrides, out_p, eval_spec, nproc=nproc, threads=threads)
    res = {**res, "run_id": out_p.name, **labels, "overrides": overrides, "eval": eval_spec,  # labels win
           "wall_seconds": time.perf_counter() - t0}
    _write_result(out_p, res)
    return res


def run_one_safe(kw: Dict[str, Any]) -> Dict[str, Any]:
    """run_one, but a run that fails (diverged, bad option, or any crash) is reported as a failed run
    of the study, not fatal to the others."""
    try:
        return run_one(**kw)
    except Exception as e:  # noqa: BLE001  (one run's failure must not lose the study's report)
        msg = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        out = Path(kw["out"])
        if out.is_dir():
            (out / "error.txt").write_text(msg + "\n")
        return {"run_id": out.name, **kw["labels"], "error": msg}


# ------------------------------------------------------------------------------------ the study
def _is_done(rd: Path, study: Study, overrides: List[str]) -> Optional[Dict[str, Any]]:
    """The stored result of a run whose training and evaluation are what the study asks for: its run
    directory's result.json, else the copy in the study's results folder when the run directory is gone."""
    f = rd / "result.json"
    if not f.is_file():
        copy = archived(study, rd.name)
        if copy is None or not copy.is_file() or (rd / "last.pt").is_file():
            return None
        f = copy
    res = read_result(f)
    if res is None:
        return None  # unreadable: the run is evaluated again from its checkpoint (or trained, if it has none)
    res = _with_training_cost(rd, res)
    if res.get("eval", {"max_steps_factor": res.get("max_steps_factor", 4), "variants": {}}) != study.eval_spec:
        return None  # re-evaluate (the checkpoint stays; training is not repeated)
    if "overrides" in res and res["overrides"] != overrides:
        raise UserError(f"run {rd} was made with other settings than the study now asks for "
                        f"({res['overrides']} vs {overrides}); move it away or give the variant another name")
    return res


def run_dir_root(study: Study) -> Path:
    return study.runs_dir or Path("runs") / "studies" / study.name


def selected(study: Study, only: Sequence[str] = ()) -> set:
    """Ids of the runs that ``--only`` patterns (shell-style, e.g. ``'rk4__*'``) pick; all when none given."""
    ids = [r.run_id for r in study.runs]
    if not only:
        return set(ids)
    picked = {i for i in ids if any(fnmatch.fnmatchcase(i, pat) for pat in only)}
    if not picked:
        raise UserError(f"--only {' '.join(only)} matches none of the study's {len(ids)} runs "
                        f"(run ids look like {ids[0]!r})")
    return picked


def pending(study: Study, out: Path, only: Sequence[str] = ()):
    """(finished results, keyword sets of the runs still to do); ``only``: patterns of the runs to do now
    (finished runs are returned whatever they are)."""
    todo, done = [], []
    chosen = selected(study, only)
    for spec in study.runs:
        rd = out / "runs" / spec.run_id
        res = _is_done(rd, study, spec.overrides)
        if res is not None:
            done.append(res)
        elif spec.run_id in chosen:
            todo.append(dict(task=study.task, base=str(spec.base), overrides=spec.overrides, out=str(rd),
                             eval_spec=study.eval_spec, labels=spec.labels))
    return done, todo


def run_study(study: Study, out: Path, workers: int = 1, progress: bool = True, log=print,
              only: Sequence[str] = ()) -> List[Dict[str, Any]]:
    from tqdm.auto import tqdm

    from ..train.runtime import show_progress

    (out / "runs").mkdir(parents=True, exist_ok=True)
    done, todo = pending(study, out, only)
    log(f"study {study.name}: {len(study.runs)} runs, {len(done)} finished, {len(todo)} to run or evaluate "
        f"({workers} worker{'s' if workers > 1 else ''}) in {out}; results to {study.results or out}"
        + estimate(done, len(todo), workers))
    bar = tqdm(total=len(study.runs), initial=len(done), desc=study.name, disable=not show_progress(progress),
               dynamic_ncols=True)
    if workers <= 1:
        for kw in todo:
            bar.set_postfix_str(Path(kw["out"]).name)
            done.append(run_one_safe(kw))
            archive(study, done[-1])
            bar.update()
            log(f"  {_line(done[-1])}")
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        for res in in_processes(run_one_safe, todo, workers, threads):
            done.append(res)
            archive(study, done[-1])
            bar.update()
            log(f"  {_line(done[-1])}")
    bar.close()
    order = {s.run_id: i for i, s in enumerate(study.runs)}
    return sorted(done, key=lambda r: order.get(r["run_id"], 1 << 30))


def _line(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['run_id']}: failed: {r['error']}"
    figure = f"acc@T {r['acc_T']:.4f}" if "acc_T" in r else f"psnr {r.get('psnr', float('nan')):.2f} dB"
    return f"{r['run_id']}: {figure} ({r.get('wall_seconds', 0):.0f} s)"


def collect(out: Path, study: Study) -> List[Dict[str, Any]]:
    """Results of the runs that have one (for --report-only)."""
    rows = []
    for spec in study.runs:
        f = out / "runs" / spec.run_id / "result.json"
        copy = archived(study, spec.run_id)
        for path in (f, copy):
            if path is None or not path.is_file():
                continue
            res = read_result(path)
            rows.append(_with_training_cost(f.parent, res) if res is not None else
                        {"run_id": spec.run_id, **spec.labels, "error": f"{path} is not a readable result; "
                         "run the study again to evaluate the run anew"})
            break
    return rows


def _with_training_cost(rd: Path, res: Dict[str, Any]) -> Dict[str, Any]:
    """A classification result without its training time (written by an older runner, which lost it
    when it re-evaluated a run whose last.pt kept no metrics): the time logged with the last epoch."""
    if "acc_T" not in res or res.get("train_seconds") is not None or not (rd / "metrics.jsonl").is_file():
        return res
    from ..train.rundir import RunDir

    logged = RunDir(rd, created=False, owner=False).read_metrics()
    return {**res, "train_seconds": logged[-1].get("train_seconds")} if logged else res

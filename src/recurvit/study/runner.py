"""Running a study: train (or resume) every grid point, evaluate it, write its ``result.json``.

A run's evaluation is the study's evaluators (:mod:`recurvit.study.evaluators`), each recorded in
its ``result.json`` with its options; when a study asks for more (a longer horizon, another solver,
per-step analyses), a finished run runs only the evaluators it lacks, from its checkpoint, without
training.
Runs go to worker processes (``--workers N``, one thread each by default) or, with ``--launcher
submitit``, to cluster jobs (:mod:`recurvit.study.launch`); a run that fails with a user error
(diverged, bad option) is reported in the study, not fatal to it.

What a run of a task trains and reports is the task's (its view's ``run``: :mod:`.registry`);
``run_one(..., nproc=N)`` trains it data-parallel in N processes (torchrun, one GPU each:
``recurvit train --nproc N``'s processes) and evaluates it in this process; a cluster job with
``--gpus-per-run N`` runs that way.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import UserError
from ..run import lock
from ..run.atomic import write_atomic
from ..run.progress import show_progress
from .archive import archive, archived, read_result
from .evaluators import missing, recorded
from .registry import import_registrants, registrants, view_of
from .spec import Study
from .workers import estimate, in_processes


def _write_result(out: Path, res: Dict[str, Any]) -> None:
    write_atomic(out / "result.json", json.dumps(res, indent=1))


def run_one(task: str, base: str, overrides: List[str], out: str, eval_spec: Dict[str, Any],
            labels: Dict[str, str], threads: Optional[int] = None, nproc: int = 1,
            previous: Optional[Dict[str, Any]] = None, imports: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Train (or resume) one grid point, run the evaluators of ``eval_spec`` on it and write its result.json.

    ``previous``: the run's stored result, when its training is complete and only some evaluators are
    missing (``eval_spec`` then names just those; the stored figures of the others are kept).
    ``nproc`` > 1: train in that many processes (torchrun, DDP), evaluate here. ``imports``: the tasks the
    planning process added at run time (:func:`recurvit.study.registry.registrants`), for a fresh process."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    out_p = Path(out)
    (out_p / "error.txt").unlink(missing_ok=True)  # of an earlier, failed attempt
    t0 = time.perf_counter()
    import_registrants(imports)  # a fresh process (a spawned worker, a cluster job): tasks added at run time
    res = view_of(task).run(base, overrides, out_p, eval_spec, nproc=nproc, threads=threads)
    if previous is None:  # the threads it trained with: one thread and two give different float sums
        import torch

        res["train_threads"] = torch.get_num_threads()
    record = eval_spec
    if previous is not None:
        record = {**recorded(previous), **eval_spec}
        spent = (previous.get("eval_seconds") or 0.0) + (res.get("eval_seconds") or 0.0)  # both passes' cost
        res = {**{k: v for k, v in previous.items() if k not in ("eval", "wall_seconds")}, **res}
        if "eval_seconds" in res:
            res["eval_seconds"] = spent
    res = {**res, "run_id": out_p.name, **labels, "overrides": overrides, "eval": record,  # labels win
           "wall_seconds": time.perf_counter() - t0 + (previous or {}).get("wall_seconds", 0.0)}
    _write_result(out_p, res)
    return res


def claim_path(out: Path) -> Path:
    """The lock a worker holds on a run (``<study>/runs/<id>``) for the whole of its training, evaluation and
    result: ``<study>/.claims/<id>.lock`` (not in the run directory: its own lock covers the training only,
    and a file in a run directory not yet made would stop it being created)."""
    return out.parent.parent / ".claims" / f"{out.name}.lock"


def run_one_safe(kw: Dict[str, Any]) -> Dict[str, Any]:
    """run_one under the run's claim; a run that fails (diverged, bad option, or any crash) is reported
    as a failed run of the study, not fatal to the others. A run another worker claims (``--join``, a
    second node on the same disk) is not touched: ``{"run_id", ..., "held": its pid}``; one that another
    worker finished since the list of runs to do was made is its stored result."""
    out = Path(kw["out"])
    try:
        claim_path(out).parent.mkdir(parents=True, exist_ok=True)
        fd = lock.acquire(claim_path(out))
    except lock.Busy as e:
        return {"run_id": out.name, **kw["labels"], "held": e.pid}
    except (OSError, UserError) as e:
        return _failed(kw, e)
    try:
        res = read_result(out / "result.json") if (out / "result.json").is_file() else None
        if res is not None and res.get("overrides") == kw["overrides"] and not missing(kw["eval_spec"], res):
            return res  # finished by another worker in the meantime
        return _run_one_reported(kw)
    finally:
        lock.release(fd)


def _run_one_reported(kw: Dict[str, Any]) -> Dict[str, Any]:
    try:
        return run_one(**kw)
    except Exception as e:  # noqa: BLE001  (one run's failure must not lose the study's report)
        return _failed(kw, e)


def _failed(kw: Dict[str, Any], e: BaseException) -> Dict[str, Any]:
    msg = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    out = Path(kw["out"])
    if out.is_dir():
        (out / "error.txt").write_text(msg + "\n")
    return {"run_id": out.name, **kw["labels"], "error": msg}


# ------------------------------------------------------------------------------------ the study
def _stored(rd: Path, study: Study, overrides: List[str]) -> Optional[Dict[str, Any]]:
    """The stored result of a run: its run directory's result.json, else the copy in the study's results
    folder when the run directory is gone (None: none, or unreadable, so the run is evaluated again from
    its checkpoint, or trained if it has none)."""
    f = rd / "result.json"
    if not f.is_file():
        copy = archived(study, rd.name)
        if copy is None or not copy.is_file() or (rd / "last.pt").is_file():
            return None
        f = copy
    res = read_result(f)
    if res is None:
        return None
    if "overrides" in res and res["overrides"] != overrides:
        raise UserError(f"run {rd} was made with other settings than the study now asks for "
                        f"({res['overrides']} vs {overrides}); move it away or give the variant another name")
    return res


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
        asked = study.eval_for(spec.labels)
        res = _stored(rd, study, spec.overrides)
        lacking = missing(asked, res) if res is not None and "error" not in res else asked
        if res is not None and not lacking:
            done.append(res)
        elif spec.run_id in chosen:
            # a finished run that lacks evaluators: only those run, on its checkpoint (nothing is trained)
            previous = res if res is not None and (rd / "last.pt").is_file() else None
            todo.append(dict(task=study.task, base=str(spec.base), overrides=spec.overrides, out=str(rd),
                             eval_spec=lacking if previous is not None else asked, labels=spec.labels,
                             previous=previous, imports=registrants()))
        elif res is not None:
            done.append(res)  # not chosen by --only: reported with what it has
    return done, todo


def run_study(study: Study, out: Path, workers: int = 1, progress: bool = True, log=print,
              only: Sequence[str] = ()) -> List[Dict[str, Any]]:
    from tqdm.auto import tqdm

    (out / "runs").mkdir(parents=True, exist_ok=True)
    done, todo = pending(study, out, only)
    evaluate_only = sum(kw.get("previous") is not None for kw in todo)
    log(f"study {study.name}: {len(study.runs)} runs, {len(done)} finished, {len(todo)} to run or evaluate "
        + (f"({evaluate_only} only to evaluate) " if evaluate_only else "")
        + f"({workers} worker{'s' if workers > 1 else ''}) in {out}; results to {study.results or out}"
        + estimate(done, [kw for kw in todo if kw.get("previous") is None], workers))
    bar = tqdm(total=len(study.runs), initial=len(done), desc=study.name, disable=not show_progress(progress),
               dynamic_ncols=True)
    held: List[str] = []
    if workers <= 1:
        for kw in todo:
            bar.set_postfix_str(Path(kw["out"]).name)
            take(study, run_one_safe(kw), done, held, log)
            bar.update()
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        for res in in_processes(run_one_safe, todo, workers, threads):
            take(study, res, done, held, log)
            bar.update()
    bar.close()
    done += finished_elsewhere(study, out, held, log)
    order = {s.run_id: i for i, s in enumerate(study.runs)}
    return sorted(done, key=lambda r: order.get(r["run_id"], 1 << 30))


def take(study: Study, res: Dict[str, Any], done: List[Dict[str, Any]], held: List[str], log=print) -> None:
    """A worker's answer: a finished or failed run joins ``done`` (a finished one is kept in the results
    folder); a run another worker holds joins ``held`` (see :func:`finished_elsewhere`)."""
    if "held" in res:
        held.append(res["run_id"])
        log(f"  {res['run_id']}: another worker holds it (pid {res['held']}); left to that worker")
        return
    stored = kept_result(study, res)
    if stored is not None:  # a finished run evaluated again, and the new evaluation failed: its result stays
        done.append(stored)
        log(f"  {res['run_id']}: evaluating it again failed ({res['error']}); its stored result stays in the "
            "report (the evaluators it lacks are asked again next time)")
        return
    done.append(res)
    archive(study, res)
    log(f"  {_line(res)}")


def kept_result(study: Study, res: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """For a failed run, the result the study's results folder keeps for it (None: it has none, or ``res`` did
    not fail): a run evaluated again on a machine that lacks its data must not turn its committed row into a
    failure."""
    if "error" not in res:
        return None
    copy = archived(study, res.get("run_id", ""))
    if copy is None or not copy.is_file():
        return None
    try:
        return read_result(copy)
    except UserError:  # an earlier recurvit's result: the failure is what to report
        return None


def finished_elsewhere(study: Study, out: Path, held: Sequence[str], log=print) -> List[Dict[str, Any]]:
    """The results of the runs ``held`` by other workers that those finished by now."""
    specs = {s.run_id: s for s in study.runs}
    found = []
    for run_id in held:
        spec = specs[run_id]
        res = _stored(out / "runs" / run_id, study, spec.overrides)
        if res is not None and not missing(study.eval_for(spec.labels), res):
            found.append(res)
    if len(found) < len(held):
        log(f"{len(held) - len(found)} run(s) still held by other workers: this report names them as not run "
            "yet; the last worker to end (`--join`) or `--report-only` then writes the whole report")
    return found


def _line(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['run_id']}: failed: {r['error']}"
    figure = (f"acc@T {r['acc_T']:.4f}" if "acc_T" in r else f"val solved {r['val_solved']:.4f}" if "val_solved" in r
              else f"psnr {r.get('psnr', float('nan')):.2f} dB")
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
            rows.append(res if res is not None else
                        {"run_id": spec.run_id, **spec.labels, "error": f"{path} is not a readable result; "
                         "run the study again to evaluate the run anew"})
            break
    return rows


"""The walk of the run config (or of the task) through the package: which files a `recurvit train` run
passes its config (or a part of it, nested or flattened) through, from the command line to the model's first
forward; with ``--follow task``, which files the whole run passes its Task object through.

    python scripts/config_walk.py                 # the default run (digits bViT)
    python scripts/config_walk.py -- model.core=ode data.name=mazes ...   # any train overrides
    python scripts/config_walk.py --verbose       # every stay, in order
    python scripts/config_walk.py --follow task -- train.epochs=1   # the task's walk through the loop
    python scripts/config_walk.py --follow task --resume RUN -- train.epochs=3   # a resume of (a copy of) RUN

A *stay* is a stretch of consecutive calls into one file (a *room*) that receive the config or a part of
it; a *return* is a stay in a room the walk has already left. Few rooms and few returns: a reader follows
a parameter without leaving and re-entering the same file. Measured with a profiler hook on Python calls
(``sys.setprofile``): a call counts when one of its arguments is a config section (a dataclass of
``recurvit.config`` or ``recurvit.model_fields``, or an OmegaConf node), or a dict holding the model's
``steps``. With ``--follow task`` a call counts when one of its arguments (``self`` included) is the run's
task (a :class:`recurvit.tasks.base.Task`), and the walk follows the whole command: the task's own methods,
the loop that calls them and every helper it is handed to.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "recurvit"
sys.path.insert(0, str(ROOT / "src"))


def carries_config(value, holders: bool = False) -> bool:
    mod = type(value).__module__ or ""
    if mod.startswith(("recurvit.config", "recurvit.model_fields", "omegaconf")):
        return True
    if holders and mod.startswith("recurvit.") and carries_config(getattr(value, "cfg", None)):
        return True  # an object that holds the config (a task, a run directory): its methods read it too
    return isinstance(value, dict) and "steps" in value


def carries_task(value) -> bool:
    from recurvit.tasks.base import Task

    return isinstance(value, Task)


def walk(argv, holders: bool = False, to_end: bool = False, carries=None) -> list:
    """(file, function) of every call that receives the config (or what ``carries(value)`` accepts), in order of
    their first call, up to the model's first forward (or to the end of the command): a function called again
    (each batch) is read once."""
    from recurvit.cli import main

    carries = carries or (lambda value: carries_config(value, holders))

    calls, seen = [], set()

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not to_end and code.co_name == "forward" and code.co_filename.startswith(str(SRC)):
            sys.setprofile(None)
            raise _Done
        if not code.co_filename.startswith(str(SRC)):
            return
        args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        key = (str(Path(code.co_filename).relative_to(SRC)), getattr(code, "co_qualname", code.co_name))  # 3.11+
        if key not in seen and any(carries(a) for a in args):
            seen.add(key)
            calls.append(key)

    sys.setprofile(hook)
    try:
        main(argv)
    except _Done:
        pass
    finally:
        sys.setprofile(None)
    return calls


class _Done(BaseException):
    pass


def summarize(calls) -> dict:
    stays, seen, returns = [], set(), 0
    for path, fn in calls:
        if stays and stays[-1][0] == path:
            stays[-1][1].append(fn)
            continue
        returns += path in seen
        seen.add(path)
        stays.append((path, [fn]))
    return {"stays": stays, "rooms": len(seen), "returns": returns}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--holders", action="store_true",
                   help="also count calls that receive an object holding the config as .cfg (a task's methods)")
    p.add_argument("--to-end", action="store_true",
                   help="follow the whole command (train it: give train.epochs=1), not only up to the first forward")
    p.add_argument("--follow", choices=("config", "task"), default="config",
                   help="what to follow: the run config (default) or the task, through the whole command "
                        "(give train.epochs=1)")
    p.add_argument("--resume", metavar="RUN", help="walk a resume of a copy of run directory RUN (give train.epochs "
                                                   "past its last epoch)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.resume and not os.path.isdir(args.resume):
        p.error(f"--resume {args.resume}: not a run directory")
    task = args.follow == "task"
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        if args.resume:
            shutil.copytree(args.resume, run)
        train = ["train", "--resume", run, *args.overrides] if args.resume else ["train", *args.overrides, "--out", run]
        calls = walk(train, args.holders, args.to_end or task, carries_task if task else None)
    s = summarize(calls)
    if args.verbose:
        for path, fns in s["stays"]:
            print(f"  {path}: {', '.join(dict.fromkeys(fns))}")
    print(f"{len(s['stays'])} stays in {s['rooms']} rooms, {s['returns']} returns ({len(calls)} functions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

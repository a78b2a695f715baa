"""The walk of the run config through the package: which files a `recurvit train` run passes its config
(or a part of it, nested or flattened) through, from the command line to the model's first forward.

    python scripts/config_walk.py                 # the default run (digits bViT)
    python scripts/config_walk.py -- model.core=ode data.name=mazes ...   # any train overrides
    python scripts/config_walk.py --verbose       # every stay, in order

A *stay* is a stretch of consecutive calls into one file (a *room*) that receive the config or a part of
it; a *return* is a stay in a room the walk has already left. Few rooms and few returns: a reader follows
a parameter without leaving and re-entering the same file. Measured with a profiler hook on Python calls
(``sys.setprofile``): a call counts when one of its arguments is a config section (a dataclass of
``recurvit.config`` or ``recurvit.model_fields``, or an OmegaConf node), or a dict holding the model's
``steps``.
"""
from __future__ import annotations

import argparse
import os
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


def walk(argv, holders: bool = False, to_end: bool = False) -> list:
    """(file, function) of every call that receives the config, in order of their first call, up to the
    model's first forward (or to the end of the command): a function called again (each batch) is read once."""
    from recurvit.cli import main

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
        if key not in seen and any(carries_config(a, holders) for a in args):
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
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        calls = walk(["train", *args.overrides, "--out", os.path.join(tmp, "run")], args.holders, args.to_end)
    s = summarize(calls)
    if args.verbose:
        for path, fns in s["stays"]:
            print(f"  {path}: {', '.join(dict.fromkeys(fns))}")
    print(f"{len(s['stays'])} stays in {s['rooms']} rooms, {s['returns']} returns ({len(calls)} functions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

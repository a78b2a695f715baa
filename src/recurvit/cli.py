"""Command line: ``recurvit <command> ...``. Each command lives in ``recurvit/commands/<name>.py``
with ``add_parser(subparsers)`` and ``run(args) -> int``.

Errors a user can cause (UserError) end with one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional

from . import __version__
from .errors import UserError

COMMANDS = ["train", "eval", "horizon", "flops", "match", "study", "mixture", "vae", "analyze", "finetune", "exit", "predict", "export", "configs"]


class _Help(argparse.HelpFormatter):
    """Every option's help ends with its default (unless it has none worth saying: None / False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and "%(default)" not in text and "(default" not in text
                and action.default not in (None, False)
                and action.default is not argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):  # one example a line, as written
            return "\n".join(indent + ln for ln in text.splitlines())
        return super()._fill_text(text, width, indent)


EXAMPLES = {  # shown at the end of each command's --help
    "train": ["recurvit train", "recurvit train digits/vit train.epochs=5",
              "recurvit train configs/fashion_mnist/crossroads/naive.yaml train.epochs=30 data.holdout=0.1",
              "recurvit train --resume runs/digits-bvit_tiny-20261201-120000 train.epochs=60"],
    "eval": ["recurvit eval RUN --steps 24", "recurvit eval ODE_RUN method=rk4 refine=2"],
    "horizon": ["recurvit horizon RUN --steps 96 --out horizon/"],
    "flops": ["recurvit flops bvit_base", "recurvit flops bvit_tiny steps=24 --batch-size 64"],
    "match": ["recurvit match bvit_tiny --by params"],
    "study": ["recurvit study studies/fashion_plateau.yaml --workers 2",
              "recurvit study studies/fashion_plateau.yaml --report-only"],
    "mixture": ["recurvit mixture SRVIT_RUN --examples 8"],
    "vae": ["recurvit vae train configs/vae/digits.yaml", "recurvit vae eval RUN"],
    "analyze": ["recurvit analyze RUN --steps 12"],
    "finetune": ["recurvit finetune RUN --data fashion_mnist --method step_lora --rank 4 train.epochs=5",
                 "recurvit finetune --resume FT_RUN"],
    "exit": ["recurvit exit RUN --steps 24"],
    "predict": ["recurvit predict RUN my_images/ --topk 3 --csv predictions.csv"],
    "configs": ["recurvit configs", "recurvit configs --json"],
    "export": ["recurvit export RUN --format hf --out exported/", "recurvit export RUN --format onnx --out model.onnx"],
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's own usage errors: one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


RESUMABLE = {"train": "recurvit train --resume RUN_DIR", "study": "the same recurvit study command",
             "vae": "recurvit vae train --resume RUN_DIR", "finetune": "recurvit finetune --resume RUN_DIR"}  # commands whose interrupted work can continue


def _resume_hint(command: str) -> str:
    """How to continue an interrupted command, naming the run directory it had opened (none opened: nothing
    to continue, for a command that works in one)."""
    again = RESUMABLE.get(command)
    if not again or "RUN_DIR" not in again:
        return f"; continue with {again}" if again else ""
    rundir = sys.modules.get("recurvit.run.rundir")
    run = getattr(getattr(rundir, "RunDir", None), "current", None)
    return f"; continue with {again.replace('RUN_DIR', shlex.quote(str(run)))}" if run else ""


def printable(text: str) -> str:
    """``text`` with every character that is not printable (an ANSI escape, a newline inside a path) written
    as its Python escape, so a message stays one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (``recurvit predict ... | head``): no traceback, and nothing more written
    (stdout goes to /dev/null, so Python's flush at exit fails silently too); the exit status is 141, a
    process ended by SIGPIPE, as ``yes | head`` gives."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="recurvit", description="Recurrent-depth vision transformers: train, evaluate, study.")
    parser.add_argument("--version", action="version", version=f"recurvit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        mod = importlib.import_module(f"recurvit.commands.{name}")
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
        if name in EXAMPLES and not p.epilog:
            p.epilog = "examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES[name])
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if len(extra) == 1 and getattr(args, "out_positional", "-") is None and not extra[0].startswith("-"):
        args.out_positional = Path(extra[0])  # `export RUN --format hf OUT`: the old positional OUT after an option
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"error: {printable(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except OSError as e:  # after BrokenPipeError, an OSError too
        if e.errno != errno.ENAMETOOLONG:  # a path a user gave (--out, data.root, an image) longer than the OS takes
            raise
        name = printable(str(e.filename or ""))
        print(f"error: a path is too long for this file system ({len(name):,} characters: "
              f"{name[:60]}{'...' if len(name) > 60 else ''}); choose a shorter one", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted" + _resume_hint(args.command), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

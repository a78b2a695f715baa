"""One module per CLI command: ``add_parser(subparsers)`` and ``run(args)``."""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import UserError


def deprecated(old: str, new: str) -> None:
    """The one-line note for a spelling kept for one release (docs/cli.md lists them)."""
    print(f"recurvit: {old} is deprecated and will go in the next release; use {new}", file=sys.stderr)


class DeprecatedOption(argparse.Action):
    """An old option spelling: stores into the new option's ``dest`` and prints the one-line note.
    ``p.add_argument("--max-steps", dest="steps", type=int, action=DeprecatedOption, new="--steps")``"""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        deprecated(option_string, self.new)
        setattr(namespace, self.dest, values)


def add_out_arg(p, help: str, positional: str = "") -> None:
    """``--out PATH``; ``positional``: the name of an old positional OUT still accepted (see :func:`out_of`)."""
    p.add_argument("--out", type=Path, help=help)
    if positional:
        p.add_argument(positional, nargs="?", type=Path, help=argparse.SUPPRESS)


def out_of(args, positional: str = "out_positional", required: bool = True) -> Optional[Path]:
    """``--out``, or the deprecated positional OUT (with its note); both, or neither when ``required``, is an error."""
    old = getattr(args, positional, None)
    if old is not None:
        if args.out is not None:
            raise UserError(f"give the output once: --out {args.out} or the (deprecated) positional {old}, not both")
        deprecated("a positional OUT", f"--out {old}")
        args.out = old
    if required and args.out is None:
        raise UserError("say where to write: --out PATH")
    return args.out


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


def parse_overrides(items: List[str]) -> Dict[str, object]:
    """``["steps=6", "img_size=32"]`` -> ``{"steps": 6, "img_size": 32}`` (values typed as YAML)."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"'{item}' is not of the form key=value (e.g. steps=6)")
        try:
            out[key.removeprefix("model.")] = yaml.safe_load(value)
        except yaml.YAMLError as e:  # e.g. a !!python tag: nothing is constructed, and it is one line
            raise UserError(f"'{item}': the value is not plain YAML ({str(e).splitlines()[0]})") from None
    return out


def add_device_arg(p) -> None:
    """``--device``, with the one default rule of every command: CUDA when present, else the CPU."""
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")


def add_force_arg(p) -> None:
    """``--force``: run even when the time / memory estimate (analysis/budget.py) says it will not fit."""
    p.add_argument("--force", action="store_true", help="run even when the time or memory estimate is far beyond "
                                                       "this machine")


def add_run_args(p, what: str = "run directory or checkpoint") -> None:
    """RUN, ``--data-root``, ``--force`` and ``--device``: what every command that reads a trained run takes."""
    p.add_argument("run", type=Path, help=what)
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_force_arg(p)
    add_device_arg(p)


def load_trained(path, **options):
    """:func:`recurvit.run.load.load` of a run directory, checkpoint or exported model."""
    from ..run.load import load

    return load(path, **options)


def open_trained(args, loaded=None, **options):
    """:func:`recurvit.analysis.trained.open_classifier` of RUN with ``--device`` and ``--data-root``: (model on
    its device, config, device, test loader, data info). ``loaded``: the run as :func:`load_trained` read it."""
    from ..analysis.trained import open_classifier

    return open_classifier(args.run, args.device, getattr(args, "data_root", None), loaded, **options)


def check_cost(model, loader, device, steps: int, batches: int, args) -> None:
    """The time / memory estimate of ``batches`` batches at ``steps`` steps (``--force`` overrides)."""
    from ..analysis.budget import check_loader_cost

    check_loader_cost(model, loader, device, steps, batches, force=args.force)


def fmt_int(n) -> str:
    return "-" if n is None else f"{n:,}"


def config_and_overrides(items: List[str]):
    """``[CONFIG.yaml] [key=value ...]`` -> (config path or None, overrides)."""
    config = [a for a in items if "=" not in a]
    overrides = [a for a in items if "=" in a]
    if len(config) > 1:
        raise UserError(f"expected at most one config file, got {', '.join(config)}")
    return (config[0] if config else None), overrides


def comma_ints(text: str, what: str, minimum: int = 0) -> List[int]:
    """``"1,2"`` -> ``[1, 2]``: the integers (each >= ``minimum``) of option ``what``, one line if not."""
    try:
        vals = [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < minimum:
        raise UserError(f"{what} must be integers >= {minimum}, got '{text}'")
    return vals


def comma_floats(text: str, what: str) -> List[float]:
    """``"0,0.5"`` -> ``[0.0, 0.5]``: the numbers of option ``what``, one line if not."""
    try:
        return [float(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        raise UserError(f"{what} must be comma-separated numbers, got '{text}'") from None


def load_run_config(args, load, default_path: str):
    """The config of a new run (CONFIG or the default, with overrides) or of ``--resume RUN_DIR``."""
    config, overrides = config_and_overrides(args.args)
    if args.resume is None:
        return load(config or default_path, overrides)
    if not args.resume.is_dir():
        raise UserError(f"cannot resume: {args.resume} is not a run directory")
    if not (args.resume / "config.yaml").is_file():  # stopped before it wrote anything: starts afresh
        from ..run.rundir import LEFTOVERS

        foreign = sorted(p.name for p in args.resume.iterdir() if p.name not in LEFTOVERS and not p.name.endswith(".tmp"))
        if foreign:
            raise UserError(f"cannot resume: {args.resume} has no config.yaml and holds {', '.join(foreign[:3])}: "
                            "it is not a run directory")
        if config is None:  # never the default config under the run's name
            from ..run.rundir import RunDir

            RunDir.resume(args.resume).release()  # a run still going is "in use", not "without a config"
            raise UserError(f"cannot resume {args.resume}: it stopped before it wrote its config.yaml, so its "
                            f"settings are unknown; start it again with its original command and --out {args.resume}")
        return load(config, overrides)
    if config is not None:
        raise UserError("--resume reads the run's own config.yaml; give only key=value overrides with it")
    return load(args.resume / "config.yaml", overrides)


def launch_processes(args, cfg, out, command: List[str]) -> int:
    """``recurvit <command> --nproc N``: check what can be checked here (batch split, devices, the run
    directory), then run the command in N processes under torchrun; returns its exit status."""
    from ..run import distributed as dist_io
    from ..run.rundir import check_available, default_run_dir

    dist_io.per_rank_batch(cfg.train.batch_size, args.nproc)
    dist_io.check_devices(cfg.train.device, args.nproc)
    if args.resume is not None:
        check_available(args.resume, resume=True)
        argv = [*command, "--resume", str(args.resume)]
    else:
        out = out or default_run_dir(cfg)  # fixed here, so every rank agrees on it
        check_available(out, resume=False)
        argv = [*command, "--out", str(out)]
    argv += list(args.args) + (["--json"] if args.json else [])
    return dist_io.launch(args.nproc, argv)

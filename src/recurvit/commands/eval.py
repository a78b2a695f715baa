"""recurvit eval RUN [option=value ...] [--steps K] [--json]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import add_device_arg, add_force_arg, check_cost, load_trained, open_trained, parse_overrides, print_json


def add_parser(sub):
    p = sub.add_parser("eval", help="evaluate a trained run on its test set",
                       description="Test accuracy and loss of a run at its trained depth or any --steps. Core options "
                                   "given as option=value change how the trained weights run, e.g. an ODE run with "
                                   "another solver (method=rk4) or a finer step over the same span (refine=2: h/2).")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("options", nargs="*", metavar="option=value",
                   help="core options to evaluate with (ODE: method, refine, rtol, atol); others are an error")
    p.add_argument("--steps", type=int, help="steps to run (default: the trained depth)")
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_force_arg(p)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(args) -> int:
    from ..data.datasets import dense_target
    from ..tasks.classify.task import evaluate

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    options = parse_overrides(args.options)
    other = sorted(k for k in options if "." in k)  # data.name=..., train.amp=...: not how the weights run
    if other:
        raise UserError(f"{', '.join(other)}: eval takes core options (e.g. method=rk4, refine=2) that change how "
                        "the trained weights run; the run's data and training settings are its own (--data-root "
                        "moves its data)")
    loaded = load_trained(args.run, **options)
    if dense_target(loaded.config.data.name):  # per-pixel logits: accuracy over images means nothing here
        raise UserError(f"{args.run} is a {loaded.config.data.name} run (a class for every pixel); eval reports a "
                        f"classifier's accuracy: `recurvit horizon {args.run}` reports its mazes solved at every size")
    model, cfg, device, test_loader, _ = open_trained(args, loaded)
    steps = args.steps or model.nominal_steps
    try:
        check_cost(model, test_loader, device, steps, len(test_loader), args)
        res = evaluate(model, test_loader, device, steps=steps, amp=cfg.train.amp, progress=not args.json)
    except ValueError as e:
        raise UserError(str(e)) from None
    mc = model.cfg
    out = {"run": str(args.run), "model": cfg.model.name, "core": mc.core, "runs_as": mc.core_cls.describe(mc),
           "options": options, "steps": steps, "trained_steps": model.nominal_steps, "accuracy": res["accuracy"],
           "loss": res["loss"], "n": res["n"], "nfe": model.nfe}
    if args.json:
        print_json(out)
    else:
        print(f"{out['model']} ({out['runs_as']}) steps {steps}  nfe {out['nfe']}  accuracy {res['accuracy']:.4f}  "
              f"loss {res['loss']:.4f}  (n={res['n']})")
    return 0

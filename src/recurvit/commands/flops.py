"""recurvit flops MODEL [key=value ...] [--batch-size B] [--steps K] [--json]"""
from __future__ import annotations

from ..errors import UserError
from . import add_device_arg, add_force_arg, fmt_int, parse_overrides, print_json


def add_parser(sub):
    p = sub.add_parser("flops", help="params, FLOPs and training memory of a model",
                       description="Parameters (total / stored), parameter bytes, forward and training FLOPs per "
                                   "image (torch.utils.flop_counter), NFE and measured peak training memory.")
    p.add_argument("model", help="preset name (see `recurvit flops --list`)", nargs="?")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model options, e.g. img_size=32 patch_size=4 steps=6")
    p.add_argument("--batch-size", type=int, default=8, help="batch size of the memory measurement (default 8)")
    p.add_argument("--steps", type=int, help="run the forward at this many steps instead of the trained depth")
    add_force_arg(p)
    add_device_arg(p)
    p.add_argument("--no-memory", action="store_true", help="skip the training-memory measurement")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(args) -> int:
    from ..analysis.accounting import account_preset
    from ..models import list_models
    from ..run.device import pick_device

    if args.list or not args.model:
        print("\n".join(list_models()))
        return 0 if args.list else 2
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    device = pick_device(args.device)
    res = account_preset(args.model, parse_overrides(args.overrides), device, args.batch_size,
                         memory=not args.no_memory, steps=args.steps, force=args.force)
    if args.json:
        print_json(res)
        return 0
    rows = [("params", fmt_int(res["params"])), ("params_stored", fmt_int(res["params_stored"])),
            ("params_effective", fmt_int(res.get("params_effective"))),
            ("params_core (router, step cond.)", fmt_int(res.get("params_core"))),
            ("param_bytes", fmt_int(res["param_bytes"])),
            ("flops_forward / img", fmt_int(res["flops_forward"])), ("flops_train / img", fmt_int(res["flops_train"])),
            ("flops_analytic", fmt_int(res.get("flops_analytic"))), ("flops_core / img", fmt_int(res.get("flops_core"))),
            ("nfe", fmt_int(res["nfe"])),
            (f"peak_train_bytes (batch {args.batch_size})", fmt_int(res["peak_train_bytes"])),
            ("steps", str(res.get("steps")))]
    print(f"{res['model']} ({res.get('runs_as') or res.get('core')})")
    for k, v in rows:
        print(f"  {k:<34}{v:>18}")
    return 0

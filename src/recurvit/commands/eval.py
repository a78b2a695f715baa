"""recurvit eval RUN_DIR_OR_CHECKPOINT [--steps K] [--method M] [--json]"""
from __future__ import annotations

from pathlib import Path

from . import print_json


def add_parser(sub):
    p = sub.add_parser("eval", help="evaluate a trained run on its test set")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("--steps", type=int, help="recursion steps (default: the trained depth)")
    p.add_argument("--method", help="ODE models: evaluate with another solver (euler, midpoint, rk4, dopri5, ...)")
    p.add_argument("--data-root", help="override data.root (data moved since training)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")
    return p


def run(args) -> int:
    from ..errors import UserError
    from ..train.checkpoint import load_model_and_config
    from ..train.loop import build_loaders, evaluate, pick_device

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    overrides = {"method": args.method} if args.method else {}
    model, cfg = load_model_and_config(args.run, **overrides)
    if args.method and model.cfg.core != "ode":
        raise UserError(f"--method applies to ODE models; {args.run} has a {model.cfg.core} core")
    if args.data_root:
        cfg.data.root = args.data_root
    device = pick_device(args.device)
    model.to(device)
    _, test_loader, _ = build_loaders(cfg)
    steps = args.steps or model.nominal_steps
    try:
        res = evaluate(model, test_loader, device, steps=steps, amp=cfg.train.amp)
    except ValueError as e:
        raise UserError(str(e)) from None
    out = {"run": str(args.run), "model": cfg.model.name, "core": model.cfg.core, "steps": steps,
           "trained_steps": model.nominal_steps, "accuracy": res["accuracy"], "loss": res["loss"], "n": res["n"],
           "nfe": model.nfe}
    if model.cfg.core == "ode":
        out["method"] = model.cfg.method
    if args.json:
        print_json(out)
    else:
        extra = f"  method {out['method']}  nfe {out['nfe']}" if "method" in out else ""
        print(f"{out['model']} steps {steps}{extra}  accuracy {res['accuracy']:.4f}  loss {res['loss']:.4f}  (n={res['n']})")
    return 0

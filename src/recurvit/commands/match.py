"""recurvit match MODEL [key=value ...] --by flops|params|both [--json]"""
from __future__ import annotations

from . import fmt_int, parse_overrides, print_json


def add_parser(sub):
    p = sub.add_parser("match", help="the standard/recurrent partner at matched FLOPs or parameters",
                       description="For a recurrent model: the stacked ViT with matched FLOPs (same width, depth = "
                                   "block applications) and with matched stored parameters (within --tol). For a "
                                   "ViT: its recurrent partners.")
    p.add_argument("model", help="preset name (see `recurvit flops --list`)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model options, e.g. steps=6 embed_dim=64")
    p.add_argument("--by", choices=["flops", "params", "both"], default="both",
                   help="budget to match: forward FLOPs per image, stored parameters, or both (default)")
    p.add_argument("--tol", type=float, default=0.10, help="params matching tolerance (default 0.10)")
    p.add_argument("--prefer", choices=["depth", "closest"], default="depth",
                   help="params matching: same sequential depth first (default) or closest count")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _row(d):
    ov = " ".join(f"{k}={v}" for k, v in sorted(d["overrides"].items()))
    return (f"  {d['name']:<12} D={d['embed_dim']:<4} depth={d['depth']:<3} steps={d['steps']:<3} "
            f"params={fmt_int(d['params_stored']):>12}  flops={fmt_int(d['flops_forward']):>16}   {ov}")


def run(args) -> int:
    from ..analysis.matching import match

    res = match(args.model, by=args.by, tol=args.tol, prefer=args.prefer, **parse_overrides(args.overrides))
    if args.json:
        print_json(res)
        return 0
    results = res if args.by == "both" else {args.by: res}
    first = next(iter(results.values()))
    print("model")
    print(_row(first["model"]))
    for by, r in results.items():
        print(f"matched {by}: params x{r['params_ratio']:.3f}, flops x{r['flops_ratio']:.3f}")
        print(_row(r["partner"]))
    return 0

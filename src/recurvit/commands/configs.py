"""recurvit configs [--json]: the packaged configs, by name (``recurvit train NAME`` trains one)."""
from __future__ import annotations

from ..config_names import config_names, describe, packaged_root
from . import print_json


def add_parser(sub):
    p = sub.add_parser("configs", help="list the packaged configs (train one with: recurvit train NAME)",
                       description="List the configs packaged with recurvit. Any command that takes a config "
                                   "takes its name (digits/bvit) or a path to a YAML file, from any folder.")
    p.add_argument("--json", action="store_true", help="print name, command and summary of each as JSON")
    return p


def run(args) -> int:
    rows = [{"name": n, **dict(zip(("command", "summary"), describe(n)))} for n in config_names()]
    if args.json:
        print_json({"root": str(packaged_root()), "configs": rows})
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['summary']}")
    print(f"\n{len(rows)} configs in {packaged_root()}; train one with: recurvit train NAME [key=value ...] (vae/*: recurvit vae train NAME)")
    return 0

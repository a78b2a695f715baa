"""One module per CLI command: ``add_parser(subparsers)`` and ``run(args)``."""
import json
import sys
from typing import Dict, List

from ..errors import UserError


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
        out[key.removeprefix("model.")] = yaml.safe_load(value)
    return out


def fmt_int(n) -> str:
    return "-" if n is None else f"{n:,}"

"""One module per CLI command: ``add_parser(subparsers)`` and ``run(args)``."""
import json
import sys


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")

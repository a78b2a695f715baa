"""Commands are thin: a module in recurvit/commands/ parses its arguments, calls the library and prints, so no
function there is long and no module holds much more than its parser and its printout."""
import ast
from pathlib import Path

import pytest

COMMANDS = Path(__file__).resolve().parents[2] / "src" / "recurvit" / "commands"
MAX_FUNCTION = 40  # lines of one function, decorators and docstring included
MAX_MODULE = 150  # lines of one command module

# modules allowed more lines, with the reason
LONGER = {
    "vae.py": (230, "four subcommands (train, eval, intervene, profile), each with its own parser and printout"),
    "__init__.py": (200, "the argument-parsing helpers every command shares"),
}
def _modules():
    return [p.name for p in sorted(COMMANDS.glob("*.py"))]


def _long_functions(path: Path):
    tree = ast.parse(path.read_text())
    return {f"{node.name} (line {node.lineno})": n for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1)
            > MAX_FUNCTION}


@pytest.mark.parametrize("name", _modules())
def test_no_command_function_is_long(name):
    long = _long_functions(COMMANDS / name)
    assert not long, f"{name}: move the logic of {long} into the library (a function a subcommand)"


@pytest.mark.parametrize("name", _modules())
def test_no_command_module_is_long(name):
    limit, _ = LONGER.get(name, (MAX_MODULE, ""))
    n = len((COMMANDS / name).read_text().splitlines())
    assert n <= limit, f"{name} has {n} lines (at most {limit}): its library logic belongs in the library"


def test_every_command_module_is_a_parser_and_a_run():
    from recurvit.cli import COMMANDS as NAMES

    for name in NAMES:
        tree = ast.parse((COMMANDS / f"{name}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_parser", "run"} <= defined, name


def test_the_limits_name_real_modules():
    assert set(LONGER) <= {p.name for p in COMMANDS.glob("*.py")}

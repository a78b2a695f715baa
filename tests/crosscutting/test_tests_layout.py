"""The tests mirror the package, so the test of a module is found from the folder names alone:
tests/<package>/test_<module>.py tests src/recurvit/<package>/<module>.py (nested packages nested alike:
tests/models/cores/, tests/tasks/vae/), tests/test_<module>.py a top-level module (src/recurvit/cli.py ->
tests/test_cli.py), and what belongs to no one package sits in tests/crosscutting/."""
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PKG = TESTS.parent / "src" / "recurvit"
CROSSCUTTING = "crosscutting"


def _folders():
    """Every test folder below tests/, as a path relative to it (``__pycache__`` left out)."""
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("*")
                  if p.is_dir() and "__pycache__" not in p.parts)


def test_every_test_folder_is_a_package_of_recurvit_or_the_crosscutting_one():
    stray = [str(rel) for rel in _folders()
             if rel.parts[0] != CROSSCUTTING and not (PKG / rel / "__init__.py").is_file()]
    assert not stray, (f"these tests/ folders name no package under src/recurvit/ (a suite of no one package goes "
                       f"in tests/{CROSSCUTTING}/): {stray}")
    nested = [str(rel) for rel in _folders() if rel.parts[0] == CROSSCUTTING and len(rel.parts) > 1]
    assert not nested, f"tests/{CROSSCUTTING}/ is one flat folder: {nested}"


def test_a_test_file_at_the_root_tests_a_top_level_module():
    loose = sorted(p.name for p in TESTS.glob("test_*.py") if not (PKG / p.name.removeprefix("test_")).is_file())
    assert not loose, ("a test file at tests/ tests a top-level module of recurvit (test_cli.py: src/recurvit/cli.py); "
                       f"these name none, so they go in their package's folder or tests/{CROSSCUTTING}/: {loose}")


def test_every_test_folder_has_an_init_so_equal_file_names_do_not_collide():
    missing = [str(rel) for rel in [Path("."), *_folders()] if not (TESTS / rel / "__init__.py").is_file()]
    assert not missing, f"add an empty __init__.py to: {missing}"

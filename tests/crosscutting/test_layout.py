"""The package's shape: no import cycle, floors that import only downwards, files of one job each, no
branch on a core's name outside models/ (a core answers for itself)."""
import re
import subprocess
import sys

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "recurvit"
MAX_LINES = 350  # a file past this does several jobs: split it along them

# The package's floors, lowest first. A module imports from its own floor and the floors below it only,
# counting every import statement (function-local ones too); a new top-level part must be given a floor.
FLOORS = [
    {"errors", "config_names", "model_fields", "plot_style", "task_table",  # task_table: tasks by dotted name
     "pretrained"},             # the shipped models' index: reads YAML, imports no other part
    {"config"},
    {"layers"},
    {"models"},
    {"data"},
    {"run"},                    # what every consumer of a run stands on
    {"train", "tables"},
    {"analysis"},
    {"study"},                  # never imports tasks: it finds them in task_table
    {"tasks", "export"},
    {"commands"},
    {"cli", "__main__", "_timm_hook", "timm_script", "recurvit"},  # the entry points; "recurvit": the package's __init__
]


def _package_graph():
    """{part: the parts it imports}, every import statement counted (scripts/import_cycles.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from import_cycles import graph, packages
    finally:
        sys.path.pop(0)
    return {a.removeprefix("recurvit."): {b.removeprefix("recurvit.") for b in bs} for a, bs in packages(graph()).items()}


def test_no_import_cycle():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    assert "0 cycles" in res.stdout


def test_no_two_parts_import_each_other_in_any_form():
    parts = _package_graph()
    pairs = sorted({tuple(sorted((a, b))) for a, bs in parts.items() for b in bs if a in parts.get(b, ())})
    assert not pairs, pairs


def test_every_import_runs_down_the_floors():
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    parts = _package_graph()
    unplaced = sorted(set(parts) - set(floor))
    assert not unplaced, f"give these a floor in FLOORS: {unplaced}"
    up = sorted(f"{a} -> {b}" for a, bs in parts.items() for b in bs if floor[b] > floor[a])
    assert not up, up


def test_no_file_does_several_jobs():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_branch_on_a_core_name_outside_models():
    names = "stack|recurrent|ode|softmor"
    pattern = re.compile(rf"""(==|!=| in )\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)|startswith\(["'](b|sr)?vit""")
    hits = [f"{p.relative_to(PKG)}:{i}: {line.strip()}" for p in PKG.rglob("*.py") if "models" not in p.relative_to(PKG).parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


@pytest.mark.slow
def test_a_new_core_is_one_class_and_one_table_entry():
    """Everything outside models/ asks the core: a core registered in the table alone works end to end."""
    import dataclasses

    import torch

    from recurvit import create_model
    from recurvit.analysis.accounting import account
    from recurvit.models.cores import CORES, Core

    @dataclasses.dataclass
    class TwiceOptions:
        gain: float = 1.0  # scale of each step's update

    class Twice(Core):  # what a new core defines: name, Options, shares_blocks, block_uses, states
        name = "twice"
        Options = TwiceOptions
        shares_blocks = True

        @classmethod
        def block_uses(cls, cfg, steps=None):
            return [2 * (cfg.steps if steps is None else int(steps))]

        def states(self, blocks, z, steps, grad_last=None):
            self.nfe = 0
            for _ in range(steps):  # each step applies the shared block twice
                z = z + self.opts.gain * (blocks[0](blocks[0](z)) - z)
                self.nfe += 2
                yield z

    CORES["twice"] = Twice
    try:
        m = create_model("bvit_tiny", core="twice", gain=0.5, steps=3, img_size=8, patch_size=4, in_chans=1,
                         num_classes=4, embed_dim=16, num_heads=2)
        assert m(torch.randn(2, 1, 8, 8)).shape == (2, 4) and m.nfe == 6
        acct = account(m, memory=False)
        assert acct["nfe"] == 6 and acct["flops_analytic"] == acct["flops_forward"] and acct["runs_as"] == "twice"
    finally:
        del CORES["twice"]


def test_one_epoch_loop_trains_every_task():
    """train/fit.py holds the only epoch loop; a task defines one epoch, never the loop around it."""
    loops = [f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.match(r"\s*for epoch in ", line)]
    assert loops and all(h.startswith("train/fit.py:") for h in loops), loops
    from recurvit.tasks import TASKS, Task

    assert set(TASKS) == {"classify", "dense", "vae"} and all(issubclass(t, Task) and t.name == n for n, t in TASKS.items())

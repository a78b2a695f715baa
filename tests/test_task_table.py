"""recurvit/task_table.py: the one table that finds a task by name, so nothing has to be imported first; and
the type every study view implements (recurvit/study/registry.py)."""
import ast
import subprocess
import sys
from pathlib import Path

from recurvit import task_table
from recurvit.data.datasets import DENSE
from recurvit.study.registry import StudyView, View

PKG = Path(__file__).resolve().parents[1] / "src" / "recurvit"


def test_every_entry_resolves_to_what_it_names():
    for name in task_table.TASKS:
        cls = task_table.task_class(name)
        assert cls.name == name and cls.reader is not None
    for name in task_table.VIEWS:
        assert task_table.view(name).name == name
    assert {d: task_table.data_task(d) for d in DENSE} == {d: "dense" for d in DENSE}
    from recurvit.tasks.classify.finetune import RECIPE
    assert RECIPE in task_table.BEST_WITHOUT_HOLDOUT
    assert task_table.task_class("nope") is None and task_table.view("nope") is None


def test_every_shipped_view_implements_the_view_type():
    """Each view is a View subclass and satisfies the StudyView protocol the study machinery reads (mypy is
    not installed here, so this is the check of the type)."""
    for name in task_table.VIEWS:
        v = task_table.view(name)
        assert isinstance(v, StudyView) and isinstance(v, View), name
        assert set(v.CONTRAST.keys) >= set(v.CONTRAST.heads), name  # a head names a compared figure
    members = {n for n in dir(StudyView) if not n.startswith("_")} | set(StudyView.__annotations__)
    assert len(members) <= 12, sorted(members)  # the few members a study needs


def test_no_table_is_filled_by_an_import():
    """Nothing registers a task, a view or a data set at a module's top level: the tables are literals in
    task_table.py, and adding to them is an explicit call (task_table.add) in the program that adds."""
    tables = {"TASKS", "VIEWS", "DATA_TASKS", "BEST_WITHOUT_HOLDOUT", "READERS", "STUDIES"}
    hits = []
    for p in PKG.rglob("*.py"):
        for node in ast.parse(p.read_text()).body:  # statements at module level only
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call):
                f = call.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
                if name in ("add", "add_task", "add_view") and owner in ("task_table", "") or \
                        name in ("update", "setdefault") and owner in tables:
                    hits.append(f"{p.relative_to(PKG)}:{node.lineno}")
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", getattr(t.value, "attr", "")) in tables:
                    hits.append(f"{p.relative_to(PKG)}:{node.lineno}")
    assert not hits, hits


def test_a_fresh_process_finds_every_task_without_importing_recurvit_tasks(tmp_path):
    code = ("import sys\n"
            "from recurvit.run.checkpoint import reader_of\n"
            "from recurvit.study.registry import StudyView, view_of\n"
            "assert 'recurvit.tasks' not in sys.modules\n"
            "for t in ('classify', 'dense', 'vae'):\n"
            "    assert reader_of({'task': t}, 'x') is not None\n"
            "assert 'recurvit.tasks' in sys.modules  # imported by the lookup, on first use\n"
            "for t in ('classify', 'finetune', 'dense', 'vae'):\n"
            "    v = view_of(t)\n"
            "    assert v.name == t and isinstance(v, StudyView)\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_importing_recurvit_study_alone_finds_a_view(tmp_path):
    code = ("import sys\n"
            "import recurvit.study\n"
            "assert 'recurvit.tasks' not in sys.modules\n"
            "from recurvit.study.registry import view_of\n"
            "print(type(view_of('dense')).__name__)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "DenseView", res.stderr


def test_a_task_added_at_run_time_is_handed_to_a_fresh_process():
    class Toy:
        name = "toy_table_entry"

    task_table.add(Toy, view=View, data=("toy_data",))
    try:
        assert task_table.task_class("toy_table_entry") is Toy and task_table.data_task("toy_data") == "toy_table_entry"
        assert isinstance(task_table.view("toy_table_entry"), View) and "toy_table_entry" in task_table.view_names()
        entry = task_table.added()["toy_table_entry"]
        assert entry == {"task": f"{__name__}:{Toy.__qualname__}", "view": "recurvit.study.registry:View",
                         "data": ["toy_data"]}
    finally:
        task_table.remove("toy_table_entry")
    assert task_table.task_class("toy_table_entry") is None and task_table.data_task("toy_data") is None

"""recurvit/task_table.py: the one table that finds a task by name, so nothing has to be imported first
(issue 56: exports from a run directory failed in a fresh process until recurvit.tasks was imported)."""
import subprocess
import sys

from recurvit import task_table
from recurvit.data.datasets import DENSE


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


def test_a_fresh_process_finds_every_task_without_importing_recurvit_tasks(tmp_path):
    code = ("import sys\n"
            "from recurvit.run.checkpoint import reader_of\n"
            "from recurvit.study.registry import view_of\n"
            "assert 'recurvit.tasks' not in sys.modules\n"
            "for t in ('classify', 'dense', 'vae'):\n"
            "    assert reader_of({'task': t}, 'x') is not None\n"
            "assert view_of('finetune').name == 'finetune'\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr

"""The README's Python examples run as written."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_example_runs(code):
    exec(compile(code, str(README), "exec"), {})


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2

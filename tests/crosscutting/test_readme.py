"""The README has Python examples (each runs in a fresh interpreter: test_readme_commands.py), and every relative
link of the front page and docs exists."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [b for page in PAGES for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_of_the_front_page_and_docs_exists(page):
    targets = re.findall(r"\]\((?!https?:|#)([^)\s#]+)", page.read_text())
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, missing

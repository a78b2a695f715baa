"""scripts/update_readme.py, run as a subprocess on temporary READMEs and result files."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "update_readme.py"

REPORT = """# Study `toy`

Generated; do not edit by hand.

## Table

| model | acc |
|---|---|
| a | 1.0 |

![a plot](plot.png)
"""


def run(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--readme", str(tmp_path / "README.md"),
                           "--root", str(tmp_path), *args], capture_output=True, text=True)


def write(tmp_path, readme, **files):
    (tmp_path / "README.md").write_text(readme)
    for name, text in files.items():
        (tmp_path / name.replace("__", ".")).write_text(text)


def test_round_trip_then_check_passes(tmp_path):
    write(tmp_path, "intro\n\n<!-- include: report.md -->\nstale\n<!-- /include -->\n\noutro\n", report__md=REPORT)
    assert run(tmp_path, "--check").returncode == 1
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "updated 1 of 1" in done.stdout
    assert (tmp_path / "README.md").read_text() == (
        "intro\n\n<!-- include: report.md -->\nGenerated; do not edit by hand.\n\n#### Table\n\n"
        "| model | acc |\n|---|---|\n| a | 1.0 |\n<!-- /include -->\n\noutro\n")
    check = run(tmp_path, "--check")
    assert check.returncode == 0, check.stderr


def test_check_fails_when_a_result_file_changes(tmp_path):
    write(tmp_path, "<!-- include: a.md -->\n<!-- /include -->\n<!-- include: b.md -->\n<!-- /include -->\n",
          a__md="A\n", b__md="B\n")
    assert run(tmp_path).returncode == 0
    (tmp_path / "b.md").write_text("B, rerun\n")
    check = run(tmp_path, "--check")
    assert check.returncode == 1
    assert len(check.stderr.strip().splitlines()) == 1
    assert "line 4 (b.md)" in check.stderr and "a.md" not in check.stderr
    assert "B\n" in (tmp_path / "README.md").read_text()  # --check never writes


def test_generating_twice_is_idempotent(tmp_path):
    write(tmp_path, "<!-- include: report.md -->\n<!-- /include -->\ntext\n", report__md=REPORT)
    assert run(tmp_path).returncode == 0
    first = (tmp_path / "README.md").read_text()
    again = run(tmp_path)
    assert again.returncode == 0 and "updated 0 of 1" in again.stdout
    assert (tmp_path / "README.md").read_text() == first


def test_lines_selection_and_several_ranges(tmp_path):
    numbered = "".join(f"line {i}\n" for i in range(1, 11))
    write(tmp_path, "<!-- include: n.txt lines=2-3 -->\n<!-- /include -->\n"
                    "<!-- include: n.txt lines=1-2,9-10 -->\n<!-- /include -->\n", n__txt=numbered)
    assert run(tmp_path).returncode == 0
    assert (tmp_path / "README.md").read_text() == (
        "<!-- include: n.txt lines=2-3 -->\nline 2\nline 3\n<!-- /include -->\n"
        "<!-- include: n.txt lines=1-2,9-10 -->\nline 1\nline 2\n...\nline 9\nline 10\n<!-- /include -->\n")


def test_fence_wraps_the_lines_verbatim(tmp_path):
    write(tmp_path, "<!-- include: out.txt lines=1-2 fence=text -->\n<!-- /include -->\n",
          out__txt="$ recurvit train\n# not a title\n![not an image]\n")
    assert run(tmp_path).returncode == 0
    assert (tmp_path / "README.md").read_text() == (
        "<!-- include: out.txt lines=1-2 fence=text -->\n```text\n$ recurvit train\n# not a title\n```\n"
        "<!-- /include -->\n")
    assert run(tmp_path, "--check").returncode == 0


@pytest.mark.parametrize("readme, line", [
    ("a\n<!-- include: r.md -->\nbody\n", 2),                                      # never closed
    ("a\nb\n<!-- /include -->\n", 3),                                              # closed, never opened
    ("<!-- include: r.md -->\n<!-- include: r.md -->\n<!-- /include -->\n", 2),    # nested
    ("x\n<!-- include: missing.md -->\n<!-- /include -->\n", 2),                   # no such file
    ("<!-- include: r.md lines=3-9 -->\n<!-- /include -->\n", 1),                  # beyond the file
    ("<!-- include: r.md lines=two -->\n<!-- /include -->\n", 1),                  # malformed range
    ("<!-- include: r.md colour=red -->\n<!-- /include -->\n", 1),                 # unknown option
])
@pytest.mark.parametrize("check", [False, True])
def test_bad_markers_are_refused_with_one_line(tmp_path, readme, line, check):
    write(tmp_path, readme, r__md="one\ntwo\n")
    done = run(tmp_path, *(["--check"] if check else []))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"line {line}:" in done.stderr
    assert (tmp_path / "README.md").read_text() == readme


def test_repo_readme_is_current():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout


def test_links_are_rewritten_for_a_page_in_a_sub_folder():
    """A link written for the repository root gets the page's way there; a link that only exists beside the
    included file (a report linking its own data) is first made a path from the root."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from update_readme import relink
    finally:
        sys.path.pop(0)
    text = "see [report](results/x/report.md) and [its data](counts.json) and [web](https://a.b/c)"
    root, source = REPO, REPO / "results" / "accounting" / "report.md"
    assert relink(text, "..", root, source) == (
        "see [report](../results/x/report.md) and [its data](../results/accounting/counts.json) "
        "and [web](https://a.b/c)")
    assert relink(text, ".", root, source) == text.replace("](counts.json)", "](results/accounting/counts.json)")

"""scripts/update_readme.py, run as a subprocess on temporary READMEs and result files."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


# ------------------------------------------------ part=, and the registered studies' table (view=studies)
def test_part_takes_paragraphs_by_number_or_from_the_end(tmp_path):
    write(tmp_path, "<!-- include: s.md part=1 -->\n<!-- /include -->\n<!-- include: s.md part=2-3 -->\n"
                    "<!-- /include -->\n<!-- include: s.md part=-1 -->\n<!-- /include -->\n",
          s__md="| a |\n|---|\n| 1 |\n\none\n\ntwo\n\n\nlast\n")
    assert run(tmp_path).returncode == 0
    assert (tmp_path / "README.md").read_text() == (
        "<!-- include: s.md part=1 -->\n| a |\n|---|\n| 1 |\n<!-- /include -->\n"
        "<!-- include: s.md part=2-3 -->\none\n\ntwo\n<!-- /include -->\n"
        "<!-- include: s.md part=-1 -->\nlast\n<!-- /include -->\n")


HEADLINE = """**Pre-registered replication** (F, 60 epochs): [done](results/done/report.md), confirmatory (registered in abc1234, before every result; n = 3 per cell). Its claims, each with its rule committed before any run:

- a: b, with a colon: **reproduced**. a − b: +1.0 points
- c: **not measured** (registered points); all points: **reproduced** (exploratory). fewer than 3 distinct x
- d: **not separable at this scale**. a − b: +0.1 points
- e: **target met in 0 of 3 seeds**. per seed: 0; 0; 0

**Pre-registered replication** (mazes): `later`, registered, pending (registered in def5678; 2 of 6 runs in): 4 claims, each with its rule committed before any run, decided once every registered run is in ([findings](docs/findings.md)).
"""


def studies(tmp_path):
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "done.yaml").write_text(
        "# A replication (issue 3) of the first comparison, on F. This file is the registration.\n#\n"
        "# Why: does it also ask? Not in its first paragraph.\nname: done\nresults: ../results/done\n")
    (tmp_path / "studies" / "later.yaml").write_text(
        "# Thinking longer (issue 40), the follow-up: does x carry y to larger mazes? It was registered.\n"
        "name: later\nresults: ../results/later\n")
    (tmp_path / "studies" / "other.yaml").write_text("# no results key\nname: other\n")


def test_the_registered_studies_table_is_one_line_a_study(tmp_path):
    studies(tmp_path)
    (tmp_path / "results").mkdir()
    write(tmp_path, "top\n<!-- include: results/findings_headline.md view=studies -->\n<!-- /include -->\n",
          **{"results/findings_headline__md": HEADLINE})
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "README.md").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| [") or r.startswith("| `")]
    assert rows == [
        "| [done](results/done/report.md), confirmatory (registered in abc1234, before every result; n = 3 per "
        "cell) | A replication of the first comparison, on F. | 4 | 2 | 1 | 1 not measured, 1 not separable at "
        "this scale, 1 target met in 0 of 3 seeds |",
        "| `later`, registered, pending (registered in def5678; 2 of 6 runs in) | Does x carry y to larger mazes? "
        "| 4 | - | - | 4 pending |"]
    assert "*Decided*: a verdict other than not separable at this scale, not measured or pending" in text
    assert run(tmp_path, "--check").returncode == 0


@pytest.mark.parametrize("headline, study_file, words", [
    ("Some other report\n", True, "not a findings headline"),
    (HEADLINE.replace(". Its claims, each", ", its claims, each"), True, "a study's line of the headline"),
    (HEADLINE.replace("- d: **not separable", "- d **not separable"), True, "a claim's line of the headline"),
    (HEADLINE, False, "no studies/*.yaml writes its results to results/done"),
])
def test_a_headline_or_study_the_table_cannot_read_is_one_line(tmp_path, headline, study_file, words):
    if study_file:
        studies(tmp_path)
    (tmp_path / "results").mkdir()
    write(tmp_path, "<!-- include: results/findings_headline.md view=studies -->\n<!-- /include -->\n",
          **{"results/findings_headline__md": headline})
    done = run(tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "line 1:" in done.stderr and words in done.stderr


def test_no_registered_study_yet_is_said_in_one_line(tmp_path):
    write(tmp_path, "<!-- include: h.md view=studies -->\n<!-- /include -->\n",
          h__md="No pre-registered study yet: every finding below is exploratory.\n")
    assert run(tmp_path).returncode == 0
    assert "No pre-registered study yet" in (tmp_path / "README.md").read_text()


# ------------------------------------------------ the repository's front page
README = REPO / "README.md"


def _cells(row: str) -> list:
    """A markdown table row's cells ('\\|' inside a cell is not a column break)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _front_page_table() -> dict:
    text = README.read_text()
    block = text.split("<!-- include: results/findings_headline.md view=studies -->\n", 1)[1]
    block = block.split("<!-- /include -->", 1)[0]
    rows = [_cells(r) for r in block.splitlines() if r.startswith(("| [", "| `"))]
    return {re.match(r"\[([^\]]+)\]|`([^`]+)`", r[0]).group(1) or "": r for r in rows}


def _confirmatory_rows() -> list:
    """(study, verdict) of each row of results/findings.md's confirmatory section (the findings table)."""
    text = (REPO / "results" / "findings.md").read_text()
    section = text.split("\n## Confirmatory\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in section.splitlines():
        if not row.startswith("| ") or row.startswith(("| #", "|---")):
            continue
        cells = _cells(row)
        where = cells[3].rsplit(" · ", 1)[-1]
        study = re.match(r"\[([^\]]+)\]", where).group(1) if where.startswith("[") else where
        out.append((study, re.search(r"\*\*([^*]+)\*\*", cells[-1]).group(1)))
    return out


def test_the_readme_is_under_25_kb():
    assert len(README.read_bytes()) < 25_600, len(README.read_bytes())


def test_the_front_page_table_counts_what_the_findings_table_says():
    """Each registered study's line (claims, decided, reproduced) against the rows of the findings table's
    confirmatory section, and the totals against its summary sentence."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from update_readme import decided
    finally:
        sys.path.pop(0)
    table, rows = _front_page_table(), _confirmatory_rows()
    assert table and set(table) == {study for study, _ in rows}
    for study, cells in table.items():
        verdicts = [v for s, v in rows if s == study]
        pending = all(v.startswith("pending") for v in verdicts)
        want = [len(verdicts), "-" if pending else sum(map(decided, verdicts)),
                "-" if pending else verdicts.count("reproduced")]
        assert cells[2:5] == [str(x) for x in want], (study, cells)
    summary = re.search(r"Confirmatory verdicts: (\d+) rows \(([^)]*(?:\([^)]*\)[^)]*)*)\)",
                        (REPO / "results" / "findings.md").read_text())
    assert summary and int(summary[1]) == sum(int(c[2]) for c in table.values())
    reproduced = re.search(r"(\d+) reproduced(?:,|$)", summary[2])
    assert sum(int(c[4]) for c in table.values() if c[4] != "-") == (int(reproduced[1]) if reproduced else 0)


def test_the_front_page_links_to_a_findings_section_that_exists():
    assert "](docs/findings.md#registered-studies)" in README.read_text()
    assert "\n## Registered studies\n" in (REPO / "docs" / "findings.md").read_text()


def test_the_maze_sections_words_about_studies_are_what_the_files_say():
    """No typed status (issue 58): in "Thinking longer", each study file is called exploratory or registered
    as the word before it says, which must be what its file and the front page's table say; and "met in no
    seed" must be every maze target row's verdict in the findings table."""
    import yaml

    text = README.read_text()
    section = text.split("## Thinking longer (mazes)\n", 1)[1].split("\n## ", 1)[0]
    table = _front_page_table()
    named = list(re.finditer(r"studies/(\w+)\.yaml", section))
    assert len(named) >= 3
    for m in named:
        said = re.findall(r"\b(exploratory|registered)\b", section[:m.start()])[-1]
        doc = yaml.safe_load((REPO / "studies" / f"{m[1]}.yaml").read_text())
        results = Path(doc["results"]).name
        assert (said == "registered") == ("registration" in doc) == (results in table), (m[1], said)
    assert "each maze study's target row is met in no seed" in section
    findings = (REPO / "results" / "findings.md").read_text()
    targets = [_cells(r) for r in findings.splitlines()
               if r.startswith("| ") and "the project's target" in r and " mazes" in r]
    assert len(targets) >= 3
    assert all(re.search(r"\*\*target met in 0 of \d+ seeds\*\*", c[-1]) for c in targets), targets

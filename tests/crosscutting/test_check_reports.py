"""scripts/check_reports.py: every committed study report regenerates byte for byte from what is committed (each
run's result.json kept in its results folder, else results.csv), but the four whose runs' results were never kept."""
from pathlib import Path

import pytest
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
check_reports = load_script("scripts/check_reports.py")

# made from run directories before results folders kept a copy of each run's result.json: results.csv alone lacks
# the per-epoch curves of their plateau column and the full precision of their figures
WITHOUT_RUNS = {"fashion_calibration", "fashion_converged", "fashion_frontier", "loopvae"}


@pytest.mark.slow
def test_every_committed_report_regenerates_byte_for_byte(tmp_path):
    studies = sorted(p for p in (ROOT / "studies").glob("*.yaml") if p.name != "claims.yaml")
    lines = {p.stem: check_reports.check(p, keep=tmp_path) for p in studies}
    lines = {name: line for name, line in lines.items() if line}  # a study without a committed report: none
    assert len(lines) == 24
    differ = {name for name, line in lines.items() if "identical" not in line}
    assert differ == WITHOUT_RUNS, "\n".join(lines[n] for n in sorted(differ ^ WITHOUT_RUNS))
    for name in WITHOUT_RUNS:
        assert "from results.csv" in lines[name] and "no result.json of its runs" in lines[name], lines[name]
    for name in ("fashion_confirmatory", "mazes_locality", "mazes_random_depth"):  # registered: from their runs
        assert "runs kept in the results folder" in lines[name] or "runs:" in lines[name], lines[name]
    assert (tmp_path / "fashion_confirmatory" / "report.md").is_file()  # --keep: the regenerated folders

"""recurvit.study.plateau: the change over the last 20% of epochs (a least-squares line), and the report's
count of runs that still moved by the budget's criterion."""
import pytest

from recurvit.study.plateau import PLATEAU_TOL, plateau_change, plateau_per_seed, plateau_summary


def test_the_change_is_read_off_a_least_squares_line_over_the_last_fifth():
    rising = [0.5 + 0.01 * e for e in range(10)]  # 10 epochs: the window is epochs 8..10 (k = 2)
    assert plateau_change(rising) == pytest.approx(0.02)
    noisy = [0.8] * 7 + [0.81, 0.79, 0.80]  # one noisy epoch does not make a change
    assert plateau_change(noisy) == pytest.approx(-0.01)
    assert plateau_change([0.5, 0.6, 0.7, 0.8]) is None  # fewer than 5 epochs: too short to say


def test_the_summary_counts_the_runs_that_still_moved():
    still = [{"plateau_val": v} for v in (0.0007, PLATEAU_TOL, 0.008, -0.004)]
    text = plateau_summary(still + [{"plateau_val": None}])
    assert text.startswith("Plateau: 3 of 4 runs changed by 0.3 points or more")
    assert "from -0.4 to +0.8 points" in text and "still moving" in text
    flat = plateau_summary([{"plateau_val": 0.001}, {"plateau_val": -0.002}])
    assert "0 of 2 runs" in flat and "every run is at a plateau" in flat
    assert plateau_summary([{"plateau_test": None}]) == ""  # nothing per seed: no sentence
    cell = {"rows": [{"seed": 1, "plateau_val": 0.004}, {"seed": 0, "plateau_val": -0.001}]}
    assert plateau_per_seed(cell) == "-0.1 / +0.4"  # in the order of the seeds

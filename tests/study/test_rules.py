"""The decision rules of recurvit.study.rules against scipy, on synthetic per-seed data with fixed seeds."""
import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from recurvit.study import rules
from recurvit.study.targets import per_seed_target
from recurvit.study.rules import (NOT_MEASURED, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, Decision, equivalence,
                                  fmt_decision, heterogeneity, near_chance, noninferiority, seeds_needed,
                                  superiority, trend)


def _normal(seed, loc, scale, n):
    return list(np.random.default_rng(seed).normal(loc, scale, n))


A = _normal(1, 0.80, 0.004, 5)
B = _normal(2, 0.78, 0.006, 6)
# a seed effect shared by both groups: the paired test resolves what the unpaired one cannot
SEED_FX = _normal(3, 0.0, 0.05, 5)
PA = [0.70 + s + e for s, e in zip(SEED_FX, _normal(4, 0.004, 0.001, 5))]
PB = [0.70 + s for s in SEED_FX]
SAME = [0.70, 0.72, 0.74, 0.71]  # compared with itself reversed: the difference is exactly 0


# --- superiority ---------------------------------------------------------------------------------------------

def test_superiority_matches_welch():
    d = superiority(A, B)
    r = stats.ttest_ind(A, B, equal_var=False)
    ci = r.confidence_interval(0.95)
    assert d.estimate == pytest.approx(np.mean(A) - np.mean(B))
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.p == pytest.approx(r.pvalue)
    assert d.n == (5, 6)


def test_superiority_paired_matches_ttest_rel():
    d = superiority(PA, PB, paired=True)
    r = stats.ttest_rel(PA, PB)
    ci = stats.ttest_1samp(np.subtract(PA, PB), 0.0).confidence_interval(0.95)
    assert d.estimate == pytest.approx(np.mean(np.subtract(PA, PB)))
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.p == pytest.approx(r.pvalue)
    assert d.n == (5, 5)


def test_superiority_verdicts():
    assert superiority(A, B, side=+1).verdict == REPRODUCED
    assert superiority(A, B, side=-1).verdict == NOT_REPRODUCED
    assert superiority(B, A, side=-1).verdict == REPRODUCED
    assert superiority(SAME, SAME[::-1]).verdict == NOT_SEPARABLE
    # pairing removes the shared seed effect
    assert superiority(PA, PB).verdict == NOT_SEPARABLE
    assert superiority(PA, PB, paired=True).verdict == REPRODUCED
    assert superiority(PA, PB, side=-1, paired=True).verdict == NOT_REPRODUCED


def test_superiority_by_a_stated_size_against_scipy():
    """"a beats b by more than m": the interval of a - b against m; p of the t test of a - b = m."""
    diff = np.mean(A) - np.mean(B)  # about 0.02
    r = stats.ttest_ind(A, B, equal_var=False)
    ci = r.confidence_interval(0.95)
    d = superiority(A, B, by=0.01)
    assert (d.estimate, d.lo, d.hi) == (pytest.approx(diff), pytest.approx(ci.low), pytest.approx(ci.high))
    shifted = stats.ttest_ind(A, [b + 0.01 for b in B], equal_var=False)
    assert d.p == pytest.approx(shifted.pvalue)
    assert d.verdict == (REPRODUCED if ci.low > 0.01 else NOT_SEPARABLE)
    assert superiority(A, B, by=0.05).verdict == NOT_REPRODUCED  # the whole interval is below 5 points: says no
    one = [0.012, 0.015, 0.011, 0.013]  # a one-sample figure (b = 0) well above 0 but not above 0.02
    assert superiority(one, [0.0] * 4, paired=True).verdict == REPRODUCED
    assert superiority(one, [0.0] * 4, paired=True, by=0.02).verdict == NOT_REPRODUCED
    tp = stats.ttest_1samp(one, 0.02)
    assert superiority(one, [0.0] * 4, paired=True, by=0.02).p == pytest.approx(tp.pvalue)
    with pytest.raises(ValueError):
        superiority(A, B, by=-1)


def test_superiority_drops_missing_values():
    d = superiority(A + [None, math.nan], B)
    assert d.n == (5, 6)
    assert d.p == pytest.approx(superiority(A, B).p)
    # paired: a seed missing on either side is dropped from both
    dp = superiority(PA + [0.9], PB + [None], paired=True)
    assert dp.n == (5, 5) and dp.estimate == pytest.approx(superiority(PA, PB, paired=True).estimate)


# --- non-inferiority ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("margin", [0.005, 0.02, 0.05])
def test_noninferiority_matches_scipy(margin):
    d = noninferiority(B, A, margin)
    ref = stats.ttest_ind(np.asarray(B) + margin, A, equal_var=False, alternative="greater")
    ci = stats.ttest_ind(B, A, equal_var=False).confidence_interval(0.95)
    assert d.p == pytest.approx(ref.pvalue)
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert (d.verdict == REPRODUCED) == (d.p < 0.025)
    dp = noninferiority(PB, PA, margin, paired=True)
    refp = stats.ttest_1samp(np.subtract(PB, PA), -margin, alternative="greater")
    assert dp.p == pytest.approx(refp.pvalue)


def test_noninferiority_verdicts():
    # B is about 2 points below A
    assert noninferiority(B, A, margin=0.05).verdict == REPRODUCED
    assert noninferiority(B, A, margin=0.005).verdict == NOT_REPRODUCED
    assert noninferiority(B, A, margin=0.02).verdict == NOT_SEPARABLE
    assert noninferiority(A, B, margin=0.001).verdict == REPRODUCED  # better is not worse
    assert noninferiority(PB, PA, margin=0.001, paired=True).verdict == NOT_REPRODUCED


# --- equivalence --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("margin", [0.003, 0.01, 0.03])
def test_equivalence_matches_tost(margin):
    d = equivalence(A, B, margin)
    p_lo = stats.ttest_ind(np.asarray(A) + margin, B, equal_var=False, alternative="greater").pvalue
    p_hi = stats.ttest_ind(np.asarray(A) - margin, B, equal_var=False, alternative="less").pvalue
    ci = stats.ttest_ind(A, B, equal_var=False).confidence_interval(0.90)
    assert d.p == pytest.approx(max(p_lo, p_hi))
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert (d.verdict == REPRODUCED) == (d.p < 0.05)
    assert "90% interval" in d.note

    diff = np.subtract(PA, PB)
    dp = equivalence(PA, PB, margin, paired=True)
    p_lo = stats.ttest_1samp(diff, -margin, alternative="greater").pvalue
    p_hi = stats.ttest_1samp(diff, margin, alternative="less").pvalue
    ci = stats.ttest_1samp(diff, 0.0).confidence_interval(0.90)
    assert dp.p == pytest.approx(max(p_lo, p_hi))
    assert (dp.lo, dp.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_equivalence_verdicts():
    close = [v + 0.0005 for v in _normal(5, 0.8, 0.002, 6)]
    base = _normal(6, 0.8, 0.002, 6)
    assert equivalence(close, base, margin=0.005).verdict == REPRODUCED
    assert equivalence(A, B, margin=0.005).verdict == NOT_REPRODUCED  # about 2 points apart
    assert equivalence(A, B, margin=0.04).verdict == REPRODUCED
    assert equivalence(SAME, SAME[::-1], margin=0.005).verdict == NOT_SEPARABLE  # equal means, too much spread
    assert equivalence(PA, PB, margin=0.01, paired=True).verdict == REPRODUCED
    assert equivalence(PA, PB, margin=0.002, paired=True).verdict == NOT_REPRODUCED


# --- trend --------------------------------------------------------------------------------------------------

DEPTH = [1, 2, 4, 8] * 3
RISING = [0.60 + 0.02 * np.log2(r) + e for r, e in zip(DEPTH, _normal(9, 0.0, 0.01, len(DEPTH)))]


@pytest.mark.parametrize("log2_x", [False, True])
def test_trend_matches_linregress(log2_x):
    d = trend(DEPTH, RISING, log2_x=log2_x)
    lr = stats.linregress(np.log2(DEPTH) if log2_x else DEPTH, RISING)
    assert d.estimate == pytest.approx(lr.slope)
    assert d.p == pytest.approx(lr.pvalue)
    assert (d.hi - d.lo) / 2 == pytest.approx(stats.t.ppf(0.975, len(DEPTH) - 2) * lr.stderr)
    assert (d.lo + d.hi) / 2 == pytest.approx(lr.slope)
    assert d.n == (len(DEPTH),)


def test_trend_verdicts():
    assert trend(DEPTH, RISING, side=+1, log2_x=True).verdict == REPRODUCED
    assert trend(DEPTH, RISING, side=-1, log2_x=True).verdict == NOT_REPRODUCED
    assert trend(DEPTH, [-v for v in RISING], side=-1).verdict == REPRODUCED
    flat = [0.5, 0.6, 0.55] * 4  # the same three values at every depth: slope 0
    assert trend(sorted(DEPTH), flat).estimate == pytest.approx(0.0, abs=1e-12)
    assert trend(sorted(DEPTH), flat).verdict == NOT_SEPARABLE
    assert math.isinf(trend(sorted(DEPTH), flat).seeds_needed)


def test_trend_seeds_needed_brute_force():
    x = [1, 2, 4, 8] * 2
    y = [0.6 + 0.002 * v + e for v, e in zip(x, _normal(10, 0.0, 0.01, len(x)))]
    d = trend(x, y)
    lr = stats.linregress(x, y)
    k = 4
    want = math.inf
    for m in range(1, 1001):
        if m * k <= 2:
            continue
        half = stats.t.ppf(0.975, m * k - 2) * lr.stderr * math.sqrt(len(x) / (m * k))
        if half < abs(lr.slope):
            want = m
            break
    assert d.seeds_needed == want
    # at the observed repetitions the scaled half-width is the observed one: separable iff enough repetitions
    assert (d.verdict != NOT_SEPARABLE) == (d.seeds_needed <= len(x) / k)


def test_trend_not_measured():
    assert trend([1, 2], [0.1, 0.2]).verdict == NOT_MEASURED  # no residual degrees of freedom
    two_x = trend([1, 1, 1, 2, 2, 2], [0.50, 0.51, 0.52, 0.60, 0.61, 0.62])  # a clear difference, but of two x
    assert two_x.verdict == NOT_MEASURED and "3 distinct x" in two_x.note
    assert trend([3, 3, 3], [0.1, 0.2, 0.3]).verdict == NOT_MEASURED  # one distinct x
    assert trend([1, 2, 3], [0.1, None, math.nan]).verdict == NOT_MEASURED
    with pytest.raises(ValueError):
        trend([0, 1, 2], [0.1, 0.2, 0.3], log2_x=True)


# --- near chance --------------------------------------------------------------------------------------------

def test_near_chance_matches_scipy():
    v = _normal(11, 0.105, 0.004, 5)
    d = near_chance(v, chance=0.1, margin=0.01)
    r = stats.ttest_1samp(v, 0.11, alternative="less")
    ci = stats.ttest_1samp(v, 0.0).confidence_interval(0.95)
    assert d.estimate == pytest.approx(np.mean(v))
    assert (d.lo, d.hi) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.p == pytest.approx(r.pvalue)
    assert d.n == (5,)


def test_near_chance_verdicts():
    assert near_chance(_normal(12, 0.101, 0.002, 4), chance=0.1, margin=0.01).verdict == REPRODUCED
    assert near_chance(_normal(13, 0.35, 0.02, 4), chance=0.1, margin=0.01).verdict == NOT_REPRODUCED
    assert near_chance(_normal(14, 0.11, 0.02, 3), chance=0.1, margin=0.01).verdict == NOT_SEPARABLE


# --- heterogeneity ------------------------------------------------------------------------------------------

def test_heterogeneity_matches_welch_anova():
    assert "equal_var" in __import__("inspect").signature(stats.f_oneway).parameters
    groups = {"euler": _normal(15, 0.010, 0.004, 4), "rk4": _normal(16, 0.014, 0.006, 5),
              "dopri": _normal(17, 0.020, 0.003, 3)}
    d = heterogeneity(groups, margin=0.005)
    ref = stats.f_oneway(*groups.values(), equal_var=False)
    means = [np.mean(g) for g in groups.values()]
    assert d.p == pytest.approx(ref.pvalue)
    assert d.estimate == pytest.approx(max(means) - min(means))
    assert math.isnan(d.lo) and math.isnan(d.hi) and math.isnan(d.seeds_needed)
    assert d.n == (4, 5, 3)


def test_heterogeneity_verdicts():
    spread = {"a": _normal(18, 0.00, 0.003, 4), "b": _normal(19, 0.02, 0.003, 4), "c": _normal(20, 0.04, 0.003, 4)}
    assert heterogeneity(spread, margin=0.005).verdict == REPRODUCED
    uniform = {k: _normal(21 + i, 0.02, 0.0005, 6) for i, k in enumerate("abc")}
    d = heterogeneity(uniform, margin=0.005)
    assert d.p >= 0.05 and d.verdict == NOT_REPRODUCED
    noisy = {k: _normal(31 + i, 0.02, 0.02, 3) for i, k in enumerate("abc")}
    d = heterogeneity(noisy, margin=0.005)
    assert d.p >= 0.05 and d.verdict == NOT_SEPARABLE


def test_heterogeneity_not_measured():
    assert heterogeneity({"a": [0.1, 0.2], "b": [0.3]}, margin=0.01).verdict == NOT_MEASURED
    assert heterogeneity({"a": [0.1, 0.2, 0.3]}, margin=0.01).verdict == NOT_MEASURED
    # a group without spread: Welch's weights are undefined
    assert heterogeneity({"a": [0.1, 0.1, 0.1], "b": [0.2, 0.3, 0.4]}, margin=0.01).verdict == NOT_MEASURED
    assert heterogeneity({"a": [0.5, 0.5, 0.5], "b": [0.2, 0.3, 0.4]}, margin=0.01).verdict == NOT_MEASURED


# --- not measured, arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", [
    lambda a, b: superiority(a, b), lambda a, b: superiority(a, b, paired=True),
    lambda a, b: noninferiority(a, b, 0.01), lambda a, b: noninferiority(a, b, 0.01, paired=True),
    lambda a, b: equivalence(a, b, 0.01), lambda a, b: equivalence(a, b, 0.01, paired=True),
    lambda a, b: near_chance(a, 0.1, 0.01), lambda a, b: trend(list(range(len(a))), a),
    lambda a, b: heterogeneity({"a": a, "b": b}, 0.01),
])
def test_one_value_per_group_is_not_measured(rule):
    d = rule([0.8], [0.7])
    assert d.verdict == NOT_MEASURED
    assert all(math.isnan(v) for v in (d.estimate, d.lo, d.hi, d.p, d.seeds_needed))
    assert rule([], []).verdict == NOT_MEASURED
    assert rule([None, math.nan], [None, math.nan]).verdict == NOT_MEASURED


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        superiority(A, B, side=0)
    with pytest.raises(ValueError):
        noninferiority(A, B, margin=0.0)
    with pytest.raises(ValueError):
        equivalence(A, B, margin=-0.01)
    with pytest.raises(ValueError):
        superiority(A, B, paired=True)  # 5 and 6 values cannot be paired


def test_decision_is_frozen():
    d = superiority(A, B)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.verdict = NOT_MEASURED


def test_no_spread_does_not_raise():
    d = superiority([0.8, 0.8, 0.8], [0.7, 0.7, 0.7])
    assert d.verdict == REPRODUCED and d.lo == d.hi == pytest.approx(0.1)
    assert equivalence([0.8, 0.8], [0.8, 0.8], 0.01).verdict == REPRODUCED
    assert noninferiority([0.7, 0.7], [0.8, 0.8], 0.01).verdict == NOT_REPRODUCED
    assert near_chance([0.1, 0.1, 0.1], 0.1, 0.01).verdict == REPRODUCED
    assert seeds_needed([0.8, 0.8], [0.7, 0.7]) == 2


# --- seeds needed -------------------------------------------------------------------------------------------

def _brute_two(a, b):
    va, vb = np.var(a, ddof=1), np.var(b, ddof=1)
    diff = abs(np.mean(a) - np.mean(b))
    for n in range(2, 1001):
        vx, vy = va / n, vb / n
        dof = (vx + vy) ** 2 / (vx ** 2 / (n - 1) + vy ** 2 / (n - 1))
        if stats.t.ppf(0.975, dof) * math.sqrt(vx + vy) < diff:
            return n
    return math.inf


def _brute_one(v):
    s, m = np.std(v, ddof=1), abs(np.mean(v))
    for n in range(2, 1001):
        if stats.t.ppf(0.975, n - 1) * s / math.sqrt(n) < m:
            return n
    return math.inf


@pytest.mark.parametrize("shift", [0.002, 0.005, 0.01, 0.03])
def test_seeds_needed_brute_force(shift):
    a = [v + shift for v in _normal(40, 0.8, 0.01, 4)]
    b = _normal(41, 0.8, 0.015, 5)
    assert seeds_needed(a, b) == _brute_two(a, b)
    assert seeds_needed(a) == _brute_one(a)
    c = _normal(42, 0.8, 0.01, 4)
    assert seeds_needed(a, c, paired=True) == _brute_one(np.subtract(a, c))


def test_seeds_needed_monotone():
    base_a, b = _normal(43, 0.8, 0.01, 5), _normal(44, 0.8, 0.01, 5)
    offset = np.mean(base_a) - np.mean(b)
    effects = [0.03, 0.02, 0.01, 0.005, 0.002, 0.001]
    need = [seeds_needed([v - offset + e for v in base_a], b) for e in effects]
    assert all(x <= y for x, y in zip(need, need[1:]))
    assert need[0] < need[-1]


def test_seeds_needed_edges():
    assert math.isinf(seeds_needed(SAME, SAME[::-1]))  # effect 0
    assert math.isinf(seeds_needed([0.0, 1.0], [0.0, 1.0 + 1e-6]))  # no n up to 1000 suffices
    assert math.isnan(seeds_needed([0.8], [0.7, 0.6]))
    assert math.isnan(seeds_needed([0.8, 0.7], [0.8, None], paired=True))


def test_rules_fill_seeds_needed():
    assert superiority(A, B).seeds_needed == seeds_needed(A, B)
    # a margin rule's seeds clear its margin (a level: its bound), not 0
    assert noninferiority(A, B, 0.01).seeds_needed == seeds_needed(A, B, boundary=-0.01)
    assert (equivalence(PA, PB, 0.01, paired=True).seeds_needed
            == seeds_needed(PA, PB, paired=True, boundary=0.01, confidence=0.90))  # inside: the 90% interval
    assert near_chance(A, 0.1, 0.01).seeds_needed == seeds_needed(A, boundary=0.11)
    # equal group sizes: the half-width at the observed n is the observed one
    a, b = _normal(45, 0.8, 0.01, 4), _normal(46, 0.79, 0.01, 4)
    for x, y in [(A[:5], B[:5]), (a, b), (SAME, SAME[::-1])]:
        d = superiority(x, y)
        assert (d.verdict != NOT_SEPARABLE) == (d.seeds_needed <= len(x))


# --- formatting ---------------------------------------------------------------------------------------------

def test_fmt_decision():
    d = Decision(REPRODUCED, 0.0182, 0.0106, 0.0258, 0.0027, (5, 5), 3.0)
    assert fmt_decision(d) == "+1.82 points [+1.06, +2.58], p = 0.0027"
    assert fmt_decision(dataclasses.replace(d, p=1e-6), digits=1) == "+1.8 points [+1.1, +2.6], p < 1e-4"
    assert fmt_decision(dataclasses.replace(d, estimate=-0.5, lo=-0.7, hi=-0.3), scale=1.0, unit="dB") == \
        "-0.50 dB [-0.70, -0.30], p = 0.0027"
    e = equivalence(A, B, margin=0.04)
    assert "(90% interval)" in fmt_decision(e)
    assert "interval" not in fmt_decision(superiority(A, B))
    h = heterogeneity({"a": A, "b": B}, margin=0.01)
    assert "[" not in fmt_decision(h) and ", p = " in fmt_decision(h)
    assert fmt_decision(superiority([0.8], [0.7])) == "not measured"


def test_per_seed_target_counts_seeds_and_a_missing_figure_fails():
    bounds = {"drop": {"max": 0.5}, "speedup": {"min": 1.4}}
    runs = [{"drop": 0.5, "speedup": 1.4}, {"drop": 0.2, "speedup": 3.0}, {"drop": 0.6, "speedup": 9.0}]
    d = per_seed_target(runs, bounds)
    assert d.verdict == "target met in 2 of 3 seeds" and d.estimate == pytest.approx(2 / 3) and d.n == (3,)
    assert per_seed_target(runs[:2], bounds).verdict == "target met in every seed"
    assert per_seed_target([{"drop": 0.1, "speedup": None}], bounds).verdict == "target met in 0 of 1 seeds"
    assert per_seed_target([], bounds).verdict == NOT_MEASURED
    assert per_seed_target([{"drop": None, "speedup": None}], bounds).verdict == NOT_MEASURED  # not evaluated
    with pytest.raises(ValueError):
        per_seed_target(runs, {"drop": {"below": 0.5}})


def test_public_api():
    for name in rules.__all__:
        assert hasattr(rules, name)
    assert (REPRODUCED, NOT_REPRODUCED, NOT_SEPARABLE, NOT_MEASURED) == (
        "reproduced", "not reproduced", "not separable at this scale", "not measured")


def _brute_one_at(v, boundary, confidence=0.95):
    s, m = np.std(v, ddof=1), abs(np.mean(v) - boundary)
    for n in range(2, 1001):
        if stats.t.ppf(0.5 + confidence / 2, n - 1) * s / math.sqrt(n) < m:
            return n
    return math.inf


@pytest.mark.parametrize("effect", [-0.03, -0.012, -0.004, 0.0, 0.006, 0.02])
def test_margin_rules_need_the_seeds_that_clear_their_margin(effect):
    """A margin rule decides when its interval clears the margin, not 0: its seeds_needed is the brute-force
    count at that boundary (equivalence: the 90% interval inside, the 95% one outside), and a paired rule
    is decided at its own n exactly when seeds_needed <= n."""
    b = _normal(50, 0.8, 0.01, 4)
    a = [v + effect + e for v, e in zip(b, _normal(51, 0.0, 0.004, 4))]
    diff, m = np.subtract(a, b), 0.01
    eq = equivalence(a, b, m, paired=True)
    inside = abs(np.mean(diff)) < m
    assert eq.seeds_needed == _brute_one_at(diff, math.copysign(m, np.mean(diff)), 0.90 if inside else 0.95)
    ni = noninferiority(a, b, m, paired=True)
    assert ni.seeds_needed == _brute_one_at(diff, -m)
    sup = superiority(a, b, paired=True, by=0.005, side=-1)
    assert sup.seeds_needed == _brute_one_at(diff, -0.005)
    for d in (eq, ni, sup):
        assert (d.verdict != NOT_SEPARABLE) == (d.seeds_needed <= len(diff)), d
    ch = near_chance([0.1 + effect + e for e in _normal(52, 0.0, 0.01, 4)], 0.1, 0.01)
    assert ch.seeds_needed == _brute_one_at([0.1 + effect + e for e in _normal(52, 0.0, 0.01, 4)], 0.11)

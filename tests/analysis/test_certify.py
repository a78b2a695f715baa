"""The certified exit (recurvit.analysis.certify): Learn-then-Test on synthetic trajectories whose risk is
known holds its guarantee over repeated calibration draws, and says when no exit can be certified."""
import math

import pytest
import torch

from recurvit.analysis.certify import binomial_p, certify, grid, losses

K = 6


def population(n: int, seed: int) -> dict:
    """Synthetic trajectories: each image settles on its final answer at a random step; before that its
    answer is another class; its max-prob signal rises with the steps past settling, noisily, so an exit
    rule trades steps for disagreement and a too-low bar exits some images before they settle."""
    g = torch.Generator().manual_seed(seed)
    settle = torch.randint(1, K + 1, (n,), generator=g)
    final = torch.randint(0, 10, (n,), generator=g)
    k = torch.arange(1, K + 1).unsqueeze(1)
    preds = torch.where(k >= settle, final, (final + 1) % 10)
    sig = torch.sigmoid(1.5 * (k - settle).float() + 0.8 * torch.randn(K, n, generator=g))
    return {"preds": preds, "labels": final, "signals": {"max_prob": sig}}


def draw(pop: dict, idx: torch.Tensor) -> dict:
    return {"preds": pop["preds"][:, idx], "labels": pop["labels"][idx],
            "signals": {"max_prob": pop["signals"]["max_prob"][:, idx]}}


def test_the_certified_risk_holds_in_at_least_1_minus_delta_of_repeated_draws():
    pop = population(100_000, seed=0)
    thresholds = grid("max_prob", 100)
    risk = {t: losses(pop, "max_prob", t, K)[0].mean().item() for t in thresholds}  # the true risk of each
    eps, delta, draws, n = 0.05, 0.1, 200, 400
    g = torch.Generator().manual_seed(1)
    bad, saved, chosen = 0, [], []
    for _ in range(draws):
        res = certify(draw(pop, torch.randint(0, 100_000, (n,), generator=g)), "max_prob", eps, delta, K,
                      thresholds=thresholds)
        if res["certified"]:
            bad += risk[res["threshold"]] > eps
            saved.append(res["mean_steps"])
            chosen.append(res["threshold"])
    # the guarantee: P(risk of the chosen threshold > eps) <= delta; 3 binomial sds of slack for 200 draws
    assert bad / draws <= delta + 3 * math.sqrt(delta * (1 - delta) / draws)
    assert len(saved) > 0.9 * draws and sum(saved) / len(saved) < K - 1  # not vacuous: it saves steps
    # and not loose to uselessness: the median certified bar is near the most aggressive one whose true risk
    # is within eps (fixed-sequence: every less aggressive one within eps too)
    best = min(t for t in thresholds if all(risk[u] <= eps for u in thresholds if u >= t))
    assert abs(sorted(chosen)[len(chosen) // 2] - best) < 0.15


def test_no_exit_is_certified_when_every_early_answer_changes():
    pop = population(2_000, seed=3)
    pop["preds"][:-1] = (pop["preds"][-1] + 1) % 10  # every answer before the last step differs from it
    res = certify(pop, "max_prob", 0.05, 0.1, K, thresholds=grid("max_prob", 50))
    assert res["mean_steps"] == K and res["risk"] == 0  # only bars that exit no image are certified
    res = certify(pop, "max_prob", 0.05, 0.1, K, thresholds=grid("max_prob", 50)[1:])  # without the trivial bar
    assert not res["certified"] and res["threshold"] is None and res["mean_steps"] == K


def test_the_grid_runs_from_the_least_to_the_most_aggressive_exit_and_p_values_are_binomial():
    assert grid("max_prob", 5) == [1.0, 0.75, 0.5, 0.25, 0.0]
    kl = grid("kl", 5)
    assert kl == sorted(kl) and kl[0] == pytest.approx(1e-8) and kl[-1] == pytest.approx(10.0)
    assert binomial_p(0, 100, 0.05) == pytest.approx(0.95 ** 100)
    with pytest.raises(ValueError):
        certify(population(10, 0), "max_prob", 0.0, 0.1, K)

"""Plots people can read: accuracy in %, every Pareto point named, colour bars labelled on a scale
that shows the differences, markers explained, plots titled with what they show."""
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from recurvit.study import plots


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved during the test (saved to disk as usual)."""
    seen = []
    real = Figure.savefig

    def keep(self, *a, **kw):
        seen.append(self)
        return real(self, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    return seen


def _ms(mean, ci=0.01):
    return {"mean": mean, "ci": ci}


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_pareto_points_are_labelled_even_at_one_cost_and_accuracy_is_in_percent(tmp_path, figures):
    cells = [{"cell": f"steps={k}", "shares_blocks": True, "params_stored": 1000, "flops_forward": 1e6 * k,
              "acc_T": _ms(0.80 + 0.01 * k)} for k in (2, 4, 8)]
    cells.append({"cell": "vit", "shares_blocks": False, "params_stored": 6000, "flops_forward": 6e6,
                  "acc_T": _ms(0.9)})
    plots.cost_fronts(cells, tmp_path, "s")
    assert len(figures) == 2
    for fig in figures:
        ax = fig.axes[0]
        assert isinstance(ax.yaxis.get_major_formatter(), PercentFormatter) and "(%)" in ax.get_ylabel()
        assert sorted(_texts(fig)) == sorted(c["cell"] for c in cells)
    # the three recurrent cells share one x (stored parameters): their labels do not sit on each other
    offsets = [t.xyann for t in figures[0].axes[0].texts if t.get_text().startswith("steps=")]
    assert len(set(offsets)) == 3


def test_horizon_and_frontier_plots_are_in_percent(tmp_path, figures):
    cells = [{"cell": c, "steps": 2, "horizon": [0.5, 0.8, 0.7], "acc_T": _ms(0.8), "acc_mean_T_4T": _ms(0.7),
              "acc_16T": _ms(0.3)} for c in ("a", "b")]
    plots.horizon(cells, tmp_path, "s", 0.1)
    plots.frontier(cells, tmp_path, "s", 0.1)
    for fig in figures:
        for ax in fig.axes:
            assert isinstance(ax.yaxis.get_major_formatter(), PercentFormatter)


def test_cka_and_pruning_colour_bars_are_labelled(tmp_path, figures):
    from recurvit.analysis.per_step_report import write_outputs

    K = 3
    cka = [[1.0 if i == j else 0.95 for j in range(K + 1)] for i in range(K + 1)]
    res = {"meta": {"steps": K, "nominal_steps": K, "heads": 2, "mlp_slices": 2, "shares_blocks": True,
                    "core": "recurrent", "runs_as": "recurrent", "images": 10, "tokens": 4, "mlp_hidden": 8,
                    "calls_per_step": {1: 1}},
           "cka": {"labels": ["emb", "1", "2", "3"], "tokens": cka, "pooled": cka},
           "pruning": {"base_acc": 0.9, "heads": [{"step": k, "head": h, "accuracy": 0.8, "drop": 0.1}
                                                  for k in range(1, K + 1) for h in range(2)],
                       "mlp": [{"step": k, "slice": j, "accuracy": 0.85, "drop": 0.05}
                               for k in range(1, K + 1) for j in range(2)],
                       "skip": [{"step": k, "accuracy": 0.5, "drop": 0.4} for k in range(1, K + 1)]}}
    write_outputs(res, tmp_path, title="t")
    labels = [ax.get_ylabel() for fig in figures for ax in fig.axes]
    cka_bar = next(lbl for lbl in labels if "CKA" in lbl)
    assert "scale from 0.9" in cka_bar  # values between 0.95 and 1 do not all render at the top of 0..1
    assert sum("accuracy drop (points" in lbl for lbl in labels) == 2


def test_mixture_weights_near_uniform_are_told_apart(tmp_path, figures):
    from recurvit.analysis.mixture import plot_mixture

    r, U, N, B = 4, 2, 16, 2
    w = torch.full((B, U, N, r), 0.25)
    w[..., 0] += 0.02
    w[..., 1] -= 0.02  # SoftMoR-like weights, all within 0.02 of uniform
    plot_mixture(w, torch.rand(B, 1, 8, 8), w.mean(dim=(0, 2)), tmp_path / "m.png")
    fig = figures[-1]
    images = [im for ax in fig.axes for im in ax.images][1:]  # after the first input image
    weights = [im for im in images if im.get_cmap().name == "RdBu_r"]
    lo, hi = weights[0].get_clim()
    assert lo == pytest.approx(0.23, abs=1e-6) and hi == pytest.approx(0.27, abs=1e-6)
    bar = next(ax.get_ylabel() for ax in fig.axes if "mixture weight" in ax.get_ylabel())
    assert "uniform 1/4 = 0.25" in bar


def test_exit_plot_explains_its_stars_and_the_horizon_plot_names_its_run(tmp_path, figures):
    from recurvit.analysis.anytime import plot
    from recurvit.analysis.horizon import plot as horizon_plot

    rows = [{"mean_steps": 2.0, "accuracy": 0.7}, {"mean_steps": 3.0, "accuracy": 0.8}]
    plot([{"title": "run", "T": 4, "fixed": [0.5, 0.6, 0.7, 0.8], "curves": {"max_prob": {"rows": rows,
                                                                                          "point": rows[1]}}}],
         tmp_path / "exit.png")
    legend = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert "threshold chosen on the calibration split" in legend and "trained steps T = 4" in legend
    horizon_plot({"m": {"step": [1, 2], "accuracy": [0.5, 0.6]}}, 1, tmp_path / "h.png", title="myrun: m")
    assert figures[-1].axes[0].get_title() == "myrun: m"
    assert isinstance(figures[-1].axes[0].yaxis.get_major_formatter(), PercentFormatter)
    assert Path(tmp_path / "h.png").stat().st_size > 1000

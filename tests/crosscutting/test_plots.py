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
    yield seen
    for fig in seen:  # every figure any test here saves can be read: nothing cut off, empty or ambiguous
        assert not unreadable(fig), unreadable(fig)


def unreadable(fig):
    """What a reader could not read in ``fig`` (drawn again with Agg): text running off the figure, an
    accuracy axis not in %, two y ticks with the same label, a panel with nothing drawn in it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    box, problems = fig.bbox, []

    def outside(e):
        return e is not None and (e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1)

    texts = [fig._suptitle, *fig.texts] + [t for ax in fig.axes for t in (
        ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts)]
    for t in texts:
        if t is not None and t.get_visible() and t.get_text().strip() and outside(t.get_window_extent(r)):
            problems.append(f"cut off: {t.get_text()!r}")
    titles = [t.get_window_extent(r) for ax in fig.axes for t in (ax.title,) if t.get_text().strip()]
    if any(a.overlaps(b) for i, a in enumerate(titles) for b in titles[i + 1:]):
        problems.append("titles run into each other")
    for ax in fig.axes:  # the tick labels drawn (a log axis keeps labels of ticks outside its view: not drawn)
        for axis in (ax.xaxis, ax.yaxis):
            if outside(axis.get_tightbbox(r)):
                problems.append(f"tick labels cut off: {[t.get_text() for t in axis.get_ticklabels()]}")
        if ax.get_legend() is not None and outside(ax.get_legend().get_window_extent(r)):
            problems.append("legend cut off")
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>" or not ax.get_visible():
            continue
        ylabel = ax.get_ylabel().lower()
        if ("accuracy" in ylabel or "solved" in ylabel) and "points" not in ylabel:
            in_points = max(abs(v) for v in ax.get_ylim()) > 1.5  # values already x100 (plots.series)
            if "(%)" not in ylabel or not (isinstance(ax.yaxis.get_major_formatter(), PercentFormatter) or in_points):
                problems.append(f"not in %: {ax.get_ylabel()!r}")
        lo, hi = sorted(ax.get_ylim())
        ticks = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi and t.get_text()]
        if len(set(ticks)) < len(ticks):
            problems.append(f"y ticks repeat: {ticks}")
        drawn = [a for a in ax.lines + ax.images + ax.collections if a.get_visible()] + [
            p for p in ax.patches if p.get_visible() and min(p.get_window_extent(r).size) > 0.5]  # a 0-high bar: nothing
        if ax.axison and not drawn and not ax.texts:
            problems.append(f"empty panel: {ax.get_title()!r}")
    return problems


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
    bars = [ax.get_ylabel() for fig in figures for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert sum("accuracy drop (points" in lbl for lbl in bars) == 2


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
    assert "uniform 1/4 = 0.25" in " ".join(bar.split())  # (wrapped to the colour bar's height)


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


LONG_RUN = "fashion_mnist-bvit_tiny-ode-rk4-20261205-120000-seed3"  # a run directory's name, as titles carry it


def test_per_step_figures_read_in_percent_with_zero_skip_drops_shown_and_titles_whole(tmp_path, figures):
    """Issue 41, item 7: pruning.png's skip panel says 0.0 when skipping a step changes nothing (it was an
    empty panel), its titles stay inside the figure; steps.png reads accuracy in %."""
    from recurvit.analysis.per_step_report import write_outputs

    K, H, S = 8, 3, 4
    res = {"meta": {"steps": K, "nominal_steps": K, "heads": H, "mlp_slices": S, "shares_blocks": True,
                    "core": "ode", "runs_as": "ode", "images": 10, "tokens": 4, "mlp_hidden": 8,
                    "calls_per_step": {1: 4}, "max_entropy": 1.4, "uniform_distance": 1.0},
           "readout": {"step": list(range(1, K + 1)), "accuracy": [0.5 + 0.05 * k for k in range(K)],
                       "loss": [1.0] * K},
           "norms": {"step": list(range(K + 1)), "state_norm": [1.0 + k for k in range(K + 1)],
                     "rel_update": [float("nan")] + [0.5 / (k + 1) for k in range(K)]},
           "attention": [{"step": k, "head": h, "entropy": 1.0, "distance": 0.5, "calls": 4}
                         for k in range(1, K + 1) for h in range(H)],
           "pruning": {"base_acc": 0.9722, "heads": [{"step": k, "head": h, "accuracy": 0.97, "drop": 0.002 * h}
                                                     for k in range(1, K + 1) for h in range(H)],
                       "mlp": [{"step": k, "slice": j, "accuracy": 0.97, "drop": -0.001 * j}
                               for k in range(1, K + 1) for j in range(S)],
                       "skip": [{"step": k, "accuracy": 0.9722, "drop": 0.0} for k in range(1, K + 1)]}}
    write_outputs(res, tmp_path, title=f"{LONG_RUN}: bvit_tiny (ode, rk4, 8 steps, t in [0, 8]) on fashion_mnist, "
                                       "10000 test images")
    steps = next(f for f in figures if any("read out" in ax.get_title() for ax in f.axes))
    assert isinstance(steps.axes[0].yaxis.get_major_formatter(), PercentFormatter)
    pruning = figures[-1]
    skip = next(ax for ax in pruning.axes if "skipped" in ax.get_title())
    assert "97.2%" in skip.get_title()  # the accuracy with every step, in % as everywhere else
    assert [t.get_text() for t in skip.texts].count("0.0") == K  # every bar says its (zero) drop
    # the checks of the `figures` fixture: no text cut off, no empty panel, accuracy in %


def test_horizon_title_wraps_and_close_accuracies_get_their_decimals(tmp_path, figures):
    """horizon.png's title (with a long run name) stays in the figure; acc_vs_params.png's ticks between 97.0%
    and 97.6% read 97.0%, 97.2%, ... (they all read "97%")."""
    from recurvit.analysis.horizon import plot as horizon_plot

    horizon_plot({"bvit_tiny (ode, rk4, 6 steps)": {"step": [1, 2, 3], "accuracy": [0.5, 0.6, 0.55]}}, 2,
                 tmp_path / "h.png", chance=0.1,
                 title=f"{LONG_RUN}: bvit_tiny (ode, rk4, 6 steps) on fashion_mnist, trained T = 6, swept to 96 steps")
    assert LONG_RUN in figures[-1].axes[0].get_title()
    cells = [{"cell": f"steps={k}", "shares_blocks": True, "params_stored": 1000 * k, "flops_forward": 1e6 * k,
              "acc_T": _ms(0.970 + 0.001 * k, 0.0005)} for k in (1, 2, 4, 6)]
    plots.cost_fronts(cells, tmp_path, "s")
    ax = figures[-2].axes[0]
    ticks = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
    assert len(ticks) >= 3 and all("." in t for t in ticks), ticks


def test_every_study_and_analysis_plot_is_readable(tmp_path, figures):
    """The other figures recurvit saves, drawn from small inputs and read by the `figures` fixture."""
    from recurvit.analysis.mazes import plot_solved

    cells = [{"cell": c, "steps": 2, "horizon": [0.5, 0.8, 0.7], "acc_T": _ms(0.8), "acc_mean_T_4T": _ms(0.7),
              "acc_16T": _ms(0.3), "curve": [0.5, 0.9], "params_stored": 10, "psnr": _ms(20.0)} for c in ("a", "b")]
    plots.epochs(cells, tmp_path, "s")
    plots.every_run([{"cell": "a", "seed": 0, "val_acc_curve": [0.5, 0.9]}], lambda r: r["cell"], tmp_path, "s")
    plots.psnr_vs_params(cells, tmp_path, "s")
    plots.series({"mix": [(1, _ms(0.97)), (2, _ms(0.972))]}, tmp_path / "series.png", "t", "r", "accuracy (%)")
    plot_solved({9: {"step": [1, 2, 4], "solved": [0.1, 0.5, 0.9]}}, 2, tmp_path / "solved.png", title="mazes")
    assert len(figures) == 5


def test_recon_grid_labels_its_rows(tmp_path, figures):
    """recon_grid.png says which row holds the originals and which the reconstructions (and their loops)."""
    from recurvit.tasks.vae.evaluate import build_vae_model, save_grid
    from recurvit.tasks.vae.config import load_vae_config

    cfg = load_vae_config("vae/digits", ["model.embed_dim=8"])
    cfg.model.in_chans, cfg.model.img_size = 1, 8
    model = build_vae_model(cfg)
    save_grid(model, [torch.rand(1, 8, 8) for _ in range(5)], tmp_path / "recon_grid.png", torch.device("cpu"), n=4)
    ax = figures[-1].axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows[0] == "original" and rows[1].startswith("reconstruction")
    assert Path(tmp_path / "recon_grid.png").stat().st_size > 1000

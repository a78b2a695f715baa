"""The README's findings: each claim of the seed abstracts against the study that measures it here,
with the number that decides it.

    python scripts/findings.py          # reads results/*/results.csv (and results/anytime*), writes results/findings.md
                                        # and results/findings_softmor_r.png (accuracy against SoftMoR's r)
    python scripts/findings.py --check  # CI: fails when findings.md is out of date

Nothing here trains or evaluates: it reads the committed results files of ``recurvit study`` and
``experiments/anytime.py``. The rules were fixed before the results were read (``RULES`` below):
a claim that a difference has a sign is "reproduced" when the 95% Welch interval of the difference
(over seeds) lies on that side of zero, "not reproduced" when it lies on the other side, and "not
separable at this scale" otherwise; a claim that something does NOT improve is reproduced unless
the gain is significant. A claim whose study has not produced its results file yet says so and
names the command that produces it.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "results"  # the default of --results


def _experiment_target() -> Dict[str, float]:
    """The target of issue 15, as experiments/anytime.py defines it (one definition for both)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("anytime_experiment", ROOT / "experiments" / "anytime.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TARGET


TARGET = _experiment_target()

from recurvit.study.stats import fmt_p, mean_ci, ols_contrast, welch  # noqa: E402

NEAR_CHANCE = 0.05   # "near-random": within 5 points of chance
COMPETITIVE_DB = 1.0  # "competitive PSNR": the shared model is at most 1 dB below its unshared twin
RULES = (f"Verdicts (rules fixed before reading the results): a signed claim is **reproduced** when the 95% "
         "Welch interval of the difference over seeds (for a trend over r: the 95% interval of its least-squares "
         "slope, every run one observation) lies on the claimed side of zero, **not reproduced** when "
         "it lies on the other side, **not separable at this scale** otherwise; a claim of no gain is reproduced "
         f"unless the gain is significant; \"near-random\" means within {NEAR_CHANCE * 100:g} points of chance "
         f"(the interval's upper end), \"competitive\" PSNR at most {COMPETITIVE_DB:g} dB below (the interval's "
         "lower end).")
Row = Dict[str, str]


def load(results: Path, name: str) -> Optional[List[Row]]:
    path = results / name / "results.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def values(rows: List[Row], key: str, **where: str) -> List[float]:
    out = []
    for r in rows:
        if all(r.get(k) == v for k, v in where.items()) and r.get(key) not in (None, ""):
            out.append(float(r[key]))
    return out


def one_sample(vals: Sequence[float]) -> Dict[str, float]:
    """Mean of per-run differences, its 95% t-interval and the one-sample t-test p-value (against 0)."""
    from scipy import stats

    m = mean_ci(vals)
    if m["n"] < 2:
        return {"diff": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan}
    p = float(stats.ttest_1samp(vals, 0.0).pvalue) if m["std"] > 0 else (0.0 if m["mean"] else 1.0)
    return {"diff": m["mean"], "lo": m["mean"] - m["ci"], "hi": m["mean"] + m["ci"], "p": p}


def signed(w: Dict[str, float], sign: int) -> str:
    if math.isnan(w["diff"]):
        return "not measured (fewer than 2 seeds)"
    lo, hi = (w["lo"], w["hi"]) if sign > 0 else (-w["hi"], -w["lo"])
    return "reproduced" if lo > 0 else "not reproduced" if hi < 0 else "not separable at this scale"


def no_gain(w: Dict[str, float]) -> str:
    if math.isnan(w["diff"]):
        return "not measured (fewer than 2 seeds)"
    return "not reproduced" if w["lo"] > 0 else "reproduced"


def diff_text(label: str, w: Dict[str, float], scale: float = 100.0, unit: str = "points") -> str:
    return (f"{label}: {w['diff'] * scale:+.2f} {unit} [{w['lo'] * scale:+.2f}, {w['hi'] * scale:+.2f}], "
            f"p = {fmt_p(w['p'])}")


# ----------------------------------------------------------------------------- the claims
def matched_flops(rows):  # Crossroads (i): ViTs preferable when FLOPs are the constraint
    w = welch(values(rows, "acc_T", regime="vit_matched_flops"), values(rows, "acc_T", regime="naive"))
    return diff_text("ViT (matched FLOPs) − bViT, acc@T", w), signed(w, +1)


def matched_params(rows):  # Crossroads (i): recurrent ViTs better under memory constraints
    w = welch(values(rows, "acc_T", regime="naive"), values(rows, "acc_T", regime="vit_matched_params"))
    return diff_text("bViT − ViT (matched parameters), acc@T", w), signed(w, +1)


def ds_nominal(rows):  # Crossroads (iii): deep supervision does not improve nominal accuracy
    w = welch(values(rows, "acc_T", regime="ds3"), values(rows, "acc_T", regime="naive"))
    return diff_text("deep supervision (3 stages) − naive, acc@T", w), no_gain(w)


def ds_beyond(rows):  # Crossroads (iii): deep supervision degrades gracefully far beyond the horizon
    w = welch(values(rows, "acc_16T", regime="ds3"), values(rows, "acc_16T", regime="naive"))
    return diff_text("deep supervision (3 stages) − naive, acc@16T", w), signed(w, +1)


def naive_collapse(rows):  # Crossroads (iii): naive recurrence collapses to near-random far beyond T
    acc = mean_ci(values(rows, "acc_16T", regime="naive"))
    chance = values(rows, "chance", regime="naive")
    if acc["n"] < 2 or not chance:
        return "acc@16T not measured", "not measured"
    lo, hi, c = acc["mean"] - acc["ci"], acc["mean"] + acc["ci"], chance[0]
    verdict = ("reproduced" if hi <= c + NEAR_CHANCE else "not reproduced" if lo > c + NEAR_CHANCE
               else "not separable at this scale")
    seeds = ", ".join(f"{v * 100:.1f}" for v in values(rows, "acc_16T", regime="naive"))
    return (f"naive acc@16T {acc['mean'] * 100:.1f}% [{lo * 100:.1f}, {hi * 100:.1f}] (seeds: {seeds}) against "
            f"chance {c * 100:.0f}%"), verdict


def black_box(rows):  # Crossroads: the black-box field dz/dt = F(z) costs a few points
    w = welch(values(rows, "acc_T", regime="ode_euler"), values(rows, "acc_T", regime="ode_blackbox"))
    return diff_text("state-subtracted − black-box field (Euler), acc@T, 3 epochs", w), signed(w, +1)


def solver_bias(rows):  # Crossroads (ii): solver order is an architectural bias, not refinement
    refine, cross = [], []  # one value per run (the runs are the independent units)
    for r in rows:
        own = float(r["acc_T"])
        if r.get("variant_refine_h/4"):
            refine.append(float(r["variant_refine_h/4"]) - own)
        others = [float(r[f"variant_eval_{m}"]) - own for m in ("euler", "midpoint", "heun3", "rk4")
                  if r.get(f"variant_eval_{m}") and m != r["solver"]]
        if others:
            cross.append(sum(others) / len(others))
    wr, wc = one_sample(refine), one_sample(cross)
    text = (diff_text("refined at h/4 − as trained (same field)", wr) + "; "
            + diff_text("evaluated with the other solvers − as trained (mean per run)", wc))
    bias = signed(wc, -1) == "reproduced" and no_gain(wr) == "reproduced"
    return text, ("reproduced" if bias else "not reproduced" if signed(wr, +1) == "reproduced"
                  else "not separable at this scale")


def solver_order(rows):  # Crossroads (ii): the gains of higher-order solvers are not uniform
    ws = {m: welch(values(rows, "acc_T", solver=m), values(rows, "acc_T", solver="euler"))
          for m in ("midpoint", "heun3", "rk4")}
    text = "; ".join(diff_text(f"{m} − euler, acc@T", w) for m, w in ws.items() if not math.isnan(w["diff"]))
    missing = [m for m, w in ws.items() if math.isnan(w["diff"])]
    if missing:  # a partial study: say which solvers it still lacks
        return text or "-", f"not measured yet (fewer than 2 seeds of {', '.join(missing)})"
    # uniform gains: every higher order significantly ahead of Euler
    return text, "not reproduced" if all(w["lo"] > 0 for w in ws.values()) else "reproduced"


def width(rows):  # bViT: wider bViTs recover much more of the ViT's performance
    def gaps(w: str) -> List[float]:
        # the grid's model axis labels the runs (bvit / vit); the core says which is which
        vit = {r["train.seed"]: float(r["acc_T"]) for r in rows if r["width"] == w and r["core"] == "stack"}
        bvit = {r["train.seed"]: float(r["acc_T"]) for r in rows if r["width"] == w and r["core"] == "recurrent"}
        return [vit[s] - bvit[s] for s in sorted(vit.keys() & bvit.keys())]
    widths = sorted({r["width"] for r in rows}, key=lambda w: int(w.lstrip("w")))
    narrow, wide = widths[0], widths[-1]
    w = welch(gaps(narrow), gaps(wide))
    return diff_text(f"gap (ViT − bViT, same seed) at {narrow} − gap at {wide}", w), signed(w, +1)


def softmor_gain(rows):  # SR-ViT: accuracy rises with recursion depth r (SoftMoR, the paper-sized router)
    w = welch(values(rows, "acc_T", variant="r4_query"), values(rows, "acc_T", variant="r1"))
    return diff_text("SoftMoR r = 4 (query router) − r = 1, acc@T", w), signed(w, +1)


def plain_recursion(rows):  # SR-ViT: simply increasing recursion depth does not reliably improve
    w = welch(values(rows, "acc_T", variant="r4_last"), values(rows, "acc_T", variant="r1"))
    return diff_text("plain recursion r = 4 − r = 1, acc@T", w), no_gain(w)


def softmor_vs_plain(rows):  # SR-ViT: mixing all steps beats passing the last one on
    w = welch(values(rows, "acc_T", variant="r4_query"), values(rows, "acc_T", variant="r4_last"))
    return diff_text("SoftMoR (query) − plain recursion at r = 4, acc@T", w), signed(w, +1)


MIXTURES = ("query", "last", "linear")  # the fashion_softmor variants r<r>_<mixture>; r1 is all three at r = 1


def softmor_slopes(rows) -> Dict[str, Dict[str, float]]:
    """Slopes of acc@T over the recursion depth r = 1..4, one per mixture, in one least-squares model
    with every run one observation: acc = a + sum_m b_m (r - 1) [mixture m] (the r = 1 runs are the
    same ViT for every mixture, hence one intercept). Returns b_query, b_last and b_query - b_last."""
    x, y = [], []
    for r in rows:
        depth, _, mix = r["variant"].lstrip("r").partition("_")
        if mix and mix not in MIXTURES:
            continue
        x.append([1.0] + [(int(depth) - 1.0) * (mix == m) for m in MIXTURES])
        y.append(float(r["acc_T"]))
    return {"query": ols_contrast(x, y, [0, 1, 0, 0]), "last": ols_contrast(x, y, [0, 0, 1, 0]),
            "query − last": ols_contrast(x, y, [0, 1, -1, 0])}


def softmor_figure(rows, path: Path) -> str:
    """acc@T against r, one line per mixture (r = 1 is the same runs for all), 95% t-intervals over seeds."""
    from recurvit.study import plots

    names = {"query": "SoftMoR, query router", "linear": "SoftMoR, linear router", "last": "plain recursion"}
    lines = {}
    for mix, label in names.items():
        pts = []
        for depth in range(1, 5):
            acc = values(rows, "acc_T", variant="r1" if depth == 1 else f"r{depth}_{mix}")
            if acc:
                pts.append((depth, mean_ci(acc)))
        lines[label] = pts
    return plots.series(lines, path, "SR-ViT, Fashion-MNIST: acc@T against r (95% intervals)",
                        "recursions per block r", "test accuracy at T (%)")


def softmor_trend(rows):  # SR-ViT: accuracy rises with r for SoftMoR (trend over every r, not only 1 vs 4)
    w = softmor_slopes(rows)["query"]
    return diff_text("slope of acc@T over r = 1..4, SoftMoR (query), per added recursion", w), signed(w, +1)


def softmor_trend_vs_plain(rows):  # the issue's question: does it rise for SoftMoR and not for plain recursion?
    w = softmor_slopes(rows)
    return (diff_text("slope over r = 1..4, plain recursion", w["last"]) + "; "
            + diff_text("SoftMoR (query) slope − plain slope", w["query − last"])), signed(w["query − last"], +1)


def vae_sharing(rows, operator: str):  # LoopVAE: competitive PSNR under global sharing
    shared, unshared = f"{operator}_shared", f"{operator}_unshared"
    w = welch(values(rows, "psnr", variant=shared), values(rows, "psnr", variant=unshared))
    if math.isnan(w["diff"]):
        return "PSNR not measured", "not measured"
    text = diff_text(f"shared − unshared {operator} core, PSNR", w, 1.0, "dB")
    # a comparison with a reference that did not learn (at the mean-image baseline) tests nothing
    ref, base = mean_ci(values(rows, "psnr", variant=unshared)), mean_ci(values(rows, "baseline_psnr", variant=unshared))
    if not math.isnan(base["mean"]) and ref["mean"] < base["mean"] + COMPETITIVE_DB:
        return (text + f"; the unshared reference is at the mean-image baseline ({ref['mean']:.2f} vs "
                f"{base['mean']:.2f} dB): it did not train"), "not tested (the reference did not train)"
    verdict = ("reproduced" if w["lo"] >= -COMPETITIVE_DB else "not reproduced" if w["hi"] < -COMPETITIVE_DB
               else "not separable at this scale")
    return text, verdict


# The 3-epoch table (fashion_mnist_crossroads) against the same regimes trained to a plateau (fashion_converged):
# (comparison, figure, regime a and b in the 3-epoch study, the same in the converged study, claimed sign).
SURVIVAL = [
    ("ViT (matched FLOPs) − bViT", "acc_T", ("vit_matched_flops", "naive"), ("vit_matched_flops", "naive")),
    ("bViT − ViT (matched parameters)", "acc_T", ("naive", "vit_matched_params"), ("naive", "vit_matched_params")),
    ("deep supervision − naive", "acc_T", ("deep_supervision", "naive"), ("ds3", "naive")),
    ("deep supervision − naive", "acc_4T", ("deep_supervision", "naive"), ("ds3", "naive")),
    ("random depth − naive", "acc_T", ("random_depth", "naive"), ("random_depth", "naive")),
    ("random depth − naive", "acc_4T", ("random_depth", "naive"), ("random_depth", "naive")),
]


def survival(results: Path) -> List[str]:
    """Which verdicts of the 3-epoch table survive training to a plateau (issue 13, study 6)."""
    short, long = load(results, "fashion_mnist_crossroads"), load(results, "fashion_converged")
    if short is None or long is None:
        return []
    lines = ["Which verdicts of the 3-epoch table survive training to a plateau (10 epochs); a verdict here is "
             "the side of zero the 95% interval lies on (\"none\": it straddles zero):", "",
             "| comparison | figure | 3 epochs | 10 epochs | survives |", "|---|---|---|---|---|"]

    def side(w: Dict[str, float]) -> str:
        return "+" if w["lo"] > 0 else "−" if w["hi"] < 0 else "none"

    for label, key, (a3, b3), (a10, b10) in SURVIVAL:
        w3 = welch(values(short, key, regime=a3), values(short, key, regime=b3))
        w10 = welch(values(long, key, regime=a10), values(long, key, regime=b10))
        if math.isnan(w3["diff"]) or math.isnan(w10["diff"]):
            continue
        cell = [f"{w['diff'] * 100:+.1f} [{w['lo'] * 100:+.1f}, {w['hi'] * 100:+.1f}] ({side(w)})" for w in (w3, w10)]
        same = "yes" if side(w3) == side(w10) else "no"
        lines.append(f"| {label} | {key.replace('acc_', 'acc@')} | {cell[0]} | {cell[1]} | {same} |")
    return [""] + lines


def anytime(results: Path, name: str, kind: str) -> Optional[Tuple[str, str]]:
    """The best exit criterion of a run kind (most speedup among those within the target drop) and
    whether its means meet the target of issue 15 (``anytime``), or whether adaptive depth past T
    is more accurate than fixed T (``anytime_beyond``)."""
    cells: Dict[str, List[dict]] = {}
    for p in sorted((results / name / "runs").glob(f"{kind}__seed=*/*/exit.json")):
        cells.setdefault(p.parent.name, []).append(json.loads(p.read_text())["test"])
    if not cells:
        return None
    stats = {c: {k: mean_ci([t[k] for t in ts]) for k in ("drop_points", "steps_pct_T", "speedup")}
             for c, ts in cells.items()}
    if name == "anytime_beyond":  # the most accurate criterion, and is it above fixed T?
        best = min(stats, key=lambda c: stats[c]["drop_points"]["mean"])
        w = one_sample([-t["drop_points"] / 100 for t in cells[best]])
        return (f"{kind}, {best}: " + diff_text("adaptive (≤ 2T) − fixed T", w)
                + f", {stats[best]['steps_pct_T']['mean']:.0f}% of T's steps"), \
            {"reproduced": "yes", "not reproduced": "no: below fixed T"}.get(signed(w, +1), signed(w, +1))
    best = max(stats, key=lambda c: (stats[c]["drop_points"]["mean"] <= TARGET["drop_points"],
                                     stats[c]["speedup"]["mean"]))
    s = stats[best]
    missed = [k for k, ok in (("drop", s["drop_points"]["mean"] <= TARGET["drop_points"]),
                              ("steps", s["steps_pct_T"]["mean"] <= TARGET["steps_pct_T"]),
                              ("speedup", s["speedup"]["mean"] >= TARGET["speedup"])) if not ok]
    return (f"{kind}, best criterion {best}: drop {s['drop_points']['mean']:+.2f} ± {s['drop_points']['ci']:.2f} "
            f"points, {s['steps_pct_T']['mean']:.0f}% of T's steps, {s['speedup']['mean']:.2f}x "
            f"± {s['speedup']['ci']:.2f} measured speedup (n = {len(cells[best])})"), \
        ("target met (means)" if not missed else "target missed: " + ", ".join(missed))


CLAIMS: List[Tuple[str, str, str, Callable]] = [
    ("Crossroads", "standard ViTs remain preferable when FLOPs are the constraint", "fashion_converged", matched_flops),
    ("Crossroads", "recurrent ViTs offer a better accuracy–parameter trade-off", "fashion_converged", matched_params),
    ("Crossroads", "deep supervision does not improve nominal accuracy", "fashion_converged", ds_nominal),
    ("Crossroads", "deep supervision degrades gracefully far beyond the horizon", "fashion_converged", ds_beyond),
    ("Crossroads", "naive recurrence collapses to near-random far beyond the horizon", "fashion_converged",
     naive_collapse),
    ("Crossroads", "the black-box field dz/dt = F(z) costs a few accuracy points", "fashion_mnist_crossroads",
     black_box),
    ("Crossroads", "solver order acts as an architectural bias, not numerical refinement", "fashion_solver",
     solver_bias),
    ("Crossroads", "the gains of higher-order solvers are not uniform", "fashion_solver", solver_order),
    ("bViT", "wider bViTs recover much more of the ViT's performance", "fashion_width", width),
    ("SR-ViT", "SoftMoR improves as recursion depth increases (r = 1 → 4)", "fashion_softmor", softmor_gain),
    ("SR-ViT", "simply increasing recursion depth does not reliably improve performance", "fashion_softmor",
     plain_recursion),
    ("SR-ViT", "mixing every recursion step beats passing on the last", "fashion_softmor", softmor_vs_plain),
    ("SR-ViT", "SoftMoR improves as recursion depth increases (the trend over r = 1..4)", "fashion_softmor",
     softmor_trend),
    ("SR-ViT", "accuracy rises faster with r for SoftMoR than for plain recursion (the trends over r = 1..4)",
     "fashion_softmor", softmor_trend_vs_plain),
    ("LoopVAE", "competitive PSNR with far fewer stored parameters (conv core vs its unshared twin)", "loopvae",
     lambda rows: vae_sharing(rows, "conv")),
    ("LoopVAE", "competitive PSNR under global sharing (transformer core)", "loopvae",
     lambda rows: vae_sharing(rows, "transformer")),
]
COMMANDS = {"fashion_converged": "studies/fashion_converged.yaml", "fashion_mnist_crossroads": "studies/fashion_crossroads.yaml",
            "fashion_solver": "studies/fashion_solver.yaml", "fashion_width": "studies/fashion_width.yaml",
            "fashion_softmor": "studies/fashion_softmor.yaml", "loopvae": "studies/loopvae.yaml"}


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of the study results (default: results/)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when findings.md differs from what the results files give (CI)")
    args = ap.parse_args(list(argv))
    lines = ["Generated by `python scripts/findings.py` from the committed results files; do not edit by hand.", "",
             RULES, "", "| source | claim | study (Fashion-MNIST unless named) | deciding figure | verdict |",
             "|---|---|---|---|---|"]
    for source, claim, study, fn in CLAIMS:
        rows = load(args.results, study)
        if rows is None:
            text, verdict = f"`recurvit study {COMMANDS[study]}` has not reported yet", "not measured yet"
        else:
            text, verdict = fn(rows)
        link = f"[{study}](results/{study}/report.md)" if rows is not None else study
        lines.append(f"| {source} | {claim} | {link} | {text} | **{verdict}** |")
    target = (f"exit early at no more than {TARGET['drop_points']:g} points of accuracy (target: ≤ "
              f"{TARGET['steps_pct_T']:g}% of T's steps, ≥ {TARGET['speedup']:g}x images/s)")
    for name, title in (("anytime", target),
                        ("anytime_beyond", "does adaptive depth allowed past the horizon (up to 2T) beat fixed depth T? "
                                           "(its most accurate criterion)")):
        for kind in ("ds3", "random_depth", "vit_ds6_heads", "naive"):
            got = anytime(args.results, name, kind)
            if got:
                lines.append(f"| recurvit (issue 15) | {title} | [{name}](results/{name}/report.md) | {got[0]} | "
                             f"**{got[1]}** |")
    lines += survival(args.results)
    out, text = args.results / "findings.md", "\n".join(lines) + "\n"
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is out of date: run python scripts/findings.py")
            return 1
        print(f"{out} up to date")
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    softmor = load(args.results, "fashion_softmor")
    if softmor is not None:  # the README's SoftMoR figure (a picture of the two trend rows above)
        print(f"wrote {args.results / softmor_figure(softmor, args.results / 'findings_softmor_r.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

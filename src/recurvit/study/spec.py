"""A study file and the grid of runs it expands to.

::

    name: crossroads-digits
    task: classify                        # classify (default) | vae
    base: configs/digits/bvit.yaml        # relative to the study file's folder, then to the cwd
    overrides: {train.epochs: 10}         # applied to every run, before the grid's own
    grid:
      regime:                             # a mapping: named variants, each a set of dotted overrides
        naive: {}                         # (a variant may name its own `base:`)
        deep_supervision: {train.supervision.stages: 3, train.supervision.weights: uniform}
      train.seed: [0, 1, 2]               # a list: values of one dotted key (the seed axis is averaged)
    eval:                                 # the evaluators each run gets (recurvit.study.evaluators)
      max_steps_factor: 16                # horizon sweep up to 16T (acc@T, 2T, 4T, 8T, 16T)
      variants:                           # also evaluate at T with core options changed (ODE: another
        rk4: {method: rk4}                #   solver, or refine=2 for h/2 over the same span); runs
        h/2: {refine: 2}                  #   whose core lacks an option skip that variant
      per_step: {only: {regime: [naive]}} # per-step analyses, of the naive runs only
    report:
      compare: [[naive, deep_supervision]]  # Welch t-tests between cells (variant labels)
      frontier: true                      # nominal vs beyond-horizon accuracy plot, Pareto front
    runs: ../runs/studies/shared          # where run directories live (default runs/studies/<name>);
                                          #   two study files may share runs (same ids = same runs)
    results: results/crossroads_digits    # where results.csv / report.md / plots go

The file is read into typed keys first (:mod:`recurvit.study.study_file`: an unknown key, a missing one or a
value of the wrong type is one line), its claims each into the class of its kind (:mod:`recurvit.study.claims`).

Each grid point is a run directory ``<runs>/runs/<id>``; a run with an up-to-date ``result.json``
is done, a run with ``last.pt`` is resumed (or, when its training is complete and the study asks for
an evaluator it lacks, only that evaluator runs), so an interrupted study continues where it stopped.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..config_names import packaged
from ..errors import UserError
from .base_config import check_base, shown
from .cells import SEED_KEY
from .claims import load_claims
from .evaluators import for_run, parse_eval
from .registry import view_of
from .study_file import LABEL, RegistrationKeys, ReportKeys, read_study_file


@dataclass
class RunSpec:
    run_id: str
    labels: Dict[str, str]  # grid axis -> label of this run's value
    overrides: List[str]  # dotted key=value
    base: Optional[Path] = None  # a variant's own base config (default: the study's)


@dataclass
class Study:
    name: str
    base: Path
    axes: List[Tuple[str, List[Tuple[str, Dict[str, Any]]]]]  # axis -> [(label, {dotted key: value})]
    task: str = "classify"
    overrides: List[str] = field(default_factory=list)
    evaluators: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # evaluator -> options (study.evaluators)
    compare: List[Tuple[str, str]] = field(default_factory=list)
    frontier: bool = False
    runs_dir: Optional[Path] = None
    results: Optional[Path] = None
    path: Optional[Path] = None
    runs: List[RunSpec] = field(default_factory=list)
    claims: List[Any] = field(default_factory=list)  # recurvit.study.claims.Claim: what the study decides
    registration: Optional[RegistrationKeys] = None  # a pre-registered study's n, seeds, ... (below)

    def eval_for(self, labels: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
        """The evaluators (with options) a finished run with these grid labels must have run; each is
        recorded in the run's result.json."""
        return for_run(self.evaluators, labels)

    def cell_axes(self) -> List[str]:
        """Grid axes a report groups by (every axis but the seed)."""
        return [a for a, _ in self.axes if a != SEED_KEY]


CHECKED_RUNS = 500  # grid points whose config is read when the study file is (the rest at run time)
MAX_RUNS = 10_000  # a grid larger than this is a mistake (a typo in an axis), not a study


def _label(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", str(value))


def load_study(path: str | Path) -> Study:
    p = Path(path)
    keys = read_study_file(p)
    name = keys.name
    task = str(keys.task)
    view = view_of(task, f"study file {p}")  # the tasks a study can run: those that registered a view
    axes = []
    for axis, values in (keys.grid or {}).items():
        if isinstance(values, dict):
            bad = [str(lbl) for lbl, ov in values.items() if ov is not None and not isinstance(ov, dict)]
            if bad:
                raise UserError(f"study file {p}: grid variant {bad[0]} of '{axis}' must be a mapping of dotted "
                                "overrides, e.g. {train.epochs: 5}")
            variants = [(str(lbl), dict(ov or {})) for lbl, ov in values.items()]
        elif isinstance(values, list):
            variants = [(_label(v), {axis: v}) for v in values]
        else:
            raise UserError(f"grid entry '{axis}' must be a list of values or a mapping of named variants")
        if not variants:
            raise UserError(f"grid entry '{axis}' is empty")
        for lbl, _ in variants:  # a label names a run directory: it must stay inside the study's runs folder
            if not LABEL.fullmatch(lbl) or lbl in (".", ".."):
                raise UserError(f"study file {p}: grid label {lbl!r} of '{axis}' may hold only letters, digits and "
                                "'_', '.', '+', '-' (it names run directories)")
        seen = [lbl for lbl, _ in variants]
        dup = sorted({lbl for lbl in seen if seen.count(lbl) > 1})
        if dup:
            raise UserError(f"study file {p}: grid axis '{axis}' lists {', '.join(dup)} more than once "
                            "(each run would count twice)")
        axes.append((str(axis), variants))
    source = _source(keys.from_, p) if keys.from_ else None
    if source is not None:
        clash = sorted({a for a, _ in axes} & {a for a, _ in source[0]})
        if clash:
            raise UserError(f"study file {p}: grid axis {clash[0]} is an axis of the study it builds on (from:)")
        axes = source[0] + axes
    size = math.prod(len(v) for _, v in axes)
    if size > MAX_RUNS:
        raise UserError(f"study file {p}: its grid has {size:,} runs (more than {MAX_RUNS:,}); split it or "
                        "shorten an axis")
    rep = keys.report or ReportKeys()
    evaluators = parse_eval(keys.eval or {}, view.EVALUATORS, f"study file {p}",
                            {axis: [lbl for lbl, _ in variants] for axis, variants in axes})
    pairs = rep.compare or []
    if not isinstance(pairs, list) or any(not isinstance(pair, list) or len(pair) != 2 for pair in pairs):
        raise UserError(f"study file {p}: report.compare holds pairs of variant labels, e.g. [[naive, ds3]]")
    compare = [tuple(map(str, pair)) for pair in pairs]
    if any(len(pair) != 2 for pair in compare):
        raise UserError(f"study file {p}: report.compare holds pairs of variant labels, e.g. [[naive, ds3]]")
    study = Study(
        name=name, base=_find(keys.base, p) if source is None else source[1], axes=axes, task=task,
        overrides=[f"{k}={_yaml_value(v)}" for k, v in (keys.overrides or {}).items()],
        evaluators=evaluators,
        compare=compare, frontier=bool(rep.frontier),
        runs_dir=(p.parent / keys.runs).resolve() if keys.runs else None,
        results=(p.parent / keys.results).resolve() if keys.results else None, path=p)
    if not axes:  # was: one run of the base, its full budget, exit 0
        raise UserError(f"study file {p}: grid has no axis; give at least one (e.g. train.seed: [0, 1, 2])")
    study.registration = _registration(keys.registration, p, axes)
    study.runs = expand(study) if source is None else _expand_from(study, source)
    for spec in study.runs[:CHECKED_RUNS]:  # a bad value: one line now, not a failed run after hours of others
        try:
            view.check_run(str(spec.base or study.base), spec.overrides)
        except UserError as e:
            raise UserError(f"study file {p}: run {spec.run_id}: {shown(e, 240)}") from None
    study.claims = load_claims(p, {axis: [lbl for lbl, _ in variants] for axis, variants in axes}, study.results)
    labels = {lbl for _, variants in axes for lbl, _ in variants}
    unknown = sorted({x for pair in compare for x in pair} - labels)
    if unknown:
        raise UserError(f"study file {p}: report.compare names {', '.join(unknown)}, which are not grid labels")
    return study


def _registration(reg: Optional[RegistrationKeys], p: Path, axes) -> Optional[RegistrationKeys]:
    """A confirmatory study's registration: ``n`` runs per cell, exactly the ``seeds`` of its seed axis, the
    ``checkpoint`` its figures are read from (``last``) and its ``budget`` in words. The findings table
    reads the commit that added it as the registration (:mod:`recurvit.study.findings`)."""
    if reg is None:
        return None
    seeds = dict(axes).get(SEED_KEY)
    n, listed = reg.n, reg.seeds
    if seeds is None or not isinstance(n, int) or not isinstance(listed, list) or len(listed) != n:
        raise UserError(f"study file {p}: registration needs n (an integer) and seeds (n of them), and the grid "
                        f"a {SEED_KEY} axis")
    if sorted(map(str, listed)) != sorted(lbl for lbl, _ in seeds):
        raise UserError(f"study file {p}: registration.seeds {listed} are not the grid's {SEED_KEY} values")
    if reg.checkpoint != "last":
        raise UserError(f"study file {p}: registration.checkpoint: a study reads last.pt, so only 'last' is honest")
    return reg


def run_dir_root(study: "Study") -> Path:
    """Where a study's run directories live (``runs:``, default runs/studies/<name>, from the cwd)."""
    return study.runs_dir or Path("runs") / "studies" / study.name


def _source(src: Any, p: Path):
    """``from: {study: other.yaml, only: {axis: [labels]}}``: the runs of another study this one starts from
    (a fine-tuning study fine-tunes each of them). Returns (its axes, restricted to ``only``; the folder of
    its run directories; the runs)."""
    if not isinstance(src, dict) or "study" not in src or not set(src) <= {"study", "only"}:
        raise UserError(f"study file {p}: from: takes {{study: OTHER.yaml, only: {{axis: [labels]}}}}")
    source = load_study(_find(str(src["study"]), p))
    only = {str(k): [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in (src.get("only") or {}).items()}
    own = dict(source.axes)
    for axis, labels in only.items():
        if axis not in own or not set(labels) <= {lbl for lbl, _ in own[axis]}:
            raise UserError(f"study file {p}: from.only names {axis}: {labels}, which {source.path} does not have")
    axes = [(a, [(lbl, {}) for lbl, _ in v if a not in only or lbl in only[a]]) for a, v in source.axes]
    runs = [r for r in source.runs if all(r.labels[a] in labels for a, labels in only.items())]
    return axes, run_dir_root(source) / "runs", runs


def _expand_from(study: "Study", source) -> List[RunSpec]:
    """Every source run x every point of this study's own grid; a run's base is its source run directory."""
    axes_n = len(source[0])
    own = Study(study.name, study.base, study.axes[axes_n:], overrides=study.overrides, path=study.path)
    mine = expand(own) if own.axes else [RunSpec("", {}, list(study.overrides), None)]
    return [RunSpec(run_id="__".join(x for x in (src.run_id, run.run_id) if x), labels={**src.labels, **run.labels},
                    overrides=run.overrides, base=source[1] / src.run_id) for src in source[2] for run in mine]


def _find(path: Any, study_file: Optional[Path]) -> Path:
    """A config path relative to the study file's folder, else to the current directory, else a packaged
    config's name; a file found is read as a config (:func:`recurvit.study.base_config.check_base`)."""
    if not isinstance(path, str) or not path.strip():
        raise UserError(f"study file {shown(study_file)}: base: must name a config file or a packaged config, got "
                        f"{shown(repr(path), 60)}")
    for cand in ((study_file.parent / path) if study_file else None, Path(path)):
        try:
            if cand is not None and cand.is_file():
                return check_base(cand, study_file)
        except OSError:  # a name the file system refuses (too long): not found
            continue
    try:
        found = packaged(str(path))  # a packaged config's name (digits/bvit), as on the command line
    except OSError:
        found = None
    if found is not None:
        return found
    raise UserError(f"study base config not found: {shown(path)} (relative to the study file or the current "
                    "directory, or a packaged config name: `recurvit configs` lists them)")


def expand(study: Study) -> List[RunSpec]:
    runs = []
    for combo in itertools.product(*[variants for _, variants in study.axes]):
        labels, overrides = {}, list(study.overrides)
        for (axis, _), (label, ov) in zip(study.axes, combo):
            labels[axis] = label
            overrides += [f"{k}={_yaml_value(v)}" for k, v in ov.items() if k != "base"]
        run_id = "__".join(f"{axis.split('.')[-1]}={lbl}" if _is_value_axis(study, axis) else lbl
                           for axis, lbl in labels.items())
        base = next((ov["base"] for _, (_, ov) in zip(study.axes, combo) if "base" in ov), None)
        runs.append(RunSpec(run_id=run_id, labels=labels, overrides=overrides,
                            base=_find(base, study.path) if base else study.base))
    return runs


def _is_value_axis(study: Study, axis: str) -> bool:
    """A list axis (values of one key) rather than named variants."""
    variants = dict(study.axes)[axis]
    return all(list(ov) == [axis] for _, ov in variants)


def _yaml_value(v: Any) -> str:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if v is None:
        return "null"
    return str(v).lower() if isinstance(v, bool) else str(v)

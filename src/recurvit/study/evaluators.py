"""What a study measures on each trained run: a set of registered evaluators, named in the study file.

::

    eval:
      horizon: {max_steps_factor: 16}     # the horizon sweep (``max_steps_factor: 16`` alone means the same)
      variants: {rk4: {method: rk4}}      # evaluated at T with core options changed
      per_step: {images: 2000, only: {regime: [naive, ds3]}}   # per-step analyses, on some cells only

An evaluator is a subclass of :class:`Evaluator` registered in its task's table (for classification
``recurvit.tasks.classify.evaluators.EVALUATORS``; a task's view holds it as ``EVALUATORS``): it
checks its options when the study file is read, and, given a trained run, returns the columns it adds
to the run's result row. A run's ``result.json`` records, per evaluator, the options it was evaluated
with; when a study asks for an evaluator a finished run lacks (or other options), only that evaluator
runs, on the run's checkpoint: nothing is trained again and the other evaluators' figures are kept.
``only: {axis: [labels]}`` (any evaluator) limits it to the runs whose grid labels match. The same
evaluator may run twice with other options under a tagged name, ``exit@beyond: {max_steps: 12}``:
its columns then carry the tag (``exit_accuracy@beyond``).

A new evaluator is one class plus one entry in its task's ``EVALUATORS``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional

from ..errors import UserError

ONLY = "only"  # the option every evaluator takes: the grid labels of the runs it applies to
TAG = "@"  # exit@beyond: a second instance of an evaluator, its columns tagged "@beyond"
SHORTHAND = {"max_steps_factor": "horizon"}  # a study file's eval key -> the evaluator whose option it is


@dataclass
class Evaluated:
    """What an evaluator is handed: a trained run, loaded once for all of them."""

    model: Any  # the run's model (last.pt), on ``device``, in eval mode
    cfg: Any  # its run config
    out: Any  # the run directory (a Path)
    device: Any
    test_loader: Any
    info: Any  # the data set's info (num_classes, ...)
    load: Optional[Callable[..., Any]] = None  # load(**core_options): another copy with those options (None: none)


class Evaluator:
    """One measurement of a trained run. Subclasses set ``name`` and ``defaults`` and define ``__call__``."""

    name: ClassVar[str] = ""
    defaults: ClassVar[Dict[str, Any]] = {}
    free_form: ClassVar[bool] = False  # options are a mapping of the user's own names (variants)
    columns: ClassVar[tuple] = ()  # the scalar columns it adds, written to results.csv where a run has them
    default: ClassVar[bool] = False  # runs for every study of its task, named in eval: or not
    minimum: ClassVar[Dict[str, int]] = {}  # integer options and the least value each may take
    # options added after results were recorded: absent means this default, and an absent one is not filled in,
    # so a result recorded before the option existed still counts as evaluated with it (no re-run on resume)
    optional: ClassVar[Dict[str, Any]] = {}

    def check(self, options: Mapping[str, Any], where: str) -> Dict[str, Any]:
        """The options with their defaults filled in; UserError naming ``where`` for a bad one."""
        if self.free_form:
            if not all(isinstance(v or {}, dict) for v in options.values()):
                raise UserError(f"{where} maps names to option mappings, e.g. {{rk4: {{method: rk4}}}}")
            return {str(k): dict(v or {}) for k, v in options.items()}
        unknown = sorted(set(options) - set(self.defaults) - set(self.optional))
        if unknown:
            raise UserError(f"{where}: {self.name} has no option {', '.join(unknown)} "
                            f"(its options: {', '.join([*self.defaults, *self.optional]) or 'none'}, and only)")
        opts = {**copy.deepcopy(self.defaults), **options}
        for key, least in self.minimum.items():
            v = opts[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise UserError(f"{where}: {key} must be an integer >= {least}, got {v!r}")
        return opts

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        """The columns this evaluator adds to the run's result row."""
        raise NotImplementedError


def parse_eval(raw: Mapping[str, Any], table: Mapping[str, Evaluator], where: str,
               axes: Mapping[str, List[str]]) -> Dict[str, Dict[str, Any]]:
    """A study file's ``eval:`` section -> {evaluator: options (with ``only`` if given)}.

    The task's ``default`` evaluators run even when not named (for classification the horizon sweep)."""
    given: Dict[str, Any] = {}
    for key, value in (raw or {}).items():
        if key in SHORTHAND and SHORTHAND[key] in table:  # max_steps_factor: 16  ==  horizon: {max_steps_factor: 16}
            given.setdefault(SHORTHAND[key], {})[key] = value
            continue
        base, tag, label = str(key).partition(TAG)
        if base not in table:
            raise UserError(f"{where}: unknown evaluator 'eval.{key}' (this task's: {', '.join(table)})")
        if tag and not label.isidentifier():
            raise UserError(f"{where}: eval.{key}: the tag after '{TAG}' must be a name, e.g. {base}{TAG}beyond")
        if value is not None and not isinstance(value, dict):
            raise UserError(f"{where}: eval.{key} takes a mapping of options, got {value!r}")
        given[key] = {**given.get(key, {}), **(value or {})}
    for name, ev in table.items():
        if ev.default:
            given.setdefault(name, {})
    out = {}
    for name, opts in given.items():
        only = opts.pop(ONLY, None)
        ev = evaluator(table, name)
        opts = ev.check(opts, f"{where}: eval.{name}")
        if not opts and ev.free_form:
            continue  # no variants asked: nothing to evaluate
        if only is not None:
            out[name] = {**opts, ONLY: _check_only(only, axes, f"{where}: eval.{name}.only")}
        else:
            out[name] = opts
    return out


def evaluator(table: Mapping[str, Evaluator], key: str) -> Evaluator:
    """The evaluator an ``eval:`` key names (``exit@beyond`` names ``exit``)."""
    return table[key.partition(TAG)[0]]


def tagged(key: str, name: str) -> str:
    """A figure's name as the ``eval:`` key ``key`` writes it (``exit_accuracy@beyond`` for ``exit@beyond``)."""
    tag = key.partition(TAG)[2]
    return f"{name}{TAG}{tag}" if tag else name


def columns(key: str, ev: Evaluator) -> List[str]:
    """The scalar columns an ``eval:`` key writes: the evaluator's, tagged for a tagged instance."""
    return [tagged(key, c) for c in ev.columns]


def _check_only(only: Any, axes: Mapping[str, List[str]], where: str) -> Dict[str, List[str]]:
    if not isinstance(only, dict) or not only:
        raise UserError(f"{where} maps grid axes to labels, e.g. {{regime: [naive, ds3]}}")
    out = {}
    for axis, labels in only.items():
        labels = [str(x) for x in (labels if isinstance(labels, list) else [labels])]
        if axis not in axes:
            raise UserError(f"{where} names axis '{axis}', which the grid does not have ({', '.join(axes)})")
        bad = [x for x in labels if x not in axes[axis]]
        if bad:
            raise UserError(f"{where} names {', '.join(bad)}, which are not labels of '{axis}'")
        out[str(axis)] = labels
    return out


def for_run(spec: Mapping[str, Dict[str, Any]], labels: Mapping[str, str]) -> Dict[str, Dict[str, Any]]:
    """The evaluators (with their options) that apply to a run with these grid labels."""
    return {name: opts for name, opts in spec.items()
            if all(labels.get(axis) in allowed for axis, allowed in (opts.get(ONLY) or {}).items())}


def recorded(res: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The evaluators a stored result was evaluated with, in the form :func:`parse_eval` gives."""
    return dict(res.get("eval") or {})


def missing(asked: Mapping[str, Dict[str, Any]], res: Optional[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The asked evaluators that a stored result lacks or ran with other options (all of them without one)."""
    if res is None:
        return dict(asked)
    have = recorded(res)
    return {name: opts for name, opts in asked.items() if have.get(name) != opts}


def evaluate_run(run: Evaluated, asked: Mapping[str, Dict[str, Any]], table: Mapping[str, Evaluator]) -> Dict[str, Any]:
    """The columns of every asked evaluator, in the order asked."""
    row: Dict[str, Any] = {}
    for name, opts in asked.items():
        figures = evaluator(table, name)(run, {k: v for k, v in opts.items() if k != ONLY})
        row.update({tagged(name, k): v for k, v in figures.items()})
    return row

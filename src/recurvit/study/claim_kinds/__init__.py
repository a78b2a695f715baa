"""Claim kinds: one typed class per kind of claim, named in a study file by its ``rule:``.

Each class declares the keys its kind takes (typed fields with defaults; a field without one is required) and
owns its decision: :meth:`decide` on a study's rows, or for a study-less kind :meth:`row` from the repository.
A study file's claim is read into its class by OmegaConf's structured configs (:func:`build`): an unknown key,
a key of another kind, a missing key or a value of the wrong type is one line naming the claim, the key and
the kind. A new kind is one class and one entry of :data:`KINDS`.
"""
from __future__ import annotations

from typing import Dict

from .all_of import AllOf, Qualified
from .base import NOT_TESTED, POOLED, Floored, Kind, OnFigure, StudyKind, build, key
from .compared import Baseline, Equivalence, Heterogeneity, NearChance, NonInferiority, Superiority
from .rows import Accounting, Benchmark, Count, Identity, Needs, RowKind
from .stopping import Stopping
from .target import Target
from .trend import Trend

KINDS: Dict[str, type] = {
    "superiority": Superiority,
    "noninferiority": NonInferiority,
    "equivalence": Equivalence,
    "trend": Trend,
    "near_chance": NearChance,
    "heterogeneity": Heterogeneity,
    "target": Target,
    "all_of": AllOf,
    "stopping": Stopping,
    "accounting": Accounting,
    "identity": Identity,
    "needs": Needs,
    "benchmark": Benchmark,
}

__all__ = ["KINDS", "NOT_TESTED", "POOLED", "Kind", "StudyKind", "OnFigure", "Floored", "RowKind", "build", "key",
           "Superiority", "NonInferiority", "Equivalence", "NearChance", "Heterogeneity", "Baseline", "Trend",
           "Target", "AllOf", "Qualified", "Stopping", "Accounting", "Identity", "Needs", "Benchmark", "Count"]

"""How depth is executed: the table of cores. ``model.core=<name>`` picks one.

A new core is one file here defining a :class:`~.base.Core` subclass (see base.py for what it
answers) and one entry in ``CORES``.
"""
from __future__ import annotations

from typing import Dict, Type

from .base import Core
from .ode import ODECore
from .recurrent import Recurrent
from .softmor import SoftMoRCore
from .stack import Stack

CORES: Dict[str, Type[Core]] = {c.name: c for c in (Stack, Recurrent, ODECore, SoftMoRCore)}


def core_class(name: str) -> Type[Core]:
    """The core registered as ``name``; ValueError naming the choices otherwise."""
    try:
        return CORES[name]
    except KeyError:
        raise ValueError(f"core must be one of {', '.join(CORES)}; got '{name}'") from None


__all__ = ["CORES", "Core", "core_class", "Stack", "Recurrent", "ODECore", "SoftMoRCore"]

"""The ODE core's vector field and its solve: torchdiffeq methods, the fixed grid, the block as
f(t, z) (state-subtracted or black-box), function-evaluation counters. See ode.py for the model."""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torchdiffeq import odeint, odeint_adjoint
from torchdiffeq._impl.odeint import SOLVERS
from torchdiffeq._impl.solvers import FixedGridODESolver

from ...layers.step_cond import StepConditioning

FIELDS = ("state_subtracted", "black_box")
METHODS: Tuple[str, ...] = tuple(m for m in SOLVERS if m != "scipy_solver")
FIXED_METHODS: Tuple[str, ...] = tuple(m for m in METHODS if issubclass(SOLVERS[m], FixedGridODESolver))
_STAGES = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}
_GRID_TOL = 1e-4  # in units of the step size: snaps float rounding of t / h to the grid


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"ODE method must be one of {', '.join(METHODS)}; got '{method}'")
    return method


def solver_stages(method: str) -> Optional[int]:
    """Field evaluations per step of a fixed-step one-step method; None for multistep (Adams:
    rk4 warm-up, then 1 per step) and adaptive methods (NFE depends on the accepted steps)."""
    return _STAGES.get(check_method(method))


def fixed_grid(step_size: float) -> Callable:
    """torchdiffeq ``grid_constructor``: steps of ``step_size`` from t[0] towards t[-1] (either
    direction, so it also serves the adjoint's backward solve); a last partial step only when the
    span is not a whole number of steps (to within ``_GRID_TOL`` steps)."""
    if not step_size > 0:
        raise ValueError(f"step_size must be > 0, got {step_size}")

    def grid_constructor(func, y0, t):
        start, end = t[0], t[-1]
        span = float(end - start)
        n = max(1, math.ceil(abs(span) / step_size - _GRID_TOL))
        k = torch.arange(n + 1, dtype=t.dtype, device=t.device)
        grid = start + k * (step_size if span >= 0 else -step_size)
        grid[-1] = end
        return grid

    return grid_constructor


def integrate(field: Callable, z0: torch.Tensor, t: torch.Tensor, method: str = "euler",
              step_size: Optional[float] = None, rtol: float = 1e-3, atol: float = 1e-4,
              adjoint: bool = False, adjoint_params: Optional[Sequence[torch.Tensor]] = None,
              options: Optional[dict] = None) -> torch.Tensor:
    """Solve dz/dt = field(t, z), z(t[0]) = z0; returns (len(t), *z0.shape), [0] = z0.

    Fixed-step methods step by ``step_size`` (None: exactly on ``t``); adaptive methods ignore it
    and use ``rtol``/``atol``. ``adjoint`` uses ``odeint_adjoint`` (``field`` must then be an
    nn.Module; ``adjoint_params`` default to its parameters)."""
    check_method(method)
    options = dict(options or {})
    if method in FIXED_METHODS and step_size is not None:
        options["grid_constructor"] = fixed_grid(float(step_size))
    kw = dict(rtol=rtol, atol=atol, method=method, options=options)
    if adjoint:
        if not isinstance(field, nn.Module):
            raise TypeError("adjoint integration needs the field to be an nn.Module")
        params = tuple(field.parameters()) if adjoint_params is None else tuple(adjoint_params)
        return odeint_adjoint(field, z0, t, adjoint_params=params, **kw)
    return odeint(field, z0, t, **kw)


class TimeEmbedding(nn.Module):
    """Learned embedding of continuous time s = t / h (in steps): sinusoidal features -> linear.
    Weight and bias start at zero (plain Parameters, so the model's Linear init leaves them)."""

    def __init__(self, dim: int, num_freqs: int = 16, max_period: float = 100.0):
        super().__init__()
        freqs = max_period ** (-torch.arange(num_freqs, dtype=torch.float32) / num_freqs)
        self.register_buffer("freqs", freqs, persistent=False)
        self.weight = nn.Parameter(torch.zeros(dim, 2 * num_freqs))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        ang = torch.as_tensor(s, device=self.freqs.device).to(self.freqs.dtype) * self.freqs
        return nn.functional.linear(torch.cat([ang.sin(), ang.cos()]), self.weight, self.bias)


class _Stats:
    """Plain counters shared by a core and the fields it builds (not a Module: no state_dict)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.forward = True
        self.nfe = self.nfe_adjoint = self.accepted = self.rejected = 0
        self.t = 0.0  # time of the latest field evaluation (probes attribute calls to steps by it)


class BlockField(nn.Module):
    """f(t, z) of the shared block. Built per forward pass: it holds the block, the step
    conditioning and the time embedding as submodules (so ``odeint_adjoint`` finds their
    parameters) but is never registered on the core (no duplicate state_dict keys)."""

    def __init__(self, block: nn.Module, cond: StepConditioning, field: str = "state_subtracted",
                 step_size: float = 1.0, x0: Optional[torch.Tensor] = None,
                 time_embed: Optional[TimeEmbedding] = None, stats: Optional[_Stats] = None,
                 step_of_call: Optional[Callable[[int], int]] = None):
        super().__init__()
        if field not in FIELDS:
            raise ValueError(f"field must be one of {', '.join(FIELDS)}; got '{field}'")
        self.block, self.cond, self.time_embed = block, cond, time_embed
        self.field, self.h = field, float(step_size)
        self.x0 = x0  # plain tensor attribute (not a buffer)
        self.stats = stats if stats is not None else _Stats()
        self.step_of_call = step_of_call  # the core's: which 1-based step the n-th evaluation belongs to

    def step_index(self, t) -> int:
        """Discrete step k = floor(t / h) whose conditioning applies at time t."""
        t = t.detach() if torch.is_tensor(t) else t
        return max(0, math.floor(float(t) / self.h + _GRID_TOL))

    def forward(self, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.stats.forward:
            self.stats.nfe += 1
            self.stats.t = float(t.detach()) if torch.is_tensor(t) else float(t)
        else:
            self.stats.nfe_adjoint += 1
        k = self.step_index(t) if self.cond.kind != "none" else 0
        if self.stats.forward and self.step_of_call is not None:
            step = self.step_of_call(self.stats.nfe - 1)
        else:  # the adjoint's backward solve: the grid interval of the evaluation's time
            step = self.step_index(t) + 1
        block = self.block
        if self.time_embed is not None:
            e = self.time_embed(t / self.h).to(z.dtype)
            # block input z' + e; returning F(z' + e) - e keeps the update form u = F(z'') - z''
            block = lambda zin, step=None: self.block(zin + e, step=step) - e  # noqa: E731
        if self.field == "state_subtracted":
            return self.cond.update(block, z, k, self.x0, step)
        return self.cond.output(block, z, k, self.x0, step)


class _AdaptiveBlockField(BlockField):
    """Adds torchdiffeq's step callbacks (adaptive RK solvers only; fixed ones warn on them)."""

    def callback_accept_step(self, t0, y0, dt):
        if self.stats.forward:
            self.stats.accepted += 1

    def callback_reject_step(self, t0, y0, dt):
        if self.stats.forward:
            self.stats.rejected += 1

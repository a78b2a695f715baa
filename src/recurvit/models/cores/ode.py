"""Continuous-depth core: the shared bViT block integrated as an ODE (torchdiffeq).

The vector field
----------------
A pre-norm transformer block is residual, F(z) = z + f(z). Its recurrence
z_{t+1} = F(z_t) = z_t + f(z_t) is one explicit Euler step of size 1 on

    state_subtracted:  dz/dt = F(z) - z  (= f(z))        (``field="state_subtracted"``, default)

so explicit Euler with h = 1 on this field reproduces the discrete bViT recurrence (up to float
rounding of z + (F(z) - z) vs F(z)), and any other solver / step size is a refinement or a
re-discretisation of the SAME continuous model. Wrapping the block as a black box instead,

    black_box:         dz/dt = F(z)                      (``field="black_box"``)

gives the Euler step z + h F(z) = 2z + f(z) at h = 1: the residual is counted twice, the state
grows every step, and the model is NOT the bViT recurrence (see the Training Crossroads
abstract: "easy to violate when the block is wrapped as a black-box vector field").

With step conditioning (layers/step_cond.py) the field is ``cond.update(block, z, k, x0)`` =
s_k (F(z') - z') for state_subtracted and ``cond.output(...)`` = z + that for black_box, where
z' is the block input (z, + x0 with ``reinject``, + e_k with ``embed``) and the discrete index
at continuous time t is k = floor(t / h), h = t_end / nominal_steps (a grid time t_k = k h maps
to k; the last stage of an RK step, evaluated at t_{k+1}, sees index k+1). Past the learned
range the last entry is reused, as in the discrete core. With ``time_cond`` a learned embedding
of t (sinusoidal features of t / h -> linear map, zero-initialised, so an untrained time
conditioning is exactly the unconditioned field) is added to the block input the same way.

Grid and steps
--------------
Output times are the grid t_k = k h, k = 1..steps. Fixed-step methods step exactly on that grid
(the same grid as torchdiffeq's ``options=dict(step_size=h)``, built robustly so float rounding
of t/h never adds a sliver step). ``states(blocks, z, steps)`` integrates to steps * h in ONE
call and yields every grid state; steps > nominal runs further in time at the same step size
("beyond the training horizon"). Adaptive methods (dopri5, bosh3, ...) use ``rtol``/``atol`` and
report their (interpolated) state at the same grid times.

Function evaluations (torchdiffeq 0.2.5, measured; see tests/test_ode.py)
-------------------------------------------------------------------------
- Fixed-step Runge-Kutta: NFE = steps x stages, with NO extra evaluation at t0:
  euler 1, midpoint 2, heun2 2, heun3 3, rk4 4. torchdiffeq's ``rk4`` is the 3/8 rule
  (``rk4_alt_step_func``; still order 4, 4 evaluations).
- explicit_adams: multistep; the first two steps are rk4 warm-up (4 each), then 1 per step:
  NFE = 4, 8, then 8 + (steps - 2). implicit_adams: data-dependent (corrector iterations).
- Adaptive RK: 2 evaluations before the first step (f(t0) and the initial-step-size probe),
  then per attempted step (accepted or rejected; FSAL): dopri5 6, bosh3 3, fehlberg2 2,
  adaptive_heun 1, dopri8 13. ``core.solver_steps`` holds (accepted, rejected).
``core.nfe`` counts the forward integration only; with ``adjoint`` the evaluations of the
backward (adjoint) solve are counted in ``core.nfe_adjoint``.

Refinement at evaluation
------------------------
``refine=n`` keeps the output grid t_k = k h (and so the integration span and what the step
conditioning sees) but lets a fixed-step method take n steps of size h / n per grid interval: the
SAME trained field solved more finely (NFE x n). As n grows the states converge to the exact flow
of the field, which separates "numerical refinement" from "the solver as an architectural bias"
(a field trained with one method evaluated with another: ``method=``).

Notes
-----
- ``grad_last=k`` (truncated backprop) is supported: the first steps - k grid intervals are
  integrated without a graph and the last k from the detached state. For one-step methods on
  the fixed grid this is the same trajectory; multistep (Adams) restart their warm-up and
  adaptive methods restart step-size selection at the split.
- ``adjoint`` re-evaluates the field backwards in time; stochastic layers (drop_path, dropout)
  then see different masks than in the forward pass, so train adjoint models without them.
- ``scipy_solver`` is not offered: it integrates in numpy (no autograd, CPU only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torchdiffeq import odeint, odeint_adjoint
from torchdiffeq._impl.odeint import SOLVERS
from torchdiffeq._impl.solvers import FixedGridODESolver

from ...layers.step_cond import STEP_CONDITIONING, StepConditioning
from .base import Core, check_choice

FIELDS = ("state_subtracted", "black_box")
METHODS: Tuple[str, ...] = tuple(m for m in SOLVERS if m != "scipy_solver")
FIXED_METHODS: Tuple[str, ...] = tuple(m for m in METHODS if issubclass(SOLVERS[m], FixedGridODESolver))
ADAPTIVE_METHODS: Tuple[str, ...] = tuple(m for m in METHODS if m not in FIXED_METHODS)
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
                 time_embed: Optional[TimeEmbedding] = None, stats: Optional[_Stats] = None):
        super().__init__()
        if field not in FIELDS:
            raise ValueError(f"field must be one of {', '.join(FIELDS)}; got '{field}'")
        self.block, self.cond, self.time_embed = block, cond, time_embed
        self.field, self.h = field, float(step_size)
        self.x0 = x0  # plain tensor attribute (not a buffer)
        self.stats = stats if stats is not None else _Stats()

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
        block = self.block
        if self.time_embed is not None:
            e = self.time_embed(t / self.h).to(z.dtype)
            # block input z' + e; returning F(z' + e) - e keeps the update form u = F(z'') - z''
            block = lambda zin: self.block(zin + e) - e  # noqa: E731
        if self.field == "state_subtracted":
            return self.cond.update(block, z, k, self.x0)
        return self.cond.output(block, z, k, self.x0)


class _AdaptiveBlockField(BlockField):
    """Adds torchdiffeq's step callbacks (adaptive RK solvers only; fixed ones warn on them)."""

    def callback_accept_step(self, t0, y0, dt):
        if self.stats.forward:
            self.stats.accepted += 1

    def callback_reject_step(self, t0, y0, dt):
        if self.stats.forward:
            self.stats.rejected += 1


@dataclass
class ODEOptions:
    field: str = "state_subtracted"  # state_subtracted: dz/dt = F(z) - z; black_box: dz/dt = F(z)
    method: str = "euler"  # torchdiffeq method name (METHODS)
    t_end: Optional[float] = None  # integration span at the trained steps (None: = steps, so h = 1)
    rtol: float = 1e-3  # adaptive methods only
    atol: float = 1e-4  # adaptive methods only
    adjoint: bool = False  # odeint_adjoint: O(1) memory in the number of steps
    time_cond: bool = False  # feed continuous time t to the field (learned embedding of t)
    step_cond: str = "none"  # none | embed | scale, indexed by the grid interval (layers/step_cond.py)
    reinject: bool = False  # add the embedded input to the block's input at every evaluation
    refine: int = 1  # fixed-step methods: n solver steps of h / n per grid interval (evaluation)


class ODECore(Core):
    """The shared block ``blocks[0]`` as a vector field, integrated over [0, steps * h]."""

    name = "ode"
    Options = ODEOptions
    shares_blocks = True
    keeps_states = True  # odeint returns the state at every grid time of the solve

    def __init__(self, cfg):
        super().__init__(cfg)
        o = self.opts
        self.field, self.method = o.field, o.method
        self.t_end = float(cfg.steps if o.t_end is None else o.t_end)
        self.step_size = self.t_end / cfg.steps  # h: the nominal grid spacing
        self.refine = int(o.refine)
        self.rtol, self.atol, self.adjoint = float(o.rtol), float(o.atol), bool(o.adjoint)
        self.cond = StepConditioning(o.step_cond, cfg.steps, cfg.embed_dim, o.reinject)
        self.time_embed = TimeEmbedding(cfg.embed_dim) if o.time_cond else None
        self._stats = _Stats()
        self._running_steps = cfg.steps

    # ------------------------------------------------------------ config side
    @classmethod
    def check_options(cls, o) -> None:
        check_choice("field", o.field, FIELDS)
        check_method(o.method)
        check_choice("step_cond", o.step_cond, STEP_CONDITIONING)
        if o.t_end is not None and not float(o.t_end) > 0:
            raise ValueError(f"t_end must be > 0, got {o.t_end}")
        if not (o.rtol > 0 and o.atol > 0):
            raise ValueError(f"rtol and atol must be > 0, got rtol={o.rtol}, atol={o.atol}")
        if int(o.refine) < 1:
            raise ValueError(f"refine must be >= 1, got {o.refine}")
        if int(o.refine) > 1 and o.method not in FIXED_METHODS:
            raise ValueError(f"refine applies to fixed-step methods ({', '.join(FIXED_METHODS)}); "
                             f"'{o.method}' chooses its own steps (tighten rtol / atol instead)")

    @classmethod
    def calls_per_step(cls, cfg) -> Optional[int]:
        s = solver_stages(cfg.options.method)
        return None if s is None else s * int(cfg.options.refine)

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> Optional[List[int]]:
        per_step = cls.calls_per_step(cfg)
        if per_step is None:  # multistep / adaptive: counted by running it (core.nfe)
            return None
        return [(cfg.steps if steps is None else int(steps)) * per_step]

    @classmethod
    def describe(cls, cfg) -> str:
        o = cfg.options
        refine = f" h/{o.refine}" if int(o.refine) > 1 else ""
        return f"{cls.name} {o.method}/{o.field}{refine}"

    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        m = cfg.options.method
        if m in _STAGES:
            return None
        return (f"the ode core integrates one grid interval at a time only with a fixed-step one-step method "
                f"({', '.join(_STAGES)}); '{m}' would restart its {'warm-up' if m in FIXED_METHODS else 'step-size'} "
                f"selection at every interval and change the states")

    @property
    def current_time(self) -> float:
        return self._stats.t

    def step_of_call(self, call: int) -> int:
        per_step = solver_stages(self.method)
        if per_step is not None:
            k = call // (per_step * self.refine) + 1
        else:  # adaptive / multistep: the time of the current evaluation decides
            k = math.floor(self._stats.t / self.step_size + _GRID_TOL) + 1
        return min(max(k, 1), max(self._running_steps, 1))

    # ------------------------------------------------------------ reporting
    @property
    def fixed_step(self) -> bool:
        return self.method in FIXED_METHODS

    @property
    def nfe_adjoint(self) -> int:
        """Field evaluations in the adjoint backward solve(s) since the last forward pass."""
        return self._stats.nfe_adjoint

    @property
    def solver_steps(self) -> Optional[Tuple[int, int]]:
        """(accepted, rejected) steps of the last forward pass (adaptive methods; else None)."""
        if self.fixed_step:
            return None
        return self._stats.accepted, self._stats.rejected

    # ------------------------------------------------------------- building
    def time_grid(self, steps: int, device=None, dtype=torch.float32) -> torch.Tensor:
        """[t_0 = 0, t_1 = h, ..., t_steps = steps * h]."""
        return torch.arange(steps + 1, device=device, dtype=dtype) * self.step_size

    def make_field(self, blocks: nn.ModuleList, x0: Optional[torch.Tensor] = None) -> BlockField:
        cls = _AdaptiveBlockField if "callback_accept_step" in SOLVERS[self.method].valid_callbacks() else BlockField
        return cls(blocks[0], self.cond, self.field, self.step_size, x0, self.time_embed, self._stats)

    def _solve(self, field: BlockField, z: torch.Tensor, t: torch.Tensor, adjoint: bool) -> torch.Tensor:
        params = None
        if adjoint:
            params = list(field.parameters())
            if field.x0 is not None and self.cond.reinject and field.x0.requires_grad:
                params.append(field.x0)
        return integrate(field, z, t, self.method, self.step_size / self.refine, self.rtol, self.atol, adjoint, params)

    # ------------------------------------------------------------- forward
    def states(self, blocks, z, steps, grad_last=None) -> Iterator[torch.Tensor]:
        stats = self._stats
        stats.reset()
        self.nfe = 0
        self._running_steps = steps
        field = self.make_field(blocks, z)
        tdtype = z.dtype if z.dtype in (torch.float32, torch.float64) else torch.float32
        t = self.time_grid(steps, z.device, tdtype)
        split = steps - grad_last if grad_last is not None and 0 < grad_last < steps else 0
        segments: List[Tuple[int, int, bool]] = []  # (first grid index, last grid index, with graph)
        if split:
            segments.append((0, split, False))
        segments.append((split, steps, True))
        for a, b, with_grad in segments:
            stats.forward = True
            if with_grad:
                sol = self._solve(field, z, t[a:b + 1], self.adjoint and torch.is_grad_enabled())
            else:
                with torch.no_grad():
                    sol = self._solve(field, z, t[a:b + 1], False)
            stats.forward = False  # evaluations after this are the adjoint's backward solve
            self.nfe = stats.nfe
            for k in range(1, b - a + 1):
                yield sol[k]
            z = sol[-1]

    # ------------------------------------------------------------- one step at a time
    def begin(self, blocks, z):
        state = super().begin(blocks, z)
        self._stats.reset()
        if self.cond.reinject:
            state.rows["x0"] = z
        return state

    def _advance(self, state):
        """Integrate ONE grid interval [t_k, t_{k+1}] with the grid of ``states`` (h / refine):
        for one-step methods the same states as one call over [0, K h]."""
        field = state.cache.get("field")
        if field is None:
            field = state.cache["field"] = self.make_field(state.blocks, state.rows.get("x0"))
        z = state.z
        tdtype = z.dtype if z.dtype in (torch.float32, torch.float64) else torch.float32
        t = torch.arange(state.k, state.k + 2, device=z.device, dtype=tdtype) * self.step_size  # = time_grid[k:k+2]
        self._running_steps = state.k + 1
        self._stats.forward = True
        sol = self._solve(field, z, t, False)
        self._stats.forward = False
        self.nfe = self._stats.nfe
        return sol[-1]

    def extra_repr(self) -> str:
        return (f"field={self.field}, method={self.method}, t_end={self.t_end:g}, "
                f"step_size={self.step_size:g}, refine={self.refine}, adjoint={self.adjoint}")

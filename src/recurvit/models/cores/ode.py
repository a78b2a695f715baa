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

Function evaluations (torchdiffeq 0.2.5, measured; see tests/models/cores/test_ode.py)
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
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
from ...layers.step_cond import STEP_CONDITIONING, StepConditioning
from .base import Core, NoStepProgram, StepPlan, check_choice
from .ode_field import (_GRID_TOL, _STAGES, FIELDS, FIXED_METHODS, METHODS, SOLVERS, BlockField, TimeEmbedding,  # noqa: F401
                        _AdaptiveBlockField, _Stats, check_method, fixed_grid, integrate, solver_stages)

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
    def check_training(cls, cfg, activation_checkpointing: bool = False) -> None:
        if activation_checkpointing and cfg.options.adjoint:
            raise ValueError("train.activation_checkpointing=true with model.adjoint=true: the adjoint already keeps "
                             "O(1) memory in the steps; set one of them to false")

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
        return cls(blocks[0], self.cond, self.field, self.step_size, x0, self.time_embed, self._stats,
                   self.step_of_call)

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

    def step_program(self, blocks) -> StepPlan:
        raise NoStepProgram("its step is an interval of a torchdiffeq solve, whose checks on the time grid are "
                            "data-dependent and cannot be traced")

    def extra_repr(self) -> str:
        return (f"field={self.field}, method={self.method}, t_end={self.t_end:g}, "
                f"step_size={self.step_size:g}, refine={self.refine}, adjoint={self.adjoint}")

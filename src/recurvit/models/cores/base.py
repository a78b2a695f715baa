"""What every depth core is and answers for itself.

A core turns embedded tokens into a sequence of states. The blocks live on the model
(``model.blocks``) and are passed in, so a bViT, its ODE twin and its SoftMoR twin share state_dict
keys; a core holds only its OWN parameters (step conditioning, routers, time embeddings).

Everything the rest of the package needs to know about a core is asked of its class, from a
config alone (no model is built), so accounting, matching, the study runner, fine-tuning and eval
never branch on a core's name:

=========================  ======================================================================
``name``                   the key of the core in ``cores.CORES`` (``model.core=<name>``)
``Options``                a dataclass of the core's own options with their defaults; any other
                           option given to this core is an error (``parse_options``)
``shares_blocks``          True when fewer blocks are stored than applied (a recurrence)
``partner``                the core a matched comparison pairs this one with (``recurvit match``)
``resolve(cfg)``           fills ``cfg.steps`` and ``cfg.options`` and checks ``cfg.depth``
``num_blocks(cfg)``        blocks the model stores for this config
``block_uses(cfg, k)``     applications of each block in one forward of k steps (None: data-dependent)
``step_limit(cfg)``        the most steps it can run (None: any number)
``own_flops(cfg, k)``      matmul FLOPs per image of the core's own parts (routers), closed form
``calls_per_step(cfg)``    calls of ONE shared block per step (None: not one shared block / varies)
``unrollable(cfg)``        step k is exactly ``block(z)`` with step-k weights (per-step adapters unroll)
``describe(cfg)``          a short label of how it runs ("ode rk4/state_subtracted")
``accepts(cfg, **options)`` why the core cannot run with these options changed (None: it can)
``check_training(cfg, ..)`` a training setting that contradicts the core's options (ValueError)
``cannot_step(cfg)``       why it cannot run one step at a time on a shrinking batch (None: it can)
=========================  ======================================================================

and of an instance: ``_advance(state)``, its ONE step (the state sequence ``states(blocks, z,
steps, grad_last)``, every step in one pass, is derived from it in this file for every core that can
step; ``read(state)`` where the readout reads something other than the carried state, SoftMoR's
mixture; only a core that integrates a whole trajectory at once, ``keeps_states``, writes its own
``states``), ``nfe`` (block
applications of the last forward) and ``step_of_call(n)`` (the 1-based step of the n-th block call
of the running forward, for probes). Every block call tells the block its
step, ``block(z, step=k)`` with k = ``step_of_call`` of that call: per-step adapters read it, and
a block recomputed under activation checkpointing is told the same step (tests/models/cores/test_conformance.py
checks all of this for every entry of ``CORES``).

Per-step API (anytime inference, models/adaptive.py): ``s = core.begin(blocks, z)`` starts a forward
from the embedded tokens and returns a :class:`StepState`; ``core.advance(s)`` applies ONE step to
every row of ``s`` and returns what the readout reads (``s.z``, the new state, but for a mixture);
``s = s.select(idx)`` keeps only the rows
``idx`` (images that have not exited), with everything the core carries per image (the re-injected
input x0 of a recurrence or an ODE field). After k advances ``s.z`` equals the k-th state of
``states(blocks, z, K)`` for each kept image. Cores for which ``cannot_step`` gives a reason raise
ValueError from ``begin``.

Step program (deployment, export/steps.py): ``core.step_program(blocks)`` gives a :class:`StepPlan`,
the core's step as traceable functions of tensors (the step index a tensor input, never a Python
int a tracer would bake in), from which the export writes embed / step / readout programs a runtime
stops between steps; a core without one raises :class:`NoStepProgram` with the reason in one line.
Every core answers (the base class raises NotImplementedError, and the conformance suite in
tests/models/cores/test_conformance.py chains each plan in eager PyTorch against the states of one pass).

A new core is one file defining a subclass, plus one entry in ``CORES`` (cores/__init__.py).
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn


@dataclasses.dataclass
class NoOptions:
    """A core without options of its own."""


@dataclasses.dataclass
class StepState:
    """A forward in progress, advanced one step at a time by ``core.advance``.

    ``z`` is the state after ``k`` steps (the embedded tokens at k = 0). ``rows`` holds what the
    core carries per image (dim 0 is the batch; a list holds one such tensor per past step);
    ``cache`` holds what the core rebuilds from ``rows`` (dropped by ``select``)."""

    blocks: nn.ModuleList
    z: torch.Tensor
    k: int = 0
    rows: Dict[str, Union[torch.Tensor, List[torch.Tensor]]] = dataclasses.field(default_factory=dict)
    cache: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def select(self, idx: torch.Tensor) -> "StepState":
        """The same forward on the rows ``idx`` only (a LongTensor of row indices)."""
        take = lambda v: [t[idx] for t in v] if isinstance(v, list) else v[idx]  # noqa: E731
        return StepState(self.blocks, self.z[idx], self.k, {n: take(v) for n, v in self.rows.items()})

    def __len__(self) -> int:
        return int(self.z.shape[0])


STEP_INPUT = "step"  # the keyword (and program input) of the 0-based step index, an int64 0-dim tensor


class NoStepProgram(ValueError):
    """This core has no step program; the message is the reason, one line."""


def _no_extra(z: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    return ()


@dataclasses.dataclass
class StepPlan:
    """A core's step as functions a tracer turns into programs (``Core.step_program``).

    ``steps``: the step functions, ONE for every step (any number of steps, up to the core's limit) or one
    per step (step k is ``steps[k - 1]``; a core with a limit of L steps). Each takes keyword arguments:
    the carried ``state`` and the ``constants`` by name, and ``step`` (:data:`STEP_INPUT`, the 0-based
    step as an int64 0-dim tensor) when ``step_index``; it returns the new state, a tensor when the state
    is ``["z"]``, else a tuple in the order of ``state``. Every tensor is per image (dim 0 the batch), so a
    runtime keeps the rows of the images still running.
    ``state``: the carried state, ``"z"`` (the tokens, what the state criterion reads) first.
    ``constants``: per-image tensors made once from the embedded tokens and fed to every step unchanged.
    ``begin(z)``: from the embedded tokens z, the rest of the state (after z) then the constants, a tuple.
    ``readout_inputs`` / ``read``: the state that the model's norm + head read, ``read(*readout_inputs)``
    (None: z itself)."""

    steps: List[Callable[..., Any]]
    state: List[str] = dataclasses.field(default_factory=lambda: ["z"])
    constants: List[str] = dataclasses.field(default_factory=list)
    step_index: bool = False
    begin: Callable[[torch.Tensor], Tuple[torch.Tensor, ...]] = _no_extra
    readout_inputs: List[str] = dataclasses.field(default_factory=lambda: ["z"])
    read: Optional[Callable[..., torch.Tensor]] = None

    def inputs(self) -> List[str]:
        """The keyword names of a step function, in program order: the state, the step index, the constants."""
        return list(self.state) + ([STEP_INPUT] if self.step_index else []) + list(self.constants)

    def tokens(self, *readout_inputs: torch.Tensor) -> torch.Tensor:
        """What the readout reads from ``readout_inputs``."""
        return readout_inputs[0] if self.read is None else self.read(*readout_inputs)


class Core(nn.Module):
    name: ClassVar[str] = "base"
    Options: ClassVar[type] = NoOptions
    shares_blocks: ClassVar[bool] = False
    partner: ClassVar[str] = "stack"
    DEFAULT_STEPS: ClassVar[int] = 12  # trained steps when a config gives none
    keeps_states: ClassVar[bool] = False  # a forward holds every step's state at once (an ODE solve)

    def __init__(self, cfg):
        super().__init__()
        self.opts = cfg.options  # the resolved Options of this core
        self.nominal_steps = int(cfg.steps)
        self.nfe = 0  # block applications in the last forward pass
        self.cfg = cfg
        self.limit = type(self).step_limit(cfg)  # the most steps it can run (None: any)

    # ------------------------------------------------------------------ the config side
    @classmethod
    def option_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls.Options)]

    @classmethod
    def parse_options(cls, given: Optional[Mapping[str, Any]]) -> Any:
        """The core's Options from a mapping (None values mean "not given": the default)."""
        if isinstance(given, cls.Options):
            return given
        given = {k: v for k, v in dict(given or {}).items() if v is not None}
        names = cls.option_names()
        foreign = sorted(set(given) - set(names))
        if foreign:
            has = f"its options: {', '.join(names)}" if names else "it has no options"
            raise ValueError(f"{', '.join(foreign)} {'does' if len(foreign) == 1 else 'do'} not apply to the "
                             f"{cls.name} core ({has})")
        opts = cls.Options(**given)
        cls.check_options(opts)
        return opts

    @classmethod
    def accepts(cls, cfg, **options) -> Optional[str]:
        """Why this config's core cannot run with ``options`` changed (None: it can), e.g. a solver
        option asked of a discrete recurrence, or ``refine`` of an adaptive solver."""
        current = dataclasses.asdict(cfg.options) if dataclasses.is_dataclass(cfg.options) else dict(cfg.options or {})
        try:
            cls.parse_options({**current, **options})
        except (TypeError, ValueError) as e:
            return str(e)
        return None

    @classmethod
    def check_options(cls, opts) -> None:
        """Raise ValueError for an option value the core cannot run with."""

    @classmethod
    def default_steps(cls, cfg) -> int:
        return cls.DEFAULT_STEPS

    @classmethod
    def resolve(cls, cfg) -> None:
        """Fill ``cfg.options`` (the Options dataclass) and ``cfg.steps``; check the depth."""
        cfg.options = cls.parse_options(cfg.options)
        if cfg.steps is None:
            cfg.steps = cls.default_steps(cfg)
        if int(cfg.steps) < 1:
            raise ValueError(f"steps must be >= 1, got {cfg.steps}")
        if cls.shares_blocks and cls.num_blocks(cfg) == 1 and cfg.depth != 1:
            raise ValueError(f"the {cls.name} core runs ONE shared block, so depth={cfg.depth} does not apply "
                             f"(set steps=K for K applications, or depth=1)")

    @staticmethod
    def normalize_overrides(base: Dict[str, Any], overrides: Dict[str, Any]) -> Dict[str, Any]:
        """Preset values + overrides -> the keyword set to build (a stack maps steps to depth)."""
        return {**base, **overrides}

    @classmethod
    def num_blocks(cls, cfg) -> int:
        return 1 if cls.shares_blocks else int(cfg.depth)

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> Optional[List[int]]:
        raise NotImplementedError

    @classmethod
    def block_applications(cls, cfg, steps: Optional[int] = None) -> Optional[int]:
        uses = cls.block_uses(cfg, steps)
        return None if uses is None else sum(uses)

    @classmethod
    def step_limit(cls, cfg) -> Optional[int]:
        return None

    @classmethod
    def own_flops(cls, cfg, steps: Optional[int] = None) -> Optional[int]:
        return 0

    @classmethod
    def calls_per_step(cls, cfg) -> Optional[int]:
        return None

    @classmethod
    def unrollable(cls, cfg) -> bool:
        return False

    @classmethod
    def describe(cls, cfg) -> str:
        return cls.name

    @classmethod
    def check_training(cls, cfg, activation_checkpointing: bool = False) -> None:
        """Raise ValueError for a training setting that contradicts this core's options."""

    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        """Why this config cannot run one step at a time (``begin`` / ``advance``); None: it can."""
        return f"the {cls.name} core has no per-step execution (begin / advance)"

    # ------------------------------------------------------------------ the module side
    def check_steps(self, steps: Optional[int]) -> int:
        steps = self.nominal_steps if steps is None else int(steps)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if self.limit is not None and steps > self.limit:
            raise ValueError(f"this {self.name} model runs at most {self.limit} steps: steps must be <= {self.limit}, "
                             f"got {steps}")
        return steps

    def states(self, blocks: nn.ModuleList, z: torch.Tensor, steps: int,
               grad_last: Optional[int] = None) -> Iterator[torch.Tensor]:
        """What the readout reads after each of ``steps`` steps, in one pass. Derived here, once, from the
        core's one step (``begin`` / ``advance``), for every core that can step; a core that integrates a
        whole trajectory at once (``keeps_states``: the ODE core's adaptive solvers) defines its own."""
        state = self.begin(blocks, z)
        for t in range(steps):
            yield self.advance(state, lambda t=t: grad_ctx(t, steps, grad_last))

    def begin(self, blocks: nn.ModuleList, z: torch.Tensor) -> StepState:
        """Start a forward from the embedded tokens ``z``, to be advanced one step at a time."""
        reason = type(self).cannot_step(self.cfg)
        if reason is not None:
            raise ValueError(reason)
        self.nfe = 0
        return StepState(blocks, z)

    def advance(self, state: StepState, grad: Optional[Callable[[], Any]] = None) -> torch.Tensor:
        """Apply step ``state.k + 1`` to every row of ``state``; returns what the readout reads after it (the
        new carried state ``state.z``, unless the core reads something else: :meth:`read`). ``grad``: a
        factory of the context the step's block applications run in (truncated backpropagation: no_grad)."""
        if self.limit is not None and state.k >= self.limit:
            raise ValueError(f"this {self.name} model runs at most {self.limit} steps")
        state.z = self._advance_in(state, grad or nullcontext)
        state.k += 1
        return self.read(state)

    def _advance_in(self, state: StepState, grad: Callable[[], Any]) -> torch.Tensor:
        """The new carried state, the step's block applications in ``grad()``; the whole step by default (a
        core with work outside its blocks, SoftMoR's router, says which part)."""
        with grad():
            return self._advance(state)

    def _advance(self, state: StepState) -> torch.Tensor:
        raise NotImplementedError

    def read(self, state: StepState) -> torch.Tensor:
        """What the readout reads after the last step: the carried state (SoftMoR's cycle: the mixture)."""
        return state.z

    def step_program(self, blocks: nn.ModuleList) -> StepPlan:
        """This core's step as a :class:`StepPlan` for a step-program export, or NoStepProgram(reason)."""
        raise NotImplementedError(f"the {self.name} core does not say whether it has a step program: define "
                                  "step_program (a StepPlan, or raise NoStepProgram with the reason)")

    def step_of_call(self, call: int) -> int:
        """1-based step of the ``call``-th (0-based) block call of the running forward."""
        return call + 1

    def mixture_weights(self) -> Optional[List[torch.Tensor]]:
        """Token-wise weights over the steps that the last forward mixed (None: this core does not mix)."""
        return None

    @property
    def current_time(self) -> Optional[float]:
        """Continuous time of the running block call (continuous-depth cores; else None)."""
        return None


def grad_ctx(t: int, steps: int, grad_last: Optional[int]):
    """Truncated backpropagation: only the last ``grad_last`` steps record a graph."""
    if grad_last is None or grad_last <= 0 or t >= steps - grad_last:
        return nullcontext()
    return torch.no_grad()


def check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got '{value}'")

"""``Stack``: L independent blocks, the state after block l is step l (timm's ViT)."""
from __future__ import annotations

from typing import ClassVar, List, Optional

from .base import Core, StepPlan, StepState


class Stack(Core):
    name = "stack"
    shares_blocks = False
    partner: ClassVar[str] = "recurrent"

    def __init__(self, cfg):
        super().__init__(cfg)

    @classmethod
    def default_steps(cls, cfg) -> int:
        return int(cfg.depth)

    @classmethod
    def resolve(cls, cfg) -> None:
        super().resolve(cfg)
        if cfg.steps != cfg.depth:
            raise ValueError(f"a stack has steps = depth; got steps={cfg.steps}, depth={cfg.depth}")

    @staticmethod
    def normalize_overrides(base, overrides):
        """A stack's step count is its depth: either key sets both."""
        overrides = dict(overrides)
        if "depth" in overrides:
            overrides["steps"] = overrides["depth"]
        elif "steps" in overrides:
            overrides["depth"] = overrides["steps"]
        return {**base, **overrides}

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> List[int]:
        k = cfg.steps if steps is None else int(steps)
        return [1 if i < k else 0 for i in range(cfg.depth)]

    @classmethod
    def step_limit(cls, cfg) -> int:
        return int(cfg.depth)

    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        return None

    def _advance(self, state):
        self.nfe += 1
        return state.blocks[state.k](state.z, step=state.k + 1)

    def step_program(self, blocks) -> StepPlan:
        """One step program per block, ``z -> z``: step k is block k (the core's own step)."""
        def block(i):
            return lambda z: self._advance(StepState(blocks, z, k=i))

        return StepPlan(steps=[block(i) for i in range(len(blocks))])

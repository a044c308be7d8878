"""What a policy-driven search returns (`xrl.rl.evaluate`, `xrl.rl.guided`, `--search rl`), without torch: a run
whose time limit leaves no time to load the policy returns one without importing it (xrl.rl.rl_search)."""

from __future__ import annotations

from dataclasses import dataclass, field

from xrl.ir import Graph


@dataclass
class PolicyRun:
    """The best graph a set of rollouts reached, and how."""

    graph: Graph
    cost: float
    original_cost: float
    steps: list[str]  # rewrites from the input to `graph`
    rollouts: int
    env_steps: int
    time_s: float
    uphill_paid_off: bool  # the best rollout raised the cost at some step and still ended cheaper
    rollout_speedups: list[float] = field(default_factory=list)
    policy_loaded: bool = True  # False: the time limit left no time to load the policy (the run is greedy's alone)

    @property
    def speedup(self) -> float:
        return self.original_cost / self.cost if self.cost > 0 else float("nan")


__all__ = ["PolicyRun"]

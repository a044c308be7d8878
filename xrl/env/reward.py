"""Rewards of the rewrite environment: measured improvement, optionally sparse, optionally shaped.

    r_t = 100 * (RT_{t-1} - RT_t) / RT_0                     dense: the cost backend's run time every step
    r_t = 100 * (RT_m - RT_t) / RT_0  at t = k, 2k, ... and at the episode's end, else 0
                                                             sparse: RT_m the last measured run time, for
                                                             backends where a measurement is expensive
    r_t += gamma * Phi(s_t) - Phi(s_{t-1})                   potential-based shaping (Ng et al., 1999),
    Phi(s) = 100 * (f(s_0) - f(s)) / f(s_0)                  f = total FLOPs or op count: cheap to compute
    Phi(terminal) = 0

Shaping leaves the optimal policy unchanged: over an episode the shaping terms telescope to
-Phi(s_0) = 0, so it only moves credit earlier (towards steps that cut FLOPs or ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.ir.ops import graph_flops

REWARD_MODES = ("dense", "sparse")
SHAPING = ("none", "flops", "ops")


@dataclass(frozen=True)
class RewardConfig:
    mode: str = "dense"
    every: int = 1  # sparse: measure every `every` steps (and at the episode's end)
    shaping: str = "none"
    gamma: float = 0.99  # shaping's discount: the agent's

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ConfigError(f"unknown reward mode {self.mode!r}; choose one of: {', '.join(REWARD_MODES)}")
        if self.shaping not in SHAPING:
            raise ConfigError(f"unknown reward shaping {self.shaping!r}; choose one of: {', '.join(SHAPING)}")
        if self.every < 1:
            raise ConfigError(f"the sparse reward's interval must be at least 1 step, not {self.every}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"the shaping discount must lie in [0, 1], not {self.gamma}")

    def measures_at(self, step: int, episode_over: bool) -> bool:
        """Whether the run time is measured (and a reward paid) after step `step` (1-based)."""
        return self.mode == "dense" or episode_over or step % self.every == 0


class Potential:
    """Phi(s) = 100 * (f(s_0) - f(s)) / f(s_0) for a cheap feature f of the graph (see module docstring)."""

    def __init__(self, kind: str, start: Graph) -> None:
        self.kind = kind
        self.f0 = max(self.feature(start), 1e-12)

    def feature(self, graph: Graph) -> float:
        if self.kind == "flops":
            return float(graph_flops(graph))
        if self.kind == "ops":
            return float(len(graph))
        return 0.0

    def __call__(self, graph: Graph | None) -> float:
        """Phi(graph); None stands for the terminal state, whose potential is 0."""
        if graph is None or self.kind == "none":
            return 0.0
        return 100.0 * (self.f0 - self.feature(graph)) / self.f0

"""xrl/PassOrdering-v0: PPO picks the next compiler pass (`xrl.env.passes`) for a graph.

Observation (as in XLA-Gym): `op_counts`, the number of operators of each `op_vocab()` type (unknown ops
count as "other"), `progress`, the fraction of the episode done, and `idle`, 1 for each pass that has
run on the current graph without changing it (op counts alone cannot tell a pass at its fixed point).
Episodes have a fixed length (`horizon` passes; truncated, never terminated). Every pass is valid in every state.

Reward: the reduction of op count (`reward="ops"`) or of the analytic cost (`reward="cost"`) in the
step, relative to the start, in percent; with `shaping="potential"` plus gamma * Phi(s') - Phi(s),
Phi(s) = 50 * [(F0 - F(s)) / F0 + (T0 - T(s)) / T0] from FLOPs F and transcendental-op count T
(Phi = 0 at the episode's end, so the shaping telescopes away and leaves the optimal policy unchanged).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from xrl.env.passes import PASSES, op_vocab, run_pass, transcendentals
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.ir.ops import graph_flops

REWARDS = ("ops", "cost")
SHAPINGS = ("none", "potential")


class PassOrderingEnv(gym.Env):
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, graph: Graph | str | Sequence[Graph | str] = "tiny_cnn", *, horizon: int = len(PASSES),
                 reward: str = "ops", shaping: str = "none", gamma: float = 0.99, device: str = "h100",
                 max_rewrites: int | None = None,
                 render_mode: str | None = None) -> None:
        from xrl.cost import get_cost_model
        from xrl.env.graph_rewrite import resolve_graph

        if horizon < 1:
            raise ConfigError(f"the horizon must be at least 1 pass, not {horizon}")
        if reward not in REWARDS:
            raise ConfigError(f"unknown reward {reward!r}; choose one of: {', '.join(REWARDS)}")
        if shaping not in SHAPINGS:
            raise ConfigError(f"unknown shaping {shaping!r}; choose one of: {', '.join(SHAPINGS)}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"unknown render mode {render_mode!r}; choose: ansi")
        self.horizon, self.reward_kind, self.shaping, self.gamma = horizon, reward, shaping, gamma
        self.max_rewrites = max_rewrites
        self.render_mode = render_mode
        self.cost_model = get_cost_model("analytic", device=device)
        self.vocab = op_vocab()
        self._op_index = {op: i for i, op in enumerate(self.vocab)}
        self.action_space = spaces.Discrete(len(PASSES))
        self.observation_space = spaces.Dict({
            "op_counts": spaces.Box(0.0, 1e7, (len(self.vocab),), np.float32),
            "progress": spaces.Box(0.0, 1.0, (1,), np.float32),
            "idle": spaces.Box(0.0, 1.0, (len(PASSES),), np.float32),
        })
        # Several graphs: each reset draws one (seeded by reset's seed), so one env trains on a suite.
        self._pool = [resolve_graph(g) for g in graph] if isinstance(graph, (list, tuple)) else None
        self._start = self._pool[0] if self._pool else resolve_graph(graph)
        self._results: dict[tuple[str, str], Graph] = {}  # (graph hash, pass) -> result: passes are deterministic
        self._reset_state(self._start)

    def _reset_state(self, graph: Graph) -> None:
        self._start = self.graph = graph
        self.step_count = 0
        self.passes: list[str] = []
        self.idle = np.zeros(len(PASSES), np.float32)
        self.ops0 = max(len(graph), 1)
        self.cost0 = self.cost_model.cost(graph)
        self.cost = self.cost0
        self.flops0 = max(graph_flops(graph), 1)
        self.trans0 = max(transcendentals(graph), 1)

    def potential(self, graph: Graph | None) -> float:
        if graph is None or self.shaping == "none":
            return 0.0
        return 50.0 * ((self.flops0 - graph_flops(graph)) / self.flops0
                       + (self.trans0 - transcendentals(graph)) / self.trans0)

    def op_counts(self, graph: Graph | None = None) -> np.ndarray:
        out = np.zeros(len(self.vocab), np.float32)
        other = self._op_index["other"]
        for op, k in Counter(n.op for n in (graph or self.graph).topological_order).items():
            out[self._op_index.get(op, other)] += k
        return out

    def _obs(self) -> dict[str, np.ndarray]:
        return {"op_counts": self.op_counts(), "progress": np.array([self.step_count / self.horizon], np.float32),
                "idle": self.idle.copy()}

    def _info(self) -> dict[str, Any]:
        return {"ops": len(self.graph), "ops0": self.ops0, "cost": self.cost, "passes": list(self.passes),
                "action_mask": self.action_masks()}

    def action_masks(self) -> np.ndarray:
        return np.ones(len(PASSES), dtype=bool)  # every pass is valid everywhere

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        from xrl.env.graph_rewrite import resolve_graph

        super().reset(seed=seed)
        graph = self._start
        if options and options.get("graph") is not None:
            graph = resolve_graph(options["graph"])
        elif self._pool:
            graph = self._pool[int(self.np_random.integers(len(self._pool)))]
        self._reset_state(graph)
        return self._obs(), self._info()

    def apply_pass(self, graph: Graph, name: str) -> Graph:
        key = (graph.canonical_hash, name)
        if key not in self._results:
            self._results[key] = run_pass(graph, name, self.cost_model, self.max_rewrites)
        return self._results[key]

    def step(self, action: int):
        name = PASSES[int(action)]
        prev, prev_cost = self.graph, self.cost
        self.graph = self.apply_pass(prev, name)
        if self.graph is prev or self.graph.canonical_hash == prev.canonical_hash:
            self.idle[int(action)] = 1.0
        else:
            self.idle[:] = 0.0
        self.cost = self.cost_model.cost(self.graph) if self.graph is not prev else prev_cost
        self.passes.append(name)
        self.step_count += 1
        truncated = self.step_count >= self.horizon
        if self.reward_kind == "ops":
            reward = 100.0 * (len(prev) - len(self.graph)) / self.ops0
        else:
            reward = 100.0 * (prev_cost - self.cost) / self.cost0
        if self.shaping != "none":
            reward += self.gamma * self.potential(None if truncated else self.graph) - self.potential(prev)
        return self._obs(), float(reward), False, truncated, self._info()

    def render(self):
        if self.render_mode == "ansi":
            return (f"{self.graph.name} pass {self.step_count}/{self.horizon}: {len(self.graph)} ops "
                    f"(from {self.ops0}), passes {' '.join(self.passes) or '-'}")
        return None

"""The graph-rewriting environment (X-RLflow): pick one of the graphs one rewrite away, or stop.

State: the current graph. Actions, renumbered every step:

    0          the no-op: keep the current graph and end the episode
    1 .. n     candidate i-1 of `RewriteEngine.candidates(current)`, in the engine's order

`info["action_mask"]` ([n + 1] bool, all True) marks the valid actions; an action outside it is
treated as the no-op, so a policy that ignores the mask ends the episode rather than crashing.
The episode also ends when no rewrite applies, and is truncated after `horizon` steps.

Reward (xrl.env.reward): 100 * (RT_{t-1} - RT_t) / RT_0 from the cost backend, re-costed from each
rewrite's delta for per-op backends; optionally sparse (every k steps) and potential-shaped.

Observation: a fixed-size summary (`summary`: the current graph's size, FLOPs, bytes and cost
relative to the start, the horizon used, the candidate count) and `num_actions`. The graphs
themselves are too big and too many for a fixed space: an agent reads them from the env
(`candidates`, `meta_graph`), as X-RLflow's agent does.

A cap on candidates (`max_candidates`) keeps those with the lowest estimated cost change (ties in
engine order) and logs a warning; without one, up to MAX_ACTIONS - 1 rewrites are offered.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from xrl.cost.base import CostModel
from xrl.env.reward import Potential, RewardConfig
from xrl.errors import ConfigError
from xrl.features.metagraph import CAND_DIM, FeatureCache, MetaGraph, build_metagraph
from xrl.ir import Graph
from xrl.ir.ops import graph_bytes, graph_flops, node_flops

log = logging.getLogger(__name__)

MAX_ACTIONS = 1 << 20  # the action space's size without a cap: far beyond any graph's candidate count
SUMMARY_DIM = 6
SUMMARY_HIGH = 1e6  # ratios to the start graph and a log count: far below this, and clipped to it


def rule_name(candidate: Any) -> str:
    """A candidate's rule as text (the engine's `rule` is a Rule object with a name, or a string)."""
    rule = candidate.rule
    return str(getattr(rule, "name", rule))


def feature_graph(candidate: Any) -> Graph:
    """A candidate's rewritten graph for featurising: its built graph if it has one, else the engine's
    `skeleton` (structure and types, new weights as placeholders). Featurising reads shapes only, and
    computing every candidate's weights costs more than featurising it; only the candidate an agent
    picks is built for real (`candidate.graph`)."""
    if "graph" in getattr(candidate, "__dict__", {}) or not hasattr(candidate, "skeleton"):
        return candidate.graph  # already built, or an engine without the delta fields
    return candidate.skeleton


def resolve_graph(graph: Graph | str) -> Graph:
    """A Graph, or the name of a built-in graph."""
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, str):
        from xrl import graphs
        from xrl.frontends.onnx_io import from_onnx

        return from_onnx(graphs.build(graph), name=graph)
    raise ConfigError(f"graph must be an xrl Graph or a built-in graph name, not {type(graph).__name__}")


def resolve_cost(cost: CostModel | str) -> CostModel:
    if isinstance(cost, CostModel):
        return cost
    from xrl.cost import get_cost_model

    return get_cost_model(cost)


class GraphRewriteEnv(gym.Env):
    metadata = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 4}

    def __init__(self, graph: Graph | str, cost: CostModel | str = "analytic", *, engine: Any = None,
                 horizon: int = 50, reward: str = "dense", reward_every: int = 1, shaping: str = "none",
                 gamma: float = 0.99, max_candidates: int | None = None, render_mode: str | None = None) -> None:
        if horizon < 1:
            raise ConfigError(f"the horizon must be at least 1 step, not {horizon}")
        if max_candidates is not None and max_candidates < 1:
            raise ConfigError(f"max_candidates must be at least 1 (or None for no cap), not {max_candidates}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"unknown render mode {render_mode!r}; choose one of: ansi, human, rgb_array")
        if engine is None:
            from xrl.rewrite import RewriteEngine

            engine = RewriteEngine()
        self.engine = engine
        self.cost_model = resolve_cost(cost)
        # Hints and candidate caps need a cheap per-candidate estimate: the backend itself when it is
        # per-op (exact from the delta), else the analytic roofline.
        self.hint_model = self.cost_model if self.cost_model.per_op else resolve_cost("analytic")
        self.horizon = horizon
        self.reward_cfg = RewardConfig(reward, reward_every, shaping, gamma)
        self.max_candidates = max_candidates
        self.render_mode = render_mode
        n_actions = (max_candidates + 1) if max_candidates is not None else MAX_ACTIONS
        self.action_space = spaces.Discrete(n_actions)
        self.observation_space = spaces.Dict({
            "summary": spaces.Box(0.0, SUMMARY_HIGH, (SUMMARY_DIM,), np.float32),
            "num_actions": spaces.Discrete(n_actions + 1),
        })
        self._start = resolve_graph(graph)
        self._capped_warned: set[str] = set()
        self._start_candidates: dict[int, tuple[Graph, list]] = {}  # id(start graph) -> (graph, its rewrites)
        self._reset_state(self._start)

    # ----- episode state ----------------------------------------------------------------------
    def _reset_state(self, graph: Graph) -> None:
        self._start = graph
        self.graph = graph
        self.step_count = 0
        self.last_rewrite: str | None = None
        self.last_added: tuple[str, ...] = ()  # node names the last rewrite added: the region render() draws
        self.rewrites: list[str] = []
        self.cost0 = self.cost_model.cost(graph)
        if not self.cost0 > 0:
            raise ConfigError(f"graph {graph.name!r} costs {self.cost0} under {self.cost_model.describe()}; "
                              "the reward needs a positive run time")
        self.cost = self.cost0  # exact for per-op backends; the last measurement otherwise
        self.measured_cost = self.cost0
        self._measured_graph = graph
        self.hint_cost0 = self.cost0 if self.hint_model is self.cost_model else self.hint_model.cost(graph)
        self.hint_cost = self.hint_cost0
        self.flops0 = max(graph_flops(graph), 1)
        self.bytes0 = max(graph_bytes(graph), 1)
        self.nodes0 = max(len(graph), 1)
        self.potential = Potential(self.reward_cfg.shaping, graph)
        self._set_candidates()

    def _set_candidates(self) -> None:
        kept = self._start_candidates.get(id(self.graph))
        if kept is not None and kept[0] is self.graph:
            cands = kept[1]  # every episode on a graph starts with the same rewrites: enumerate them once
        else:
            cands = list(self.engine.candidates(self.graph, original_nodes=self.nodes0))
            if self.graph is self._start:
                self._start_candidates[id(self.graph)] = (self.graph, cands)
        self._hints: np.ndarray | None = None
        self.candidates = cands
        cap = self.max_candidates if self.max_candidates is not None else MAX_ACTIONS - 1
        if len(cands) > cap:
            keep = np.argsort(self._hint_array(cands)[:, 0], kind="stable")[:cap]
            self.candidates = [cands[i] for i in sorted(keep)]
            self._hints = None
            # A cap someone configured (a training run, a policy's trained cap) is a choice: say it at INFO.
            # Only the built-in limit on actions, which nobody chose, is worth a warning.
            first = logging.WARNING if self.max_candidates is None else logging.INFO
            level = logging.DEBUG if self.graph.name in self._capped_warned else first
            self._capped_warned.add(self.graph.name)
            log.log(level, "%s: %d candidate rewrites, keeping the %d with the lowest estimated cost "
                    "(raise max_candidates to keep more)", self.graph.name, len(cands), cap)

    def _hint_array(self, cands: list) -> np.ndarray:
        """[len(cands), CAND_DIM]: each rewrite's change of estimated cost, op count and FLOPs, relative."""
        g, model = self.graph, self.hint_model
        out = np.zeros((len(cands), CAND_DIM), dtype=np.float32)
        for i, c in enumerate(cands):
            # The engine's `cost_graph` types the added nodes without building the rewritten graph
            # (or its new weights): only the candidates an agent looks at are ever built.
            new = getattr(c, "cost_graph", None) or c.graph
            d_cost = sum(model.op_cost(n, new) for n in c.added) - sum(model.op_cost(n, g) for n in c.removed)
            d_flops = sum(node_flops(n, new) for n in c.added) - sum(node_flops(n, g) for n in c.removed)
            out[i] = (100.0 * d_cost / self.hint_cost0, (len(c.added) - len(c.removed)) / self.nodes0,
                      100.0 * d_flops / self.flops0)
        return out

    # ----- what an agent reads ------------------------------------------------------------------
    @property
    def num_actions(self) -> int:
        return len(self.candidates) + 1

    def action_mask(self) -> np.ndarray:
        return np.ones(self.num_actions, dtype=bool)

    def candidate_hints(self) -> np.ndarray:
        """[num_actions, CAND_DIM] per-action hints (row 0, the no-op, is zeros)."""
        if self._hints is None:
            self._hints = np.concatenate([np.zeros((1, CAND_DIM), np.float32), self._hint_array(self.candidates)])
        return self._hints

    def state_features(self) -> np.ndarray:
        """[STATE_DIM]: the fraction of the horizon left, and the estimated cost relative to the start."""
        return np.array([(self.horizon - self.step_count) / self.horizon, self.hint_cost / self.hint_cost0],
                        dtype=np.float32)

    def meta_graph(self, features: FeatureCache) -> MetaGraph:
        """The current graph and every candidate, featurised and batched (candidate k = action k)."""
        cands = [features.get(c, lambda c=c: feature_graph(c)) for c in self.candidates]
        return build_metagraph(features(self.graph), cands,
                               torch.from_numpy(self.candidate_hints()), torch.from_numpy(self.state_features()))

    @property
    def speedup(self) -> float:
        return self.cost0 / self.cost

    def _obs(self) -> dict[str, Any]:
        g = self.graph
        summary = np.array([len(g) / self.nodes0, graph_flops(g) / self.flops0, graph_bytes(g) / self.bytes0,
                            self.cost / self.cost0, self.step_count / self.horizon,
                            math.log1p(len(self.candidates))], dtype=np.float32)
        return {"summary": np.clip(summary, 0.0, SUMMARY_HIGH), "num_actions": self.num_actions}

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self.action_mask(), "cost": self.cost, "speedup": self.speedup,
                "rewrite": self.last_rewrite, "step": self.step_count, "graph": self.graph.name}

    # ----- gymnasium API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start from the configured graph, or from `options["graph"]` (a Graph or built-in name) from now on."""
        super().reset(seed=seed)
        graph = self._start
        if options and options.get("graph") is not None:
            graph = resolve_graph(options["graph"])
        self._reset_state(graph)
        return self._obs(), self._info()

    def step(self, action: int):
        action = int(action)
        prev_graph = self.graph
        stop = not 1 <= action < self.num_actions  # the no-op, or an invalid action treated as one
        if not stop:
            cand = self.candidates[action - 1]
            hints = self.candidate_hints()
            self.hint_cost += float(hints[action, 0]) * self.hint_cost0 / 100.0
            if self.cost_model.per_op:
                self.cost = self.cost_model.delta_cost(prev_graph, self.cost, cand.graph, cand.removed, cand.added)
            self.graph = cand.graph
            self.last_rewrite = f"{rule_name(cand)}@{','.join(cand.location)}"
            self.last_added = tuple(n.name for n in cand.added)
            self.rewrites.append(rule_name(cand))
        self.step_count += 1
        if not stop:
            self._set_candidates()
        terminated = stop or not self.candidates
        truncated = not terminated and self.step_count >= self.horizon
        over = terminated or truncated

        reward = 0.0
        if self.reward_cfg.measures_at(self.step_count, over):
            if not self.cost_model.per_op and self.graph is not self._measured_graph:
                self.cost = self.cost_model.cost(self.graph)
            reward = 100.0 * (self.measured_cost - self.cost) / self.cost0
            self.measured_cost, self._measured_graph = self.cost, self.graph
        if self.reward_cfg.shaping != "none":
            reward += self.reward_cfg.gamma * self.potential(None if over else self.graph) - self.potential(prev_graph)
        if self.render_mode == "human":
            print(self.render_text())
        return self._obs(), float(reward), terminated, truncated, self._info()

    def render_text(self) -> str:
        last = self.last_rewrite or "-"
        return (f"{self.graph.name} step {self.step_count}/{self.horizon}: cost {self.cost * 1e3:.4f} ms "
                f"({self.speedup:.3f}x), {len(self.graph)} ops, {len(self.candidates)} candidates, last {last}")

    def render(self):
        """ansi: the text summary; human: print it; rgb_array: a picture of the last rewrite's region."""
        if self.render_mode == "ansi":
            return self.render_text()
        if self.render_mode == "human":
            print(self.render_text())
        if self.render_mode == "rgb_array":
            from xrl.env.render import draw_region

            return draw_region(self.graph, self.last_added, title=self.render_text())
        return None

    def save_region(self, path):
        """Write a PNG of the region the last rewrite changed (added nodes and their neighbours)."""
        from xrl.env.render import save_region

        return save_region(self.graph, self.last_added, path, title=self.render_text())

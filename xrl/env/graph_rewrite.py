"""The graph-rewriting environment (X-RLflow): pick one of the graphs one rewrite away, or stop.

State: the current graph. Actions, renumbered every step:

    0          the no-op: keep the current graph and end the episode
    1 .. n     candidate i-1 of `RewriteEngine.candidates(current)`, in the engine's order

`info["action_mask"]` ([n + 1] bool, all True) marks the valid actions; an action outside it is
treated as the no-op, so a policy that ignores the mask ends the episode rather than crashing.
The episode also ends when no rewrite applies, and is truncated after `horizon` steps.

Reward (xrl.env.reward): 100 * (RT_{t-1} - RT_t) / RT_0 from the cost backend, re-costed from each
rewrite's delta for per-op backends; optionally sparse (every k steps) and potential-shaped.

Observation (`observation="graph"`, the default when `max_candidates` is set, as it is for
`gymnasium.make`): the state itself as padded arrays with counts (xrl.env.observation): the current
graph's typed node and edge tensors, each candidate's rule, location, added ops and estimated effect,
and the action mask, so an agent needs nothing but `obs`. `observation="summary"` (the default without
a cap, whose action space is too large to pad to) keeps only `summary` (the current graph's size,
FLOPs, bytes and cost relative to the start, the horizon used, the candidate count) and
`num_actions`; xrl's own agent reads the graphs from the env (`meta_graph`), as X-RLflow's does.

The mask (`action_masks()`, the sb3-contrib convention, and `info["action_mask"]`) has the action
space's size, so `action_space.sample(mask=env.action_masks())` draws a valid action.

A cap on candidates (`max_candidates`) keeps those with the lowest estimated cost change (ties in
engine order) and logs a warning; without one, up to MAX_ACTIONS - 1 rewrites are offered.

CompilerGym conventions (xrl.env.state): `env.state` is the episode so far as a serialisable
`EnvState` (source graph and its hash, actions as `rule@location`, reward); `env.apply(state)`
replays one, `env.validate()` replays the current state and checks the result under onnxruntime
against the source, and `env.fork()` returns an independent copy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from xrl.cost import get_cost_model
from xrl.cost.base import CostModel
from xrl.env.observation import SUMMARY_DIM, SUMMARY_HIGH, ObservationLayout, Observer, default_maxima
from xrl.env.reward import Potential, RewardConfig
from xrl.env.state import EnvState, ValidationResult
from xrl.errors import ConfigError
from xrl.features.metagraph import CAND_DIM, FeatureCache, MetaGraph, build_metagraph
from xrl.ir import Graph
from xrl.ir.ops import graph_bytes, graph_flops, node_flops

log = logging.getLogger(__name__)

MAX_ACTIONS = 1 << 20  # the action space's size without a cap: far beyond any graph's candidate count
OBSERVATIONS = ("graph", "summary")
DEFAULT_GRAPH = "tiny_cnn"  # what `gymnasium.make` optimises when no graph is named: small and fast
MIN_HORIZON = 50  # a policy's rollout gets at least this many steps, and one per op on larger graphs


def default_horizon(graph: Graph) -> int:
    """The steps a policy's rollout may take on `graph` (`--search rl`, release mode, expert iteration)."""
    return max(MIN_HORIZON, len(graph))


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
    """A Graph, or a built-in graph name or model file (.onnx, HLO text), by the one loader's rule
    (`xrl.frontends.loader.load_model`)."""
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, str):
        from xrl.frontends.loader import load_model

        return load_model(graph).graph
    raise ConfigError(f"graph must be an xrl Graph, a built-in graph name or a model file, not {type(graph).__name__}")


class GraphRewriteEnv(gym.Env):
    metadata = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 4}

    def __init__(self, graph: Graph | str | Sequence[Graph | str] = DEFAULT_GRAPH, cost: CostModel | str = "analytic",
                 *, engine: Any = None,
                 horizon: int = 50, reward: str = "dense", reward_every: int = 1, shaping: str = "none",
                 gamma: float = 0.99, max_candidates: int | None = None, render_mode: str | None = None,
                 observation: str | None = None, max_nodes: int | None = None, max_edges: int | None = None,
                 rules: str | None = None) -> None:
        """`rules`: a named rule set (xrl.rewrite.rules: all, elementary, ...) for the default engine; ignored
        when `engine` is given."""
        if horizon < 1:
            raise ConfigError(f"the horizon must be at least 1 step, not {horizon}")
        if max_candidates is not None and max_candidates < 1:
            raise ConfigError(f"max_candidates must be at least 1 (or None for no cap), not {max_candidates}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"unknown render mode {render_mode!r}; choose one of: ansi, human, rgb_array")
        observation = observation or ("graph" if max_candidates is not None else "summary")
        if observation not in OBSERVATIONS:
            raise ConfigError(f"unknown observation {observation!r}; choose one of: {', '.join(OBSERVATIONS)}")
        if observation == "graph" and max_candidates is None:
            raise ConfigError("observation='graph' pads candidates to max_candidates: set max_candidates")
        # What it takes to build this env again (fork, validate): the constructor's own arguments.
        self._kwargs = dict(horizon=horizon, reward=reward, reward_every=reward_every, shaping=shaping, gamma=gamma,
                            max_candidates=max_candidates, observation=observation, max_nodes=max_nodes,
                            max_edges=max_edges, rules=rules)
        if engine is None:
            from xrl.rewrite import RewriteEngine

            if rules is None:
                engine = RewriteEngine.default()
            else:
                from xrl.rewrite.rules import load_rules

                engine = RewriteEngine(load_rules(rule_set=rules))
        self.engine = engine
        self.cost_model = cost if isinstance(cost, CostModel) else get_cost_model(cost)
        # Hints and candidate caps need a cheap per-candidate estimate: the backend itself when it is
        # per-op (exact from the delta) or deterministic (a target's kernels, measured once and cached),
        # else (a whole graph timed every call) the analytic roofline.
        cheap = self.cost_model.per_op or not self.cost_model.measured
        self.hint_model = self.cost_model if cheap else get_cost_model("analytic")
        self.horizon = horizon
        self.reward_cfg = RewardConfig(reward, reward_every, shaping, gamma)
        self.max_candidates = max_candidates
        self.render_mode = render_mode
        n_actions = (max_candidates + 1) if max_candidates is not None else MAX_ACTIONS
        self.action_space = spaces.Discrete(n_actions)
        self.observation = observation
        # Several graphs: each reset() draws one (from reset's seed), so one env trains on a suite.
        self._pool: list[tuple[str | None, Graph]] | None = None
        if isinstance(graph, (list, tuple)):
            if not graph:
                raise ConfigError("an empty list of graphs")
            self._pool = [(g if isinstance(g, str) else None, resolve_graph(g)) for g in graph]
            graph = self._pool[0][1] if self._pool[0][0] is None else self._pool[0][0]
        self._source = graph if isinstance(graph, str) else None  # how to load the start graph again
        self._start = resolve_graph(graph)
        self._observer: Observer | None = None
        if observation == "graph":
            growth = getattr(self.engine, "max_growth", 2.0)
            sizes = [default_maxima(g, growth) for g in ([g for _, g in self._pool] if self._pool else [self._start])]
            auto_nodes, auto_edges = max(n for n, _ in sizes), max(e for _, e in sizes)
            layout = ObservationLayout(max_nodes or auto_nodes, max_edges or auto_edges, n_actions,
                                       len(getattr(self.engine, "rules", ())))
            self._observer = Observer(layout, [str(getattr(r, "name", r)) for r in getattr(self.engine, "rules", ())])
            self.observation_space = layout.space()
        else:
            self.observation_space = spaces.Dict({
                "summary": spaces.Box(0.0, SUMMARY_HIGH, (SUMMARY_DIM,), np.float32),
                "num_actions": spaces.Discrete(n_actions + 1),
            })
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
        self.actions: list[str] = []  # the steps taken, as `rule@node,node` (EnvState's actions)
        self.episode_reward = 0.0
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
        self.all_candidates = cands  # before the cap: what a replayed state may name
        self.candidates = cands
        cap = self.max_candidates if self.max_candidates is not None else MAX_ACTIONS - 1
        if len(cands) > cap:
            hints = self._hint_array(cands)
            keep = sorted(np.argsort(hints[:, 0], kind="stable")[:cap])
            self.candidates = [cands[i] for i in keep]
            # the kept rows are the kept candidates' hints (each row is its own candidate's): not computed twice
            self._hints = np.concatenate([np.zeros((1, CAND_DIM), np.float32), hints[keep]])
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

    def action_masks(self) -> np.ndarray:
        """[action_space.n] bool: True for the no-op and each candidate (sb3-contrib's MaskablePPO reads this)."""
        mask = np.zeros(self.action_space.n, dtype=bool)
        mask[:self.num_actions] = True
        return mask

    def action_mask(self) -> np.ndarray:
        return self.action_masks()

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

    @property
    def start_graph(self) -> Graph:
        """The graph the episode started from."""
        return self._start

    @property
    def source(self) -> str | None:
        """How the start graph is loaded again (a built-in name or a model file), None for a Graph given as is."""
        return self._source

    def _obs(self) -> dict[str, Any]:
        g = self.graph
        summary = np.array([len(g) / self.nodes0, graph_flops(g) / self.flops0, graph_bytes(g) / self.bytes0,
                            self.cost / self.cost0, self.step_count / self.horizon,
                            math.log1p(len(self.candidates))], dtype=np.float32)
        summary = np.clip(summary, 0.0, SUMMARY_HIGH)
        if self._observer is None:
            return {"summary": summary, "num_actions": self.num_actions}
        return self._observer(g, self.candidates, self.candidate_hints(), self.state_features(), summary)

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self.action_mask(), "cost": self.cost, "speedup": self.speedup,
                "rewrite": self.last_rewrite, "step": self.step_count, "graph": self.graph.name}

    # ----- gymnasium API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start from the configured graph, or from `options["graph"]` (a Graph or built-in name) from now on;
        an env made with a list of graphs draws one at each reset without that option."""
        super().reset(seed=seed)
        graph = self._start
        if options and options.get("graph") is not None:
            graph = resolve_graph(options["graph"])
            self._source = options["graph"] if isinstance(options["graph"], str) else None
        elif self._pool:
            self._source, graph = self._pool[int(self.np_random.integers(len(self._pool)))]
        self._reset_state(graph)
        return self._obs(), self._info()

    def step(self, action: int):
        action = int(action)
        stop = not 1 <= action < self.num_actions  # the no-op, or an invalid action treated as one
        return self._advance(None if stop else self.candidates[action - 1],
                             None if stop else float(self.candidate_hints()[action, 0]))

    def _advance(self, cand: Any, hint: float | None):
        """One step: apply `cand` (None: the no-op); `hint` is its estimated relative cost change."""
        prev_graph = self.graph
        stop = cand is None
        if not stop:
            if hint is None:
                hint = float(self._hint_array([cand])[0, 0])
            self.hint_cost += hint * self.hint_cost0 / 100.0
            if self.cost_model.per_op:
                self.cost = self.cost_model.delta_cost(prev_graph, self.cost, cand.graph, cand.removed, cand.added)
            self.graph = cand.graph
            self.last_rewrite = f"{rule_name(cand)}@{','.join(cand.location)}"
            self.last_added = tuple(n.name for n in cand.added)
            self.rewrites.append(rule_name(cand))
            self.actions.append(self.last_rewrite)
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
        self.episode_reward += reward
        if self.render_mode == "human":
            print(self.render_text())
        return self._obs(), float(reward), terminated, truncated, self._info()

    # ----- CompilerGym conventions --------------------------------------------------------------
    @property
    def state(self) -> EnvState:
        """The episode so far: source graph, its hash, the rewrites as `rule@location`, the reward."""
        return EnvState(graph=self._source or self._start.name, graph_hash=self._start.canonical_hash,
                        actions=tuple(self.actions), reward=self.episode_reward, cost=self.cost_model.describe(),
                        speedup=self.speedup)

    def apply(self, state: EnvState) -> None:
        """Reset to the state's source graph and replay its actions (ConfigError if one does not apply)."""
        from xrl.env.state import load_source

        start = self._start
        if state.graph_hash != start.canonical_hash:
            if state.graph == self._source:  # loaded from this very spec already: loading again gives the same
                raise ConfigError(f"state's graph {state.graph!r} has hash {start.canonical_hash[:12]}, "
                                  f"not the state's {state.graph_hash[:12]}: a different graph")
            start = load_source(state.graph)
            if start.canonical_hash != state.graph_hash:
                raise ConfigError(f"state's graph {state.graph!r} has hash {start.canonical_hash[:12]}, "
                                  f"not the state's {state.graph_hash[:12]}: a different graph")
        self.reset(options={"graph": start})
        self._source = state.graph
        for i, act in enumerate(state.actions):
            cand = next((c for c in self.all_candidates if c.step == act), None)
            if cand is None:
                raise ConfigError(f"action {i} ({act}) of the state does not apply to {self.graph.name} "
                                  f"after {i} steps")
            self._advance(cand, None)

    def fork(self) -> GraphRewriteEnv:
        """An independent copy at the same point of the same episode (it shares the immutable graphs)."""
        import copy

        other = copy.copy(self)
        other.rewrites, other.actions = list(self.rewrites), list(self.actions)
        other._capped_warned = set(self._capped_warned)
        other._start_candidates = dict(self._start_candidates)
        other._np_random = copy.deepcopy(self._np_random)
        if self._observer is not None:
            other._observer = Observer(self._observer.layout, list(self._observer.rule_id))
        return other

    def validate(self, state: EnvState | None = None, *, seed: int = 0, rtol: float = 1e-3,
                 atol: float = 1e-4) -> ValidationResult:
        """Replay `state` (default: this episode's) on a fresh copy of this env, check that the reward is
        reproduced, and that the result computes what the source computes (onnxruntime, random inputs)."""
        from xrl.env.state import validate

        return validate(self, state if state is not None else self.state, seed=seed, rtol=rtol, atol=atol)

    def replica(self) -> GraphRewriteEnv:
        """A fresh env with this one's configuration (engine and cost model shared), reset to its start graph."""
        env = GraphRewriteEnv(self._start, self.cost_model, engine=self.engine, **self._kwargs)
        env._source = self._source
        return env

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

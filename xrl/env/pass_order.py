"""The pass-ordering environment (after the XLA pass-ordering work): PPO picks the next compiler pass.

Each action runs one pass over the whole graph:

    cse            common-subexpression elimination (same op, inputs and attributes: keep the first)
    dce            dead-code elimination (operators none of whose outputs is used)
    <family>       one of xrl's rule families (fusion, algebraic, ...) applied to a fixed point: while
                   some rewrite of the family lowers (op count, estimated cost), apply the one that lowers
                   it most. The op count never rises and, at equal count, the cost falls strictly, so a
                   pass ends; `max_rewrites` (default 4 x the op count) is only a safety net

Observation (as in XLA-Gym): `op_counts`, the number of operators of each OP_VOCAB type (unknown ops
count as "other"), `progress`, the fraction of the episode done, and `idle`, 1 for each pass that has
run on the current graph without changing it (op counts alone cannot tell a pass at its fixed point).
Episodes have a fixed length (`horizon` passes; truncated, never terminated). Every pass is valid in every state.

Reward: the reduction of op count (`reward="ops"`) or of the analytic cost (`reward="cost"`) in the
step, relative to the start, in percent; with `shaping="potential"` plus gamma * Phi(s') - Phi(s),
Phi(s) = 50 * [(F0 - F(s)) / F0 + (T0 - T(s)) / T0] from FLOPs F and transcendental-op count T
(Phi = 0 at the episode's end, so the shaping telescopes away and leaves the optimal policy unchanged).

`default_order()` is xrl's default pipeline (every pass once, in PASSES order); `evaluate_orders`
reports each graph's op count under the default and under a policy, and the geomean improvement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from xrl.errors import ConfigError
from xrl.ir import Graph, Node
from xrl.ir.ops import graph_flops

FAMILY_ORDER = ("fusion", "algebraic", "distributivity", "associativity", "merge", "transpose", "reshape",
                "concat_split")
PASSES: tuple[str, ...] = ("cse", "dce", *FAMILY_ORDER)
TRANSCENDENTAL = frozenset({"Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sqrt", "Pow", "Softmax", "Gelu", "Softplus"})
REWARDS = ("ops", "cost")
SHAPINGS = ("none", "potential")


def _op_vocab() -> tuple[str, ...]:
    from xrl.features.featurize import OP_VOCAB

    return tuple(op for op in OP_VOCAB if op not in ("Input", "Weight"))


# ----- passes --------------------------------------------------------------------------------------
def dce(graph: Graph) -> Graph:
    """Drop operators none of whose outputs is read or a graph output, to a fixed point."""
    while True:
        used = {v for n in graph.topological_order for v in n.inputs} | set(graph.outputs)
        dead = [n.name for n in graph.topological_order if not any(v in used for v in n.outputs)]
        if not dead:
            return graph
        graph = graph.replace(remove=dead)


def cse(graph: Graph) -> Graph:
    """Merge operators that compute the same thing: same op, domain, attributes and (merged) inputs."""
    rename: dict[str, str] = {}
    seen: dict[tuple, Node] = {}
    dup: list[str] = []
    for n in graph.topological_order:
        key = (n.op, n.domain, tuple(rename.get(v, v) for v in n.inputs), n.attr_key(), len(n.outputs))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            continue
        dup.append(n.name)
        rename.update(zip(n.outputs, first.outputs))
    return graph.replace(remove=dup, rename=rename) if dup else graph


@cache
def family_engine(family: str) -> Any:
    from xrl.rewrite import RewriteEngine
    from xrl.rewrite.rules import load_rules

    rules = [r for r in load_rules().rules if r.family == family]
    if not rules:
        raise ConfigError(f"no rule family {family!r}; families: {', '.join(FAMILY_ORDER)}")
    return RewriteEngine(rules)


def run_family(graph: Graph, family: str, cost_model: Any, max_rewrites: int | None = None) -> Graph:
    """Apply the family's rewrites while one lowers (op count, estimated cost); the best one each time."""
    engine = family_engine(family)
    for _ in range(max_rewrites if max_rewrites is not None else 4 * len(graph) + 16):
        best, best_key = None, (0, 0.0)
        for c in engine.candidates(graph):
            new = getattr(c, "cost_graph", None) or c.graph
            d_ops = len(c.added) - len(c.removed)
            d_cost = sum(cost_model.op_cost(n, new) for n in c.added) - sum(cost_model.op_cost(n, graph)
                                                                             for n in c.removed)
            key = (d_ops, d_cost)
            if key < best_key and (d_ops < 0 or d_cost < -1e-12):
                best, best_key = c, key
        if best is None:
            return graph
        graph = best.graph
    return graph


def run_pass(graph: Graph, name: str, cost_model: Any, max_rewrites: int | None = None) -> Graph:
    if name == "cse":
        return cse(graph)
    if name == "dce":
        return dce(graph)
    return run_family(graph, name, cost_model, max_rewrites)


def default_order() -> tuple[int, ...]:
    """xrl's default pipeline: every pass once, in PASSES order."""
    return tuple(range(len(PASSES)))


def transcendentals(graph: Graph) -> int:
    return sum(n.op in TRANSCENDENTAL for n in graph.topological_order)


# ----- the environment -------------------------------------------------------------------------------
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
        self.vocab = _op_vocab()
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


# ----- evaluation ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OrderResult:
    graph: str
    ops0: int
    default_ops: int
    ops: int
    passes: tuple[str, ...]

    @property
    def improvement(self) -> float:
        """Op count under the default order / under the policy (>1: the policy's order removes more)."""
        return self.default_ops / max(self.ops, 1)


Policy = Callable[[PassOrderingEnv, dict[str, np.ndarray]], int]


def run_order(env: PassOrderingEnv, graph: Graph | str, choose: Policy) -> Graph:
    obs, _ = env.reset(options={"graph": graph})
    done = False
    while not done:
        obs, _, terminated, truncated, _ = env.step(choose(env, obs))
        done = terminated or truncated
    return env.graph


def greedy_policy(env: PassOrderingEnv, obs: dict[str, np.ndarray]) -> int:
    """The pass that removes the most ops now (ties: the earlier pass in PASSES); a one-step lookahead."""
    sizes = [len(env.apply_pass(env.graph, p)) for p in PASSES]
    return int(np.argmin(sizes))


def random_policy(seed: int = 0) -> Policy:
    rng = np.random.default_rng(seed)
    return lambda env, obs: int(rng.integers(len(PASSES)))


def evaluate_orders(graphs: Sequence[Graph | str], choose: Policy, **env_kwargs: Any) -> list[OrderResult]:
    """Each graph under the default order and under `choose`; horizons are len(PASSES) for both."""
    from xrl.env.graph_rewrite import resolve_graph

    env = PassOrderingEnv(graphs[0], **env_kwargs)
    default = default_order()

    def by_default(e: PassOrderingEnv, obs: dict[str, np.ndarray]) -> int:
        return default[e.step_count % len(default)]

    out = []
    for g in graphs:
        g = resolve_graph(g)
        default_graph = run_order(env, g, by_default)
        final = run_order(env, g, choose)
        out.append(OrderResult(g.name, len(g), len(default_graph), len(final), tuple(env.passes)))
    return out


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def suite_graphs(names: Sequence[str], hlo: bool) -> list[tuple[str, Any]]:
    """(label, Graph) for built-in graph names and, with `hlo`, the HLO fixtures shipped with xrl (hlo/NAME)."""
    from importlib import resources

    from xrl.env.graph_rewrite import resolve_graph
    from xrl.frontends.loader import load_model

    out = [(n, resolve_graph(n)) for n in names]
    if hlo:
        hlo_dir = resources.files("xrl.graphs") / "hlo"
        for p in sorted(hlo_dir.iterdir(), key=lambda p: p.name):
            if p.name.endswith(".hlo"):
                out.append((f"hlo/{p.name[:-4]}", load_model(str(p)).graph))
    return out

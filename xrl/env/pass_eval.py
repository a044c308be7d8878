"""Agents for xrl/PassOrdering-v0 and their evaluation against xrl's default pass order.

    greedy_policy        one-step lookahead: the pass that removes the most ops now
    random_policy(seed)  a uniformly random pass
    evaluate_orders      each graph's op count under the default order and under an agent (geomean: xrl.stats)
    suite_graphs         the built-in graphs (and the HLO fixtures) an evaluation runs on
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xrl.env.pass_env import PassOrderingEnv
from xrl.env.passes import PASSES, default_order
from xrl.ir import Graph
from xrl.stats import geomean  # noqa: F401 - callers import it from here (xrl.env.pass_order)


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

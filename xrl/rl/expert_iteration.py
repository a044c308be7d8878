"""Expert iteration: the guided search is the expert, the policy learns its results, and guides the next search.

As in ExIt and AlphaZero, search improves on the policy and the policy is trained towards what the
search found:

    policy <- a fresh network (graphs only by default: model.use_hints=false, the X-RLflow setting, so
              it cannot become greedy by reading each candidate's one-step cost change) or a checkpoint
    repeat for `iterations`:
        for each training graph: guided search (xrl.rl.guided) under the policy's prior for
            `search_budget` seconds; the graph's expert sequence is the cheapest one any iteration's
            search has found so far (a search that does worse this time does not overwrite it)
        targets, per training graph:
          best path   the expert sequence replayed in the env (xrl.rl.imitation.replay): at every state the
                      policy's target is the set of rewrites the sequence takes from there on (the order of
                      commuting rewrites is arbitrary)
          tree        (`tree_states` > 0) the states the search visited (every state its prior judged), at
                      most `tree_states` a graph and iteration, sampled with the seed; the latest
                      `tree_keep` iterations' samples are kept. A state's best-found return (what the
                      search found below it: 100 * (cost(s) - min cost of its descendants) / cost(input),
                      0 where nothing below it was cheaper) is the value head's target; where a
                      descendant was cheaper, the first rewrite on the way to the cheapest is the policy's
                      target too (as AlphaZero's search-improved policy)
        `epochs` of that loss (xrl.rl.imitation.clone: cross-entropy + value regression) with one optimiser
            kept across iterations
        the policy is scored by its guided search on the validation graphs; the best iteration's
            weights are kept (ties: the later, trained on more)

Every value target is a best-found return: the cheapest state at or below s on the path or in the
tree, so a search that climbed and came back does not teach a negative value. Its cost is
`value_cost`'s when one is given (the target's measured kernel cost, `experiments/expert_iteration.py
--value-cost measured`: cached op timings make re-costing every searched state affordable), else the
cost model the search used.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.rl.priors import PolicyPrior

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpertIterationConfig:
    iterations: int = 3
    search_budget: float = 3.0  # seconds of guided search per graph and iteration
    epochs: int = 20  # of cloning per iteration
    lr: float = 1e-3
    minibatch_size: int = 32
    vf_coef: float = 0.5
    max_candidates: int | None = 32  # the env's cap, as the shipped policy's training used
    use_hints: bool = False  # the X-RLflow graphs-only setting
    hidden: int = 32
    layers: int = 2
    heads: int = 2
    seed: int = 0
    tree_states: int = 0  # searched states per graph and iteration kept as targets (0: the best path only)
    tree_keep: int = 2  # iterations whose tree samples are trained on (the latest)
    clock: str = "wall"  # the search budget's clock: wall (seconds) or cpu (this process's CPU seconds)

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.epochs < 1:
            raise ConfigError(f"expert iteration needs iterations and epochs of at least 1, not {self.iterations} "
                              f"and {self.epochs}")
        if not self.search_budget > 0:
            raise ConfigError(f"search_budget must be positive, not {self.search_budget}")
        if self.clock not in ("wall", "cpu"):
            raise ConfigError(f"clock must be wall or cpu, not {self.clock!r}")
        if self.tree_states < 0 or self.tree_keep < 1:
            raise ConfigError(f"tree_states must be 0 or more and tree_keep at least 1, not {self.tree_states} "
                              f"and {self.tree_keep}")


@dataclass
class Expert:
    """The best sequence found for one training graph so far."""

    steps: list[str]
    speedup: float
    iteration: int


@dataclass
class Visited:
    """A state the guided search's prior judged: its path from the input, cost, graph, observation and the
    rewrites it offered (action k + 1 = offered[k])."""

    path: tuple[str, ...]
    cost: float
    graph: Graph
    obs: Any
    offered: list[str] = field(default_factory=list)


class RecordingPrior(PolicyPrior):
    """The trained prior, keeping every state it judges (the guided search's tree: the argmax rollout and
    every beam child it scored)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.visited: list[Visited] = []

    def judge(self, envs: Sequence[Any]) -> list[Any]:
        from xrl.rl.rollout import observe

        metas = [observe(e, self.featurize) for e in envs]
        self.visited += [Visited(tuple(e.actions), float(e.cost), e.graph, m, [c.step for c in e.candidates])
                         for e, m in zip(envs, metas)]
        return self.judge_observed(metas)


def fresh_policy(cfg: ExpertIterationConfig) -> Any:
    from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
    from xrl.nn import EncoderConfig, GraphPolicy, PolicyConfig

    torch.manual_seed(cfg.seed)
    enc = EncoderConfig(hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads)
    return GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, enc, use_hints=cfg.use_hints))


def search_with(policy: Any, graph: Graph, cost: CostModel, cfg: ExpertIterationConfig, engine: Any,
                prior: PolicyPrior | None = None) -> Any:
    """The guided search under `policy`'s prior (or `prior`, a PolicyPrior of it), run to its budget (the
    expert's time is fixed)."""
    from xrl.env.graph_rewrite import default_horizon
    from xrl.rl.evaluate import one_torch_thread
    from xrl.rl.guided import guided_search

    with one_torch_thread():
        return guided_search(prior or PolicyPrior(policy), graph, cost, engine=engine, horizon=default_horizon(graph),
                             max_candidates=cfg.max_candidates, time_limit=cfg.search_budget,
                             timer=search_timer(cfg.clock))


Lowest = dict[tuple[str, ...], tuple[float, tuple[str, ...]]]  # path -> (cheapest cost at or below, its path)


def search_timer(clock: str) -> Callable[[], float]:
    """The guided search's budget clock: with "cpu", this process's CPU seconds, not wall seconds, so that on
    a machine shared with other jobs (training at low priority) the expert's effort per search is the same
    whatever the load."""
    return time.process_time if clock == "cpu" else time.perf_counter


def best_found(visited: Sequence[Visited], best_path: Sequence[str], best_cost: float) -> Lowest:
    """Per visited path: the cheapest cost at or below it (its own, a visited descendant's, or the search's
    best's where the best's path runs through it) and the path of that cheapest state."""
    low: Lowest = {}
    ends = [(v.path, v.cost) for v in visited] + [(tuple(best_path), best_cost)]
    paths = {v.path for v in visited}
    for path, cost in ends:
        for k in range(len(path) + 1):
            prefix = path[:k]
            if prefix in paths and (prefix not in low or cost < low[prefix][0]):
                low[prefix] = (cost, path)
    return low


def tree_demo(name: str, visited: Sequence[Visited], best_path: Sequence[str], best_cost: float, c0: float,
              sample: int, rng: np.random.Generator, value_cost: CostModel | None = None) -> Any:
    """A Demonstration of `sample` visited states (at most; the input's first): each state's best-found return as
    its value target, and, where a descendant was cheaper, the first rewrite towards it as its policy target.
    With `value_cost`, costs are that model's (each state's graph re-costed)."""
    from xrl.rl.imitation import Demonstration

    unique = list({v.path: v for v in visited}.values())
    if value_cost is not None:  # the value head's measured returns: every state and the best, re-costed
        unique = [Visited(v.path, value_cost.cost(v.graph), v.graph, v.obs, v.offered) for v in unique]
        by_path = {v.path: v.cost for v in unique}
        best_cost = by_path.get(tuple(best_path), best_cost)
        c0 = by_path.get((), c0)
    low = best_found(unique, best_path, best_cost)
    keep = [v for v in unique if v.path == ()]
    rest = [v for v in unique if v.path != ()]
    if len(rest) > sample - len(keep):
        rest = [rest[i] for i in sorted(rng.choice(len(rest), max(sample - len(keep), 0), replace=False))]
    demo = Demonstration(name, "tree", c0 / best_cost, [], [], [])
    for v in keep + rest:
        cost, path = low[v.path]
        gain = max(0.0, 100.0 * (v.cost - cost) / c0)
        accept: list[int] = []
        if cost < v.cost * (1 - 1e-9) and len(path) > len(v.path) and path[len(v.path)] in v.offered:
            accept = [v.offered.index(path[len(v.path)]) + 1]
        demo.obs.append(v.obs)
        demo.actions.append(accept[0] if accept else 0)
        demo.accept.append(accept)
        demo.returns.append(gain)
    return demo


def path_returns(env: Any, graph: Graph, steps: Sequence[str], value_cost: CostModel) -> list[float]:
    """Best-found returns along a replayed path under `value_cost`: at state t, 100 * (C(s_t) - min_{t' >= t}
    C(s_t')) / C(s_0), for as many states as the env replays."""
    env.reset(options={"graph": graph})
    costs = [value_cost.cost(env.graph)]
    for step in steps:
        offered = {c.step: i + 1 for i, c in enumerate(env.candidates)}
        if step not in offered:
            break
        env.step(offered[step])
        costs.append(value_cost.cost(env.graph))
    c0, out, low = costs[0], [], math.inf
    for c in reversed(costs):
        low = min(low, c)
        out.append(100.0 * (c - low) / c0)
    return out[::-1]


def expert_iteration(train: Mapping[str, Graph], val: Mapping[str, Graph], cost: CostModel,
                     cfg: ExpertIterationConfig, *, out: str | Path, policy: Any = None,
                     value_cost: CostModel | None = None) -> dict[str, Any]:
    """Run `cfg.iterations` of expert iteration on `train`, select on `val` (or on `train` if `val` is empty);
    writes best.pt, last.pt and report.json (after every iteration) to `out`; returns a report (per iteration:
    experts, losses, validation).
    `value_cost`: the cost model of the value head's returns (None: `cost`, the search's)."""
    from xrl.env import GraphRewriteEnv
    from xrl.env.graph_rewrite import default_horizon
    from xrl.rewrite import RewriteEngine
    from xrl.rewrite.rules import load_rules
    from xrl.rl.checkpoint import save_checkpoint
    from xrl.rl.imitation import ImitationConfig, clone, replay

    if not train:
        raise ConfigError("expert iteration needs at least one training graph")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    policy = policy if policy is not None else fresh_policy(cfg)
    engine = RewriteEngine(load_rules())
    imitation = ImitationConfig(epochs=cfg.epochs, lr=cfg.lr, minibatch_size=cfg.minibatch_size, vf_coef=cfg.vf_coef)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)
    rng = np.random.default_rng(cfg.seed)
    experts: dict[str, Expert] = {}
    trees: dict[str, list[Any]] = {}  # per graph: the latest tree_keep iterations' tree demonstrations
    select_on = val or train
    env_config = {"max_candidates": cfg.max_candidates}
    report: dict[str, Any] = {"config": asdict(cfg), "train": list(train), "val": list(val),
                              "value_cost": value_cost.describe() if value_cost is not None else "search",
                              "iterations": []}
    best_score, t_start = -1.0, time.perf_counter()
    for it in range(1, cfg.iterations + 1):
        t0 = time.perf_counter()
        found = {}
        for name, graph in train.items():
            prior = RecordingPrior(policy) if cfg.tree_states else None
            run = search_with(policy, graph, cost, cfg, engine, prior)
            found[name] = run.speedup
            if name not in experts or run.speedup > experts[name].speedup * (1 + 1e-9):
                experts[name] = Expert(list(run.steps), run.speedup, it)
            if prior is not None and prior.visited:
                demo = tree_demo(name, prior.visited, run.steps, run.cost, run.original_cost, cfg.tree_states, rng,
                                 value_cost)
                trees[name] = [*trees.get(name, []), demo][-cfg.tree_keep:]
            log.info("iteration %d, %s: search %.3fx (%d states judged), expert %.3fx", it, name, run.speedup,
                     len(prior.visited) if prior is not None else 0, experts[name].speedup)
        search_s = time.perf_counter() - t0
        featurize = policy.features()
        demos = []
        for name, e in experts.items():
            env = GraphRewriteEnv(train[name], cost, engine=engine, horizon=default_horizon(train[name]),
                                  observation="summary", **env_config)
            demo = replay(env, train[name], name, "guided", e.steps, e.speedup, featurize)
            if value_cost is not None:
                demo.returns = path_returns(env, train[name], e.steps, value_cost)[:len(demo.obs)]
            else:  # best-found returns: the cheapest state from here on, not the path's end
                demo.returns = best_returns(demo.returns)
            demos.append(demo)
        path_states = sum(len(d.obs) for d in demos)
        demos += [d for ds in trees.values() for d in ds]
        history = clone(policy, demos, imitation, seed=cfg.seed + it, optimizer=opt)
        t1 = time.perf_counter()
        val_speedups = {name: search_with(policy, g, cost, cfg, engine).speedup for name, g in select_on.items()}
        score = math.exp(sum(map(math.log, val_speedups.values())) / len(val_speedups))  # geomean
        row = {"iteration": it, "experts": {n: asdict(e) for n, e in experts.items()}, "searched": found,
               "states": sum(len(d.obs) for d in demos), "path_states": path_states,
               "policy_targets": sum(1 for d in demos for a in d.accept if a),
               "first": history[0], "last": history[-1], "val": val_speedups, "val_geomean": score,
               "search_s": search_s, "clone_s": t1 - t0 - search_s, "val_s": time.perf_counter() - t1}
        report["iterations"].append(row)
        log.info("iteration %d: %d states (%d on best paths, %d with a policy target), nll %.3f -> %.3f, accuracy "
                 "%.3f, validation geomean %.3f (search %.0f s, clone %.0f s)", it, row["states"], path_states,
                 row["policy_targets"], history[0]["nll"], history[-1]["nll"], history[-1]["accuracy"], score,
                 search_s, row["clone_s"])
        meta = {"expert_iteration": {"iteration": it, "val_geomean": score, "train": list(train)}}
        save_checkpoint(out / "last.pt", policy, update=it, config={"env": env_config}, metadata=meta)
        if score >= best_score:
            best_score = score
            save_checkpoint(out / "best.pt", policy, update=it, config={"env": env_config}, metadata=meta)
            report["best_iteration"] = it
        report["time_s"] = time.perf_counter() - t_start
        # after every iteration: a run stopped early (a wall-time cap) still has its report beside best.pt
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def best_returns(returns: Sequence[float]) -> list[float]:
    """Returns-to-go (the env's rewards summed to the end) as best-found returns: from each state, the most
    that stopping somewhere later collects (0 at the least: the search returns the cheapest state it saw)."""
    rewards = [a - b for a, b in zip(returns, [*returns[1:], 0.0])]
    out, acc = [], 0.0
    for r in reversed(rewards):  # best(t) = max(0, r_t + best(t + 1))
        acc = max(0.0, r + acc)
        out.append(acc)
    return out[::-1]


__all__ = ["Expert", "ExpertIterationConfig", "RecordingPrior", "Visited", "best_found", "best_returns",
           "expert_iteration", "fresh_policy", "path_returns", "search_timer", "search_with", "tree_demo"]

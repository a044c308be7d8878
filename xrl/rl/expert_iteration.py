"""Expert iteration: the guided search is the expert, the policy learns its results, and guides the next search.

As in ExIt and AlphaZero, search improves on the policy and the policy is trained towards what the
search found:

    policy <- a fresh network (graphs only by default: model.use_hints=false, the X-RLflow setting, so
              it cannot become greedy by reading each candidate's one-step cost change) or a checkpoint
    repeat for `iterations`:
        for each training graph: guided search (xrl.rl.guided) under the policy's prior for
            `search_budget` seconds; the graph's expert sequence is the cheapest one any iteration's
            search has found so far (a search that does worse this time does not overwrite it)
        each expert sequence is replayed in the env (xrl.rl.imitation.replay): at every state the
            searched action is the policy's target (cross-entropy onto the set of rewrites the sequence
            takes from there on: the order of commuting rewrites is arbitrary) and the sequence's return
            from there the value head's (the env's reward summed to the end)
        `epochs` of that loss (xrl.rl.imitation.clone) with one optimiser kept across iterations
        the policy is scored by its guided search on the validation graphs; the best iteration's
            weights are kept (ties: the later, trained on more)

The value head's targets are the returns of the cost model the search used (the measured model's,
for a measured target).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph

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

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.epochs < 1:
            raise ConfigError(f"expert iteration needs iterations and epochs of at least 1, not {self.iterations} "
                              f"and {self.epochs}")
        if not self.search_budget > 0:
            raise ConfigError(f"search_budget must be positive, not {self.search_budget}")


@dataclass
class Expert:
    """The best sequence found for one training graph so far."""

    steps: list[str]
    speedup: float
    iteration: int


def fresh_policy(cfg: ExpertIterationConfig) -> Any:
    from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
    from xrl.nn import EncoderConfig, GraphPolicy, PolicyConfig

    torch.manual_seed(cfg.seed)
    enc = EncoderConfig(hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads)
    return GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, enc, use_hints=cfg.use_hints))


def search_with(policy: Any, graph: Graph, cost: CostModel, cfg: ExpertIterationConfig, engine: Any) -> Any:
    """The guided search under `policy`'s prior, run to its budget (the expert's time is fixed)."""
    from xrl.env.graph_rewrite import default_horizon
    from xrl.rl.evaluate import one_torch_thread
    from xrl.rl.guided import guided_search
    from xrl.rl.priors import PolicyPrior

    with one_torch_thread():
        return guided_search(PolicyPrior(policy), graph, cost, engine=engine, horizon=default_horizon(graph),
                             max_candidates=cfg.max_candidates, time_limit=cfg.search_budget)


def expert_iteration(train: Mapping[str, Graph], val: Mapping[str, Graph], cost: CostModel,
                     cfg: ExpertIterationConfig, *, out: str | Path, policy: Any = None) -> dict[str, Any]:
    """Run `cfg.iterations` of expert iteration on `train`, select on `val` (or on `train` if `val` is empty);
    writes best.pt and last.pt to `out`; returns a report (per iteration: experts, losses, validation)."""
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
    experts: dict[str, Expert] = {}
    select_on = val or train
    env_config = {"max_candidates": cfg.max_candidates}
    report: dict[str, Any] = {"config": asdict(cfg), "train": list(train), "val": list(val), "iterations": []}
    best_score, t_start = -1.0, time.perf_counter()
    for it in range(1, cfg.iterations + 1):
        t0 = time.perf_counter()
        for name, graph in train.items():
            run = search_with(policy, graph, cost, cfg, engine)
            if name not in experts or run.speedup > experts[name].speedup * (1 + 1e-9):
                experts[name] = Expert(list(run.steps), run.speedup, it)
            log.info("iteration %d, %s: search %.3fx, expert %.3fx", it, name, run.speedup, experts[name].speedup)
        search_s = time.perf_counter() - t0
        featurize = policy.features()
        demos = []
        for name, e in experts.items():
            env = GraphRewriteEnv(train[name], cost, engine=engine, horizon=default_horizon(train[name]),
                                  observation="summary", **env_config)
            demos.append(replay(env, train[name], name, "guided", e.steps, e.speedup, featurize))
        history = clone(policy, demos, imitation, seed=cfg.seed + it, optimizer=opt)
        t1 = time.perf_counter()
        val_speedups = {name: search_with(policy, g, cost, cfg, engine).speedup for name, g in select_on.items()}
        score = math.exp(sum(map(math.log, val_speedups.values())) / len(val_speedups))  # geomean
        row = {"iteration": it, "experts": {n: asdict(e) for n, e in experts.items()},
               "states": sum(len(d.obs) for d in demos), "first": history[0], "last": history[-1],
               "val": val_speedups, "val_geomean": score, "search_s": search_s, "clone_s": t1 - t0 - search_s,
               "val_s": time.perf_counter() - t1}
        report["iterations"].append(row)
        log.info("iteration %d: %d states, nll %.3f -> %.3f, accuracy %.3f, validation geomean %.3f", it,
                 row["states"], history[0]["nll"], history[-1]["nll"], history[-1]["accuracy"], score)
        meta = {"expert_iteration": {"iteration": it, "val_geomean": score, "train": list(train)}}
        save_checkpoint(out / "last.pt", policy, update=it, config={"env": env_config}, metadata=meta)
        if score >= best_score:
            best_score = score
            save_checkpoint(out / "best.pt", policy, update=it, config={"env": env_config}, metadata=meta)
            report["best_iteration"] = it
    report["time_s"] = time.perf_counter() - t_start
    return report


__all__ = ["Expert", "ExpertIterationConfig", "expert_iteration", "fresh_policy", "search_with"]

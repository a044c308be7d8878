"""Warm start from search teachers (behaviour cloning), as MLGO warm-started from LLVM's heuristic.

A teacher is any search method of `xrl optimize --search` whose result is a sequence of rewrites
(greedy, beam, taso; Tensat's extraction is not a sequence and cannot teach). For every training
graph each teacher runs once; the cheapest trajectory per graph is replayed in the training env,
which turns it into (state, action) pairs exactly as the policy will see them, the final "stop"
included. A teacher's order among independent rewrites is arbitrary (fold this BatchNormalization or
that one first), so the target at a state is the set A*(s) of every offered rewrite the teacher takes
from there on (the same `rule@location`), not only its next one. Then, for `epochs` passes over
shuffled minibatches:

    L = -mean log sum_{a in A*(s)} pi(a | s)  +  c_V * mean ((V(s) - G*(s)) / sigma)^2

G*(s) is the teacher's return from s on (the env's reward summed to the end), so the value head
starts from the returns the teacher reached, not from zero, when PPO takes over. sigma, the spread
of those returns, keeps the value term (returns are in percent, errors start in the thousands) from
drowning the imitation term in the shared encoder's gradient.

A teacher step that the env does not offer (a candidate cap that drops it) ends that demonstration
there: what the policy cannot choose, it cannot imitate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.nn.policy import GraphPolicy
from xrl.rl.rollout import observe

log = logging.getLogger(__name__)

# Methods whose result is a replayable sequence of rewrites.
TEACHERS = ("greedy", "beam", "exhaustive", "taso", "rl", "reference")
# `reference`: the research suite's stored reference sequence of a graph (`xrl.search.suite`: exhaustive or the
# best of long TASO/Tensat/beam runs and the composite-guided search, cost-raising steps included), not a search
# run here; graphs outside the suite, or whose builder changed since, get none


@dataclass(frozen=True)
class ImitationConfig:
    teachers: tuple[str, ...] = ()  # empty: no warm start
    epochs: int = 30
    lr: float = 1e-3
    minibatch_size: int = 32
    vf_coef: float = 0.5
    time_limit: float = 60.0  # seconds per teacher run
    rehearse: int = 0  # epochs of cloning after every PPO update (DAPG-style): PPO's samples rarely finish a
    # teacher's long sequence (20 BatchNorm folds before a merge), and without this it unlearns it
    teacher_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # e.g. {beam: {width: 16}}


@dataclass
class Demonstration:
    """One teacher trajectory, replayed: the observations, the teacher's actions and returns-to-go."""

    graph: str
    teacher: str
    speedup: float
    obs: list[Any]
    actions: list[int]  # the teacher's next action at each state
    returns: list[float]
    accept: list[list[int]] = field(default_factory=list)  # A*(s): every action the teacher takes from s on;
    # empty: a value-only state (a searched state with no better descendant: its return is a target, no action is)


def teacher_runs(graphs: Mapping[str, Any], cost: CostModel, cfg: ImitationConfig, *, seed: int = 0,
                 run: Callable[..., Any] | None = None) -> dict[str, tuple[str, list[str], float]]:
    """Per graph: (teacher, steps, speedup) of the cheapest trajectory any teacher found. `run` runs a
    search by name (None: the search registry's `run_search`)."""
    from xrl.search.registry import run_search as registry_run

    run_search = run if run is not None else registry_run
    unknown = [t for t in cfg.teachers if t not in TEACHERS]
    if unknown:
        raise ConfigError(f"imitation teacher(s) {', '.join(map(repr, unknown))} unknown; a teacher must return a "
                          f"sequence of rewrites: {', '.join(TEACHERS)}")
    best: dict[str, tuple[str, list[str], float]] = {}
    for name, graph in graphs.items():
        c0 = cost.cost(graph)
        for teacher in cfg.teachers:
            if teacher == "reference":
                found = reference_run(name, graph, cost)
                if found is None:
                    continue
                steps, speedup = found
            else:
                out = run_search(teacher, graph, cost, seed=seed, steps=None, time_limit=cfg.time_limit,
                                 options=dict(cfg.teacher_options.get(teacher, {})))
                steps, speedup = list(out.steps), c0 / cost.cost(out.graph)
            log.info("teacher %s on %s: %.3fx in %d rewrites", teacher, name, speedup, len(steps))
            if name not in best or speedup > best[name][2] * (1 + 1e-9):  # ties: the teacher named first
                best[name] = (teacher, steps, speedup)
    return best


def reference_run(name: str, graph: Any, cost: CostModel) -> tuple[list[str], float] | None:
    """The research suite's reference sequence for graph `name` and its speed-up under `cost`, or None where the
    suite has no reference for this graph, or a step of it does not apply (a changed builder, other rules). The
    steps name rules and nodes, so a graph whose weights differ in the last bit (a family member exported with
    another torch thread count calibrates its BatchNorms a little differently) still replays them."""
    from xrl.search import suite

    ref = suite.load_references().get(name)
    if ref is None:
        log.info("teacher reference: no reference sequence for %s", name)
        return None
    try:
        end = suite.replay(graph, ref.steps, suite.engine())
    except ValueError as e:  # the training env's rules do not offer a step of it
        log.info("teacher reference on %s: %s", name, e)
        return None
    return list(ref.steps), cost.cost(graph) / cost.cost(end)


def replay(env: Any, graph: Any, name: str, teacher: str, steps: Sequence[str], speedup: float,
           featurize: Any) -> Demonstration:
    """The teacher's trajectory as the policy sees it; stops early where the env does not offer a step."""
    env.reset(options={"graph": graph})
    demo = Demonstration(name, teacher, speedup, [], [], [])
    rewards: list[float] = []
    for t, step in enumerate([*steps, None]):  # None: the final stop
        offered = {c.step: i + 1 for i, c in enumerate(env.candidates)}
        index = 0 if step is None else offered.get(step)
        if index is None:
            log.info("%s: %s's step %s is not among the %d candidates offered; the demonstration ends there",
                     name, teacher, step, len(env.candidates))
            index = 0
        later = {offered[s] for s in steps[t:] if s in offered}
        demo.obs.append(observe(env, featurize))
        demo.actions.append(index)
        demo.accept.append(sorted(later | {index}))
        _, reward, terminated, truncated, _ = env.step(index)
        rewards.append(reward)
        if terminated or truncated:
            break
    demo.returns = list(np.cumsum(rewards[::-1])[::-1])
    return demo


def clone(policy: GraphPolicy, demos: Sequence[Demonstration], cfg: ImitationConfig, *, seed: int = 0,
          progress: bool = False, epochs: int | None = None,
          optimizer: torch.optim.Optimizer | None = None) -> list[dict[str, float]]:
    """Fit `policy` to the demonstrations for `epochs` (default cfg.epochs) with `optimizer` (default a fresh
    Adam at cfg.lr); returns per-epoch loss, accuracy (argmax = teacher; both over the states with a policy
    target) and value error (over every state)."""
    obs = [o for d in demos for o in d.obs]
    if not obs:
        raise ConfigError("no demonstration states to imitate: the teachers found no rewrites on the training graphs")
    accept = [a for d in demos for a in (d.accept or [[x] for x in d.actions])]
    returns = torch.tensor([r for d in demos for r in d.returns], dtype=torch.float32)
    sigma = max(float(returns.std()) if len(returns) > 1 else 1.0, 1.0)
    acting = sum(1 for a in accept if a)  # states with a policy target (the others are value-only)
    collate = type(obs[0]).collate
    rng = np.random.default_rng(seed)
    opt = optimizer if optimizer is not None else torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5)
    policy.train()
    history = []
    for epoch in range(cfg.epochs if epochs is None else epochs):
        t0 = time.perf_counter()
        order = rng.permutation(len(obs))
        total = correct = sq = 0.0
        for start in range(0, len(order), cfg.minibatch_size):
            idx = order[start:start + cfg.minibatch_size].tolist()
            dist, value = policy(collate([obs[i] for i in idx]))
            g = returns[idx]
            acts = [k for k, i in enumerate(idx) if accept[i]]
            flat = torch.tensor([int(dist.start[k]) + a for k in acts for a in accept[idx[k]]], dtype=torch.long)
            owner = torch.tensor([j for j, k in enumerate(acts) for _ in accept[idx[k]]], dtype=torch.long)
            picked = dist.log_probs[flat]
            top = torch.zeros(len(acts)).index_reduce_(0, owner, picked.detach(), "amax", include_self=False)
            mass = torch.zeros(len(acts)).index_add_(0, owner, (picked - top[owner]).exp())
            # -log of the probability mass on A*(s), per state with a policy target
            nll = -(top + mass.log()).mean() if acts else torch.zeros(())
            vloss = (((value - g) / sigma) ** 2).mean()
            loss = nll * len(acts) / len(idx) + cfg.vf_coef * vloss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            opt.step()
            total += nll.item() * len(acts)
            sq += vloss.item() * len(idx)
            modes = dist.mode().tolist()
            correct += sum(int(modes[k]) in accept[idx[k]] for k in acts)
        row = {"epoch": epoch + 1, "nll": total / max(acting, 1), "accuracy": correct / max(acting, 1),
               "value_mse": sq / len(obs) * sigma**2, "time_s": time.perf_counter() - t0}
        history.append(row)
        if progress:
            log.info("imitation epoch %d: nll %.3f, accuracy %.3f, value mse %.2f", row["epoch"], row["nll"],
                     row["accuracy"], row["value_mse"])
    policy.eval()
    return history


def warm_start(policy: GraphPolicy, graphs: Mapping[str, Any], cost: CostModel, env_kwargs: Mapping[str, Any],
               cfg: ImitationConfig, *, seed: int = 0) -> tuple[dict[str, Any], list[Demonstration]]:
    """Teachers on `graphs`, their best trajectories replayed and cloned into `policy`: a report of it all, and
    the demonstrations (for `rehearse`)."""
    from xrl.env import GraphRewriteEnv

    t0 = time.perf_counter()
    runs = teacher_runs(graphs, cost, cfg, seed=seed)
    env = GraphRewriteEnv(next(iter(graphs.values())), cost, **{"observation": "summary", **dict(env_kwargs)})
    featurize = policy.features()
    demos = [replay(env, graphs[name], name, teacher, steps, speedup, featurize)
             for name, (teacher, steps, speedup) in runs.items()]
    teach_s = time.perf_counter() - t0
    history = clone(policy, demos, cfg, seed=seed, progress=True)
    report = {"teachers": {d.graph: {"teacher": d.teacher, "speedup": d.speedup, "states": len(d.obs)}
                           for d in demos},
              "states": sum(len(d.obs) for d in demos), "teacher_s": teach_s,
              "clone_s": time.perf_counter() - t0 - teach_s, "history": history}
    return report, demos


__all__ = ["Demonstration", "ImitationConfig", "TEACHERS", "clone", "reference_run", "replay", "teacher_runs",
           "warm_start"]

"""Rollout collection: whole episodes under the current policy, from several processes at once.

PPO asks a `RolloutCollector` for the experience of one update and never sees how it was made:

    collect(weights, update) -> Rollout      episodes played with `weights`, seeded by (seed, update, worker)
    evaluate(weights, graphs) -> records      one greedy (argmax) episode per graph, not for training

A `Worker` holds one worker's envs, policy copy and feature cache and plays its share; `LocalCollector`
runs its workers in this process, `ProcessCollector` gives each of N spawned processes one, and gathers
their episodes in worker order. Another backend (Ray actors, a cluster queue) subclasses
`RolloutCollector` (and usually wraps `Worker`) and registers itself in the entry-point group
`xrl.collectors`; `xrl.rl.collectors.make_collector` picks one by the config's `collector.kind`.

Every episode is played to its end, so an update's experience never depends on the previous
update's unfinished episodes: given (seed, update) and the weights a rollout is reproducible,
which is what lets a resumed run continue exactly.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from xrl.errors import ConfigError
from xrl.features.incremental import IncrementalFeatures, IncrementalMeta
from xrl.features.metagraph import FeatureCache, MetaGraph
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.ppo import RolloutBatch, masked_stop


@dataclass
class EpisodeRecord:
    """What one episode did: its return, the speedup it ended with and the best it passed through."""

    graph: str
    ret: float
    length: int
    speedup: float  # cost at the start / cost at the end, under the env's cost backend
    best_speedup: float
    rewrites: list[str]
    uphill_paid_off: bool = False  # some step raised the cost and the episode still ended cheaper than before it
    time_s: float = 0.0


@dataclass
class Rollout:
    """Transitions of whole episodes, episode after episode, and their records."""

    obs: list[MetaGraph | IncrementalMeta] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    dones: list[float] = field(default_factory=list)
    # per transition: the stop action was masked when it was sampled (MASK_STOP), so PPO re-applies the mask
    stop_masked: list[bool] = field(default_factory=list)
    episodes: list[EpisodeRecord] = field(default_factory=list)
    collect_s: float = 0.0  # wall time of the collection
    # what the workers' cost models did for it (measured kernel cost: cache hits, kernels timed, seconds)
    cost_stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.obs)

    def extend(self, other: Rollout) -> None:
        for k, v in other.cost_stats.items():
            self.cost_stats[k] = self.cost_stats.get(k, 0.0) + v
        self.obs += other.obs
        self.actions += other.actions
        self.logp += other.logp
        self.values += other.values
        self.rewards += other.rewards
        self.dones += other.dones
        self.stop_masked += other.stop_masked
        self.episodes += other.episodes

    def to_batch(self) -> RolloutBatch:
        stop_masked = torch.tensor(self.stop_masked, dtype=torch.bool) if any(self.stop_masked) else None
        return RolloutBatch(self.obs, torch.tensor(self.actions, dtype=torch.long), torch.tensor(self.logp),
                            torch.tensor(self.values), torch.tensor(self.rewards), torch.tensor(self.dones),
                            stop_masked)


@dataclass(frozen=True)
class CollectorSpec:
    """Everything a worker needs to build its envs and policy (picklable: workers are spawned)."""

    graphs: tuple[str, ...]  # built-in graph names to train on
    policy: PolicyConfig
    env: Mapping[str, Any]  # GraphRewriteEnv keyword arguments (horizon, reward, shaping, max_candidates, ...)
    cost: str = "analytic"
    device: str = "h100"
    episodes_per_worker: int = 4
    seed: int = 0
    cache_size: int = 4096
    mask_stop: str = "none"  # MASK_STOP: when sampled training episodes may not stop


# When a sampled (training) episode may not take the stop action (issue 32.3). An untrained residual policy is
# the cost prior, whose no-op (hint 0) outweighs every cost-raising candidate, so sampled episodes stopped after a
# few steps and never reached the raise-then-fold sequences the benchmark needs. "improving": stop is masked while
# some candidate's estimated cost change (hint 0) is negative -- the episode ends by stopping only where greedy
# would, or at the horizon. "none": never masked (the old behaviour). Argmax/evaluation episodes are never masked;
# the mask is recorded per transition and re-applied in the PPO update, so the probability ratio stays exact.
MASK_STOP = ("none", "improving")


def check_mask_stop(mode: str) -> str:
    """`mode` if it is one of MASK_STOP, else a ConfigError."""
    if mode not in MASK_STOP:
        raise ConfigError(f"unknown mask_stop {mode!r}; choose one of: {', '.join(MASK_STOP)}")
    return mode


def stop_mask(meta: MetaGraph | IncrementalMeta, mode: str) -> bool:
    """Whether `mode` masks the stop action (candidate 0) in the single state `meta`."""
    if mode == "none":
        return False
    if mode == "improving":
        return bool((meta.cand_attr[1:, 0] < 0).any())
    raise ConfigError(f"unknown mask_stop {mode!r}; choose one of: {', '.join(MASK_STOP)}")


def play_episode(env: Any, policy: GraphPolicy, featurize: FeatureCache | IncrementalFeatures, graph: Any, *,
                 greedy: bool, generator: torch.Generator | None, record_to: Rollout | None = None,
                 mask_stop: str = "none") -> EpisodeRecord:
    """Play one episode of `env` from `graph` with `policy` (argmax if `greedy`, else sampled).

    With `record_to`, every transition is appended to it (meta-graph, action, log-prob, value,
    reward, done, stop masked), for PPO. `mask_stop` (MASK_STOP) applies to sampled episodes only.
    """
    t0 = time.perf_counter()
    env.reset(options={"graph": graph})
    ret, best, done = 0.0, 1.0, False
    costs = [env.cost]
    while not done:
        meta = observe(env, featurize)
        with torch.no_grad():
            dist, value = policy(meta)
            masked = not greedy and stop_mask(meta, mask_stop)
            if masked:
                dist = masked_stop(dist, torch.tensor([True]))
            action = dist.mode() if greedy else dist.sample(generator)
            logp = dist.log_prob(action)
        _, reward, terminated, truncated, info = env.step(int(action))
        done = terminated or truncated
        ret += reward
        best = max(best, info["speedup"])
        costs.append(env.cost)
        if record_to is not None:
            record_to.obs.append(meta)
            record_to.actions.append(int(action))
            record_to.logp.append(float(logp))
            record_to.values.append(float(value))
            record_to.rewards.append(reward)
            record_to.dones.append(float(done))
            record_to.stop_masked.append(masked)
    return EpisodeRecord(env.graph.name, ret, env.step_count, env.speedup, best, list(env.rewrites),
                         uphill_paid_off(costs), time.perf_counter() - t0)


def observe(env: Any, features: FeatureCache | IncrementalFeatures) -> MetaGraph | IncrementalMeta:
    """The env's current state as the policy reads it: candidate regions, or whole candidate graphs."""
    if isinstance(features, IncrementalFeatures):
        return features.observe(env)
    return env.meta_graph(features)


def uphill_paid_off(costs: Sequence[float], rel_tol: float = 1e-9) -> bool:
    """Whether some step raised the cost and the trajectory later went below the cost before that step."""
    for t in range(1, len(costs)):
        if costs[t] > costs[t - 1] * (1 + rel_tol) and min(costs[t:]) < costs[t - 1] * (1 - rel_tol):
            return True
    return False


class Worker:
    """One worker's envs (one per graph, reused), policy copy and feature cache; the building block of
    every collector: it plays worker `index`'s share of an update, seeded by (seed, update, index)."""

    def __init__(self, spec: CollectorSpec, index: int, cost: Any = None) -> None:
        """`cost`: the CostModel to use instead of `spec.cost` (a distributed backend passes a proxy)."""
        from xrl.cost import get_cost_model
        from xrl.env import GraphRewriteEnv, resolve_graph

        self.spec = spec
        self.index = index
        self.cost = cost if cost is not None else get_cost_model(spec.cost, device=spec.device)
        self.graphs = {name: resolve_graph(name) for name in spec.graphs}
        # xrl's policy reads the candidates themselves: the summary observation, not the padded arrays
        self.env = GraphRewriteEnv(next(iter(self.graphs.values())), self.cost,
                                   **{"observation": "summary", **dict(spec.env)})
        self.policy = GraphPolicy(spec.policy)
        self.featurize = self.policy.features(spec.cache_size)

    def _load(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(weights)
        self.policy.eval()

    def _graph(self, name: str) -> Any:
        if name not in self.graphs:
            from xrl.env import resolve_graph

            self.graphs[name] = resolve_graph(name)
        return self.graphs[name]

    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        self._load(weights)
        seq = np.random.SeedSequence([self.spec.seed, update, self.index])
        rng = np.random.default_rng(seq)
        gen = torch.Generator().manual_seed(int(seq.generate_state(1)[0]))
        out = Rollout()
        names = list(self.spec.graphs)
        before = dict(self.cost.stats)
        for _ in range(self.spec.episodes_per_worker):
            name = names[int(rng.integers(len(names)))]
            rec = play_episode(self.env, self.policy, self.featurize, self._graph(name), greedy=False,
                               generator=gen, record_to=out, mask_stop=self.spec.mask_stop)
            out.episodes.append(rec)
        out.cost_stats = {k: float(v) - float(before.get(k, 0.0)) for k, v in self.cost.stats.items()}
        return out

    def evaluate(self, weights: Mapping[str, torch.Tensor], names: Sequence[str]) -> list[EpisodeRecord]:
        self._load(weights)
        return [play_episode(self.env, self.policy, self.featurize, self._graph(n), greedy=True, generator=None)
                for n in names]


def refuse_options(name: str, options: Mapping[str, Any]) -> None:
    """ConfigError naming the settings of a `collector` section that collector `name` has none of."""
    if options:
        from xrl.errors import ConfigError

        raise ConfigError(f"collector {name!r} has no setting {', '.join(map(repr, sorted(options)))} "
                          "(the number of processes is the top-level `workers`)")


class RolloutCollector(ABC):
    """Plays the episodes PPO learns from. A plug-in subclasses it and is listed in the entry-point group
    `xrl.collectors` under the name `collector.kind` selects (see xrl.rl.collectors)."""

    @classmethod
    def from_config(cls, name: str, spec: CollectorSpec, workers: int, options: Mapping[str, Any]) -> RolloutCollector:
        """The collector for `xrl train collector=<name>`: `workers` is the top-level setting, `options` the
        rest of the `collector` section (without `kind`). By default: no options, `workers` workers."""
        refuse_options(name, options)
        return cls(spec, workers)  # type: ignore[call-arg]

    @abstractmethod
    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        """The experience of update `update`, played with policy `weights`."""

    @abstractmethod
    def evaluate(self, weights: Mapping[str, torch.Tensor], graphs: Sequence[str]) -> list[EpisodeRecord]:
        """One greedy episode per graph, in the order given."""

    def close(self) -> None:  # noqa: B027 - optional: only collectors with workers release anything
        """Release workers."""

    def __enter__(self) -> RolloutCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalCollector(RolloutCollector):
    """Plays in this process: `workers` logical workers, one after the other (same seeds as ProcessCollector)."""

    def __init__(self, spec: CollectorSpec, workers: int = 1) -> None:
        self.workers = [Worker(spec, i) for i in range(max(workers, 1))]

    @classmethod
    def from_config(cls, name: str, spec: CollectorSpec, workers: int, options: Mapping[str, Any]) -> RolloutCollector:
        refuse_options(name, options)
        return cls(spec, 1)  # one worker: the top-level `workers` counts processes

    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        t0 = time.perf_counter()
        out = Rollout()
        for w in self.workers:
            out.extend(w.collect(weights, update))
        out.collect_s = time.perf_counter() - t0
        return out

    def evaluate(self, weights: Mapping[str, torch.Tensor], graphs: Sequence[str]) -> list[EpisodeRecord]:
        return self.workers[0].evaluate(weights, graphs)


def _error_reply(e: Exception) -> bytes:
    """A worker's exception for the parent: a user error travels as itself, anything else as text."""
    from xrl.errors import XrlError

    return pickle.dumps(("error", e if isinstance(e, XrlError) else f"{type(e).__name__}: {e}"))


def _worker_main(spec: CollectorSpec, index: int, conn: Any) -> None:
    torch.set_num_threads(1)  # one core per worker: the workers are the parallelism
    try:
        worker = Worker(spec, index)
    except Exception as e:
        conn.send_bytes(_error_reply(e))
        conn.close()
        return
    conn.send_bytes(pickle.dumps(("ok", None)))
    while True:
        msg = pickle.loads(conn.recv_bytes())
        if msg[0] == "close":
            break
        try:
            result = getattr(worker, msg[0])(*msg[1:])
            # Plain pickle (tensor bytes copied), not torch's shared-memory reductions: a rollout holds
            # thousands of small tensors, and one shared segment (a file descriptor) per tensor runs out.
            conn.send_bytes(pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as e:  # report, keep serving: the parent raises it
            conn.send_bytes(_error_reply(e))
    conn.close()


class WorkerError(RuntimeError):
    """A rollout worker failed; the message carries its exception."""


class ProcessCollector(RolloutCollector):
    """`workers` spawned processes, each playing `spec.episodes_per_worker` episodes per update."""

    def __init__(self, spec: CollectorSpec, workers: int = 2) -> None:
        ctx = mp.get_context("spawn")  # no fork after torch has started its thread pools
        self.conns = []
        self.procs = []
        for i in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(spec, i, child), daemon=True, name=f"xrl-rollout-{i}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            self._replies(len(self.conns))  # each worker built its envs, or says why it could not
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, name: str, spec: CollectorSpec, workers: int, options: Mapping[str, Any]) -> RolloutCollector:
        refuse_options(name, options)
        return cls(spec, workers) if workers > 0 else LocalCollector(spec, 1)  # 0 workers: play in this process

    def _replies(self, n: int) -> list[Any]:
        results = []
        for conn in self.conns[:n]:
            try:
                status, value = pickle.loads(conn.recv_bytes())
            except EOFError:
                raise WorkerError("a rollout worker died (out of memory?)") from None
            if status != "ok":
                if isinstance(value, Exception):
                    raise value
                raise WorkerError(f"a rollout worker failed: {value}")
            results.append(value)
        return results

    def _call(self, calls: Sequence[tuple]) -> list[Any]:
        for conn, call in zip(self.conns, calls):
            conn.send_bytes(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
        return self._replies(len(calls))

    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        t0 = time.perf_counter()
        weights = {k: v.detach().cpu() for k, v in weights.items()}
        out = Rollout()
        for part in self._call([("collect", weights, update)] * len(self.conns)):
            out.extend(part)
        out.collect_s = time.perf_counter() - t0
        return out

    def evaluate(self, weights: Mapping[str, torch.Tensor], graphs: Sequence[str]) -> list[EpisodeRecord]:
        weights = {k: v.detach().cpu() for k, v in weights.items()}
        calls = [("evaluate", weights, s) for s in shard(graphs, len(self.conns))]
        return unshard(self._call(calls), len(self.conns), len(graphs))

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(("close",)))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        self.conns, self.procs = [], []


def shard(graphs: Sequence[str], n: int) -> list[list[str]]:
    """Graphs dealt round-robin to `n` workers (empty shards left out: they come first-to-last)."""
    return [s for s in (list(graphs[i::n]) for i in range(n)) if s]


def unshard(parts: Sequence[Sequence[EpisodeRecord]], n: int, total: int) -> list[EpisodeRecord]:
    """The records of `shard`'s shards back in the order of the graphs."""
    by_index = {i + j * n: rec for i, part in enumerate(parts) for j, rec in enumerate(part)}
    return [by_index[k] for k in range(total)]

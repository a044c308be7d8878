"""Rollouts on Ray actors: `xrl train collector=ray` (conf/collector/ray.yaml).

Each `RolloutActor` is the process collector's worker (`xrl.rl.rollout.Worker`: envs, policy copy,
feature cache) living in a Ray actor, spread over the cluster's nodes. Per update the learner's weights
are put in Ray's object store once and every actor plays `episodes_per_worker` whole episodes with them;
the learner and PPO are unchanged.

Actor i is seeded as the process collector's worker i, by (seed, update, i): the same seed gives the same
rollout as `ProcessCollector` with as many workers. That is also what makes faults cheap: an actor that
dies (its process killed, its node lost) is replaced by a fresh actor with the same index, which replays
the lost episodes and gets the same result; the run goes on. `max_restarts` bounds the replacements per
call, so a backend that kills every actor fails the run instead of looping.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from xrl.distributed.ray_service import (
    RemoteCostModel,
    cache_actor,
    find_cache_actor,
    require_ray,
    share_cache,
    start_measurement_actors,
)
from xrl.errors import ConfigError, XrlError
from xrl.rl.rollout import CollectorSpec, EpisodeRecord, Rollout, RolloutCollector, Worker, WorkerError, shard, unshard

ray = require_ray()

# The settings of conf/collector/ray.yaml and their defaults (a setting's type is its default's).
OPTIONS: dict[str, Any] = {"address": None, "actors": 2, "num_cpus_per_actor": 1.0, "max_restarts": 3,
                           "measure_actors": 0, "measure_num_cpus": 1.0, "measure_num_gpus": 0.0,
                           "measure_resources": {}, "shared_cache": True, "cache_path": None}


class RolloutActor(Worker):
    """A rollout worker in a Ray actor; its cost model may be a proxy to measurement actors."""

    def __init__(self, spec: CollectorSpec, index: int, measurers: Sequence[Any] = (), cache: Any = None) -> None:
        torch.set_num_threads(1)  # one core per actor: the actors are the parallelism
        self.error: Exception | str | None = None
        try:
            cost = None
            if measurers:
                cost = RemoteCostModel(measurers)
            elif cache is not None and spec.cost == "op":
                from xrl.cost import get_cost_model

                cost = share_cache(get_cost_model(spec.cost, device=spec.device), cache)
            super().__init__(spec, index, cost)
        except Exception as e:  # kept for ready(): a user error should reach the driver as itself
            self.error = e if isinstance(e, XrlError) else f"{type(e).__name__}: {e}"

    def ready(self) -> Exception | str | None:
        return self.error

    def where(self) -> tuple[int, str]:
        """(pid, node id)."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        t0 = time.perf_counter()
        out = super().collect(weights, update)
        out.collect_s = time.perf_counter() - t0  # the actor's own time: the driver's minus this is Ray's overhead
        return out


@dataclass
class Pending:
    """Calls submitted to the actors and not gathered yet: what to resubmit if an actor dies."""

    method: str
    calls: list[tuple]
    refs: list[Any]
    t0: float


class RayCollector(RolloutCollector):
    """`actors` Ray actors, each playing `spec.episodes_per_worker` episodes per update (see the module doc)."""

    def __init__(self, spec: CollectorSpec, *, address: str | None = None, actors: int = 2,
                 num_cpus_per_actor: float = 1.0, max_restarts: int = 3, measure_actors: int = 0,
                 measure_num_cpus: float = 1.0, measure_num_gpus: float = 0.0,
                 measure_resources: Mapping[str, float] | None = None, shared_cache: bool = True,
                 cache_path: str | None = None) -> None:
        if actors < 1:
            raise ConfigError(f"collector.actors must be at least 1, not {actors}")
        self.spec, self.num_cpus, self.max_restarts = spec, num_cpus_per_actor, max_restarts
        self.restarts = 0  # actors replaced so far
        self.timings: dict[str, float] = {}  # the last collect: put_s, wall_s, actor_max_s, fetch_s
        self.cache, self.own_cache = None, False
        self.measurers: list[Any] = []
        self.actors: list[Any] = []
        need = actors * num_cpus_per_actor + measure_actors * measure_num_cpus
        self.owns_ray = connect(address, num_cpus=need)
        have = ray.cluster_resources().get("CPU", 0)
        if need > have:  # Ray would wait for CPUs that never come
            self.close()
            raise ConfigError(f"collector=ray needs {need:g} CPUs (actors x num_cpus_per_actor + measure_actors x "
                              f"measure_num_cpus) and the Ray cluster has {have:g}")
        if shared_cache and spec.cost == "op":
            self.own_cache = find_cache_actor() is None  # one this run starts, it stops (the file stays)
            self.cache = cache_actor(cache_path)
        try:
            if measure_actors > 0:
                self.measurers = start_measurement_actors(
                    spec.cost, spec.device, actors=measure_actors, num_cpus=measure_num_cpus,
                    num_gpus=measure_num_gpus, resources=measure_resources, cache=self.cache)
            self.actors = [self._start(i) for i in range(actors)]
            for i in range(actors):
                self._check_ready(self.actors[i])
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, name: str, spec: CollectorSpec, workers: int, options: Mapping[str, Any]) -> RayCollector:
        """`xrl train collector=ray` (registered in the entry-point group xrl.collectors): the number of
        actors is `collector.actors`, not the top-level `workers`."""
        return cls.from_options(spec, options)

    @classmethod
    def from_options(cls, spec: CollectorSpec, options: Mapping[str, Any]) -> RayCollector:
        """From the `collector` config section (less `kind`), each setting checked against OPTIONS."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"collector ray has no setting {', '.join(map(repr, unknown))}; "
                              f"its settings: {', '.join(OPTIONS)}")
        kw = {}
        for k, v in options.items():
            d = OPTIONS[k]
            if v is not None and d is not None and not isinstance(d, str):
                ok = (isinstance(v, bool) if isinstance(d, bool) else isinstance(v, dict) if isinstance(d, dict)
                      else isinstance(v, int | float) and not isinstance(v, bool) and (type(d) is float or v == int(v)))
                if not ok:
                    raise ConfigError(f"collector.{k} must be {type(d).__name__}, not {v!r}")
                v = type(d)(v)
            kw[k] = v
        return cls(spec, **kw)

    # ----- actors ---------------------------------------------------------------------------------
    def _start(self, index: int) -> Any:
        # SPREAD: actors go to different nodes first, so a cluster's machines all play
        cls = ray.remote(RolloutActor).options(num_cpus=self.num_cpus, scheduling_strategy="SPREAD", max_restarts=0)
        return cls.remote(self.spec, index, self.measurers, self.cache)

    @staticmethod
    def _check_ready(actor: Any) -> None:
        err = ray.get(actor.ready.remote())
        if isinstance(err, Exception):
            raise err
        if err is not None:
            raise WorkerError(f"a rollout actor failed to start: {err}")

    def where(self) -> list[tuple[int, str]]:
        """(pid, node id) of each actor, in index order."""
        return ray.get([a.where.remote() for a in self.actors])

    # ----- calls that survive a dead actor ---------------------------------------------------------
    def submit(self, method: str, calls: Sequence[tuple]) -> Pending:
        """Call `method` on actor i with `calls[i]`, without waiting."""
        calls = list(calls)
        return Pending(method, calls, [getattr(self.actors[i], method).remote(*c) for i, c in enumerate(calls)],
                       time.perf_counter())

    def gather(self, pending: Pending) -> list[Any]:
        """The results of `pending`, in actor order. An actor found dead is replaced (same index, same seeds)
        and its call made again; more than `max_restarts` replacements in one gather is a WorkerError."""
        results: list[Any] = []
        replaced = 0
        for i, ref in enumerate(pending.refs):
            while True:
                try:
                    results.append(ray.get(ref))
                    break
                except ray.exceptions.RayTaskError as e:  # the call raised: report it as the worker's error
                    cause = e.cause if isinstance(e.cause, Exception) else None
                    if isinstance(cause, XrlError):
                        raise cause from None
                    raise WorkerError(f"a rollout actor failed: {cause or e}") from None
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
                    replaced += 1
                    self.restarts += 1
                    if replaced > self.max_restarts:
                        raise WorkerError(f"rollout actors died {replaced} times in one call (max_restarts "
                                          f"{self.max_restarts}); last: {type(e).__name__}") from None
                    ray.kill(self.actors[i], no_restart=True)
                    self.actors[i] = self._start(i)
                    self._check_ready(self.actors[i])
                    ref = getattr(self.actors[i], pending.method).remote(*pending.calls[i])
        return results

    # ----- the RolloutCollector interface ----------------------------------------------------------
    def submit_collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Pending:
        t0 = time.perf_counter()
        ref = ray.put({k: v.detach().cpu() for k, v in weights.items()})  # once, whatever the number of actors
        self.timings = {"put_s": time.perf_counter() - t0}
        pending = self.submit("collect", [(ref, update)] * len(self.actors))
        pending.t0 = t0
        return pending

    def gather_collect(self, pending: Pending) -> Rollout:
        ray.wait(pending.refs, num_returns=len(pending.refs))  # all done (or failed): what follows is the fetch
        t_ready = time.perf_counter()
        parts = self.gather(pending)
        out = Rollout()
        for part in parts:
            out.extend(part)
        out.collect_s = time.perf_counter() - pending.t0
        # fetch_s: the driver alone fetching and unpickling every rollout, the part that grows with the actors
        self.timings.update(wall_s=out.collect_s, actor_max_s=max(p.collect_s for p in parts),
                            fetch_s=time.perf_counter() - t_ready)
        return out

    def collect(self, weights: Mapping[str, torch.Tensor], update: int) -> Rollout:
        return self.gather_collect(self.submit_collect(weights, update))

    def evaluate(self, weights: Mapping[str, torch.Tensor], graphs: Sequence[str]) -> list[EpisodeRecord]:
        ref = ray.put({k: v.detach().cpu() for k, v in weights.items()})
        shards = shard(graphs, len(self.actors))
        return unshard(self.gather(self.submit("evaluate", [(ref, s) for s in shards])), len(self.actors),
                       len(graphs))

    def close(self) -> None:
        for a in self.actors + self.measurers:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone: nothing to release
                pass
        self.actors, self.measurers = [], []
        if self.own_cache and self.cache is not None:
            ray.kill(self.cache, no_restart=True)
            self.cache, self.own_cache = None, False
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
            self.owns_ray = False


def connect(address: str | None, num_cpus: float = 0) -> bool:
    """Join Ray: the connection this process already has, else `address` (auto, host:port), else (None) a
    Ray started here for this process, with at least `num_cpus` logical CPUs (more actors than cores is
    the user's choice on one machine). Returns whether this call connected (then close() disconnects)."""
    if ray.is_initialized():
        return False
    if address not in (None, "auto") and "://" not in address:
        probe_address(address)
    try:
        if address is None:
            ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(num_cpus)), include_dashboard=False)
        else:
            ray.init(address=address)
    except ConnectionError as e:
        raise ConfigError(f"cannot join the Ray cluster at collector.address={address!r}: {e}") from None
    return True


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """ConfigError unless something listens at host:port (ray.init would retry an unreachable one for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"collector.address must be null, auto or host:port, not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"cannot join the Ray cluster at collector.address={address!r}: {e}") from None

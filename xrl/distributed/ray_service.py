"""Measured costs as a Ray service: measurement actors, and one op-timing cache for the whole cluster.

A timing taken beside busy rollouts measures the rollouts. So a measured backend (op, ort, e2e) runs
on dedicated *measurement actors* that hold their own CPUs (or a GPU: Ray resources), and whoever
needs costs holds a `RemoteCostModel`, a CostModel whose answers come from those actors.

The op backend's timings persist in an sqlite file (`OpTimingCache`), one per machine. Under Ray the
cluster shares one: `CostCacheActor`, a named actor pinned to one node in front of that node's file,
and `RemoteTimingCache`, a drop-in for `OpMeasuredCostModel.cache` that asks it. The actor writes
through `OpTimingCache`, so each timing is its own sqlite transaction: a killed actor loses nothing it
committed, and Ray restarts it on the same node, on the same file.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xrl.cost.base import CostModel, Measurement
from xrl.errors import ConfigError
from xrl.ir import Graph, Node


def require_ray() -> Any:
    """The `ray` module, or a one-line user error saying how to get it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'xrl[ray]' (or set collector=process)") from None
    return ray


ray = require_ray()

NAMESPACE = "xrl"
CACHE_ACTOR = "xrl-op-cache"


# ----- the cluster's op-timing cache ------------------------------------------------------------
class CostCacheActor:
    """One OpTimingCache (an sqlite file on this actor's node) served to the cluster."""

    def __init__(self, path: str) -> None:
        from xrl.cost.op_measured import OpTimingCache

        self.cache = OpTimingCache(path)
        len(self.cache)  # open (and create) now: a bad path fails the actor's start, not a later get

    def get(self, key: str, device: str) -> Measurement | None:
        return self.cache.get(key, device)

    def put(self, key: str, device: str, config: str, m: Measurement) -> Measurement:
        return self.cache.put(key, device, config, m)  # INSERT OR IGNORE: a retried put is harmless

    def size(self) -> int:
        return len(self.cache)

    def where(self) -> tuple[str, int, str]:
        """(file, pid, node id): what a test needs to kill it and check it came back."""
        return str(self.cache.path), os.getpid(), ray.get_runtime_context().get_node_id()


def find_cache_actor() -> Any:
    """The cluster's cache actor if one is running, else None."""
    try:
        return ray.get_actor(CACHE_ACTOR, namespace=NAMESPACE)
    except ValueError:
        return None


def cache_actor(path: str | Path | None = None, node_id: str | None = None) -> Any:
    """The cluster's cache actor: the running one (by name), else one started on `node_id` (default: this
    process's node) in front of `path` (default: that node's $XRL_CACHE_DIR/op_costs.sqlite).

    Pinned to its node (the file lives there) and restarted there by Ray if its process dies; calls made
    while it restarts are retried (max_task_retries), which is safe because a put never overwrites.
    """
    running = find_cache_actor()
    if running is not None:
        return running
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from xrl.cost.op_measured import default_cache_path

    node = node_id or ray.get_runtime_context().get_node_id()
    cls = ray.remote(CostCacheActor).options(
        name=CACHE_ACTOR, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_restarts=-1,
        max_task_retries=-1, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    return cls.remote(str(Path(path or default_cache_path()).expanduser().resolve()))


class RemoteTimingCache:
    """OpTimingCache's interface (get, put, len, close, path), answered by the cluster's cache actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        file, _, node = ray.get(actor.where.remote())
        self.path = f"{file} (Ray actor {CACHE_ACTOR!r} on node {node[:8]})"

    def get(self, key: str, device: str) -> Measurement | None:
        return ray.get(self.actor.get.remote(key, device))

    def put(self, key: str, device: str, config: str, m: Measurement) -> Measurement:
        return ray.get(self.actor.put.remote(key, device, config, m))

    def __len__(self) -> int:
        return ray.get(self.actor.size.remote())

    def close(self) -> None:
        """The actor owns the file; nothing to release here."""


def share_cache(model: CostModel, actor: Any) -> CostModel:
    """`model` with its disk cache replaced by the cluster's, where it has one (the op backend)."""
    from xrl.cost.op_measured import OpMeasuredCostModel

    if isinstance(model, OpMeasuredCostModel):
        model.cache = RemoteTimingCache(actor)
    return model


# ----- measurement actors ----------------------------------------------------------------------
class MeasurementActor:
    """One cost backend, measuring on the cores (or GPU) this actor holds."""

    def __init__(self, name: str, device: str | None, options: Mapping[str, Any], cache: Any = None) -> None:
        from xrl.cost import get_cost_model

        self.model = get_cost_model(name, device=device, **dict(options))
        if cache is not None:
            share_cache(self.model, cache)

    def info(self) -> dict[str, Any]:
        m = self.model
        return {"name": m.name, "per_op": m.per_op, "measured": m.measured, "describe": m.describe()}

    def stats(self) -> dict[str, int]:
        """What the backend counted (the op backend: timings measured here, timings found in the cache)."""
        return dict(self.model.stats)

    def where(self) -> tuple[int, str]:
        """(pid, node id)."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def op_costs(self, ops: Sequence[Graph]) -> list[float]:
        """Seconds for each one-node graph (`op_graph`): the per-op costs a proxy asked for in one call."""
        return [self.model.op_cost(g.nodes[next(iter(g.nodes))], g) for g in ops]

    def cost(self, graph: Graph) -> float:
        return self.model.cost(graph)

    def measure(self, graph: Graph) -> Measurement:
        return self.model.measure(graph)

    def remeasure(self, graph: Graph) -> Measurement:
        return self.model.remeasure(graph)


def start_measurement_actors(name: str, device: str | None = None, options: Mapping[str, Any] | None = None, *,
                             actors: int = 1, num_cpus: float = 1, num_gpus: float = 0,
                             resources: Mapping[str, float] | None = None, cache: Any = None) -> list[Any]:
    """`actors` measurement actors for backend `name`, each holding `num_cpus` CPUs and `num_gpus` GPUs (and
    `resources`: e.g. a custom resource that only the measurement nodes advertise), ready to answer."""
    cls = ray.remote(MeasurementActor).options(num_cpus=num_cpus, num_gpus=num_gpus, resources=dict(resources or {}))
    handles = [cls.remote(name, device, dict(options or {}), cache) for _ in range(actors)]
    ray.get([h.info.remote() for h in handles])  # a bad backend name or option fails here, once
    return handles


def _op_key(node: Node, graph: Graph) -> str:
    """What decides one op's cost for every backend (op_measured's op_config: types, attributes, small constants)."""
    from xrl.cost.op_measured import op_config

    return op_config(node, graph)


def _pick(key: str, n: int) -> int:
    """Which of `n` actors answers for `key`: always the same one, so its in-process caches keep hitting."""
    return int(hashlib.blake2b(key.encode(), digest_size=8).hexdigest(), 16) % n


class RemoteCostModel(CostModel):
    """A CostModel answered by measurement actors: the same API and the same numbers as the backend itself.

    Per-op backends: each distinct op configuration is asked once (one-node graphs, in one call per graph)
    and remembered here, so `delta_cost` stays cheap. Whole-graph backends: each graph is measured once
    (by canonical hash) on the actor its hash picks; `remeasure` always asks again.
    """

    def __init__(self, actors: Sequence[Any]) -> None:
        super().__init__()
        if not actors:
            raise ConfigError("RemoteCostModel needs at least one measurement actor")
        self.actors = list(actors)
        info = ray.get(self.actors[0].info.remote())
        self.name, self.per_op, self.measured = info["name"], info["per_op"], info["measured"]
        self._describe = info["describe"]
        self._ops: dict[str, float] = {}
        self._graphs: dict[str, Measurement] = {}

    def describe(self) -> str:
        return f"{self._describe} on {len(self.actors)} Ray measurement actor{'s' if len(self.actors) > 1 else ''}"

    def _actor(self, key: str) -> Any:
        return self.actors[_pick(key, len(self.actors))]

    def _fill(self, graph: Graph, nodes: Sequence[Node]) -> None:
        """Ask for the op configurations of `nodes` not known yet, grouped by the actor that answers each."""
        from xrl.cost.op_measured import op_graph

        todo: dict[str, Node] = {}
        for n in nodes:
            key = _op_key(n, graph)
            if key not in self._ops and key not in todo:
                todo[key] = n
        groups: dict[int, list[str]] = {}
        for key in todo:
            groups.setdefault(_pick(key, len(self.actors)), []).append(key)
        refs = {i: self.actors[i].op_costs.remote([op_graph(todo[k], graph) for k in keys])
                for i, keys in groups.items()}
        for i, keys in groups.items():
            self._ops.update(zip(keys, ray.get(refs[i])))

    def op_cost(self, node: Node, graph: Graph) -> float:
        if not self.per_op:
            return self._op_cost(node, graph)
        self._fill(graph, [node])
        return self._ops[_op_key(node, graph)]

    def _op_cost(self, node: Node, graph: Graph) -> float:
        raise ConfigError(f"the {self.name!r} cost model times whole graphs and has no per-op cost")

    def cost(self, graph: Graph) -> float:
        if self.per_op:
            nodes = list(graph.nodes.values())
            self._fill(graph, nodes)
            return math.fsum(self._ops[_op_key(n, graph)] for n in nodes)
        return self.measure(graph).median_s

    def measure(self, graph: Graph) -> Measurement:
        if self.per_op:  # the backend combines the per-op spreads: ask it for the whole graph
            return ray.get(self._actor(graph.canonical_hash).measure.remote(graph))
        m = self._graphs.get(graph.canonical_hash)
        if m is None:
            m = self._graphs[graph.canonical_hash] = ray.get(self._actor(graph.canonical_hash).measure.remote(graph))
        return m

    def remeasure(self, graph: Graph) -> Measurement:
        return ray.get(self._actor(graph.canonical_hash).remeasure.remote(graph))

"""The measured cost of an onnxruntime target: each kernel the runtime runs, timed alone on this machine.

The roofline of `TargetCostModel` ranks candidates by an estimate that the machine contradicts on the
rewrites that matter (merging small GEMMs and convolutions). This model keeps the same kernels (what
`xrl.cost.runtime_fusion` predicts onnxruntime runs after its own fusions, checked against the models
onnxruntime writes) and replaces each kernel's roofline by a timing, as TASO timed each operator on
the device it optimised for:

- Each kernel becomes a small ONNX model: its nodes with their real shapes, attributes and weights,
  the values it reads from outside as inputs, the values it writes for outside as outputs. onnxruntime
  loads it with the target's provider, thread count and optimisation level, so it fuses the kernel's
  nodes as it would in the whole graph.
- A kernel is known by what onnxruntime runs for it: the optimised model the session writes, in a
  canonical form (`run_config`: names, weight values and attributes at their defaults play no part).
  Two kernels the runtime optimises alike (a Conv with a BatchNormalization it folds, and the Conv xrl
  folded) share one timing, so a rewrite the runtime does itself costs exactly nothing.
- New kernels are timed together, interleaved: warm-up, then `repeats` rounds, each running every
  kernel for one sample of at least `min_sample_s`; a kernel's time is the median of its samples, its
  spread is kept. With one thread on the CPU the clock is the calling thread's CPU time (onnxruntime
  computes on it), which other processes taking the core away do not inflate.
- Timings are net of a session run's fixed cost: a trivial model is timed in the same rounds and its
  time (less one dispatch) is taken off every kernel's. The drift of the machine between batches is
  measured on anchor kernels (timed in an earlier batch) re-timed beside every batch, and divided out.
  On the CPU, the NCHWc layout conversions a lone convolution pays (and the whole graph pays only at
  its ends) are timed alone and taken off. A graph's cost is the run's fixed cost (`RunOverhead`,
  measured once per machine) plus its kernels' net costs.
- Timings persist in the on-disk cache shared with the `op` model's design (`OpTimingCache`: one
  transaction per timing, a checksum per row keyed by the install's secret, insane or tampered rows
  refused and re-measured), in `kernel_costs.sqlite`, keyed by the run key and by the runtime's version,
  provider, threads and the CPU or GPU model; a kernel's model key maps to its run key in the same file
  (an alias row, checksummed alike). A cached timing outside its kernel's `roofline_bounds` (0.1x its work
  at the profile's peak rates to 1000x its roofline estimate) is refused, measured again and counted.
- A kernel not yet timed is timed on first use. Past `deadline` (the search's time limit) or when
  onnxruntime cannot run it alone, its cost is the roofline scaled by the measured-to-roofline ratio
  of the kernels timed so far: a named fallback, counted in `stats`.

What it is: a sum of measured parts, so it is still a model of the whole graph: what onnxruntime does
across kernels (on the CPU, an NCHWc Conv absorbing the Add and activation after it; cache residency
between kernels) is not in it. `experiments/validate_cost.py` checks it against end-to-end timing.
Once its kernels are in the cache it is deterministic and costs microseconds per candidate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from xrl.cost.base import Measurement
from xrl.cost.op_measured import OpTimingCache, cache_dir, cpu_model, stable_value
from xrl.cost.runtime_fusion import ELIMINATED, VIEW_OPS, Kernel, local_region, runtime_plan, subgraph
from xrl.cost.targets import TargetCostModel, written_values
from xrl.cost.timing import calling_thread_clock, check_counts, summarize
from xrl.errors import ConfigError
from xrl.ir import Graph, TensorType

log = logging.getLogger(__name__)

KERNEL_CACHE_FILE = "kernel_costs.sqlite"
_SMALL_CONST = 64  # integer weights up to this many elements are shape-like: their values decide the work
NCHWC = "com.microsoft.nchwc"  # onnxruntime's blocked-layout CPU kernels
_OVERHEAD_CHAIN = 16  # trivial kernels in the chain that measures the per-kernel dispatch cost
ANCHORS = 3  # kernels kept open to measure the machine's drift between batches
# A cached kernel timing this far from the kernel's own roofline estimate is not its run time on any machine
# xrl targets (a 1% edit passes any fixed bound; this one is per kernel): refused and measured again
BOUND_LOW, BOUND_HIGH = 0.1, 1000.0
# ... below this, a kernel's timing net of the run's fixed cost is within that cost's noise (and floored at one
# dispatch): no lower bound there
BOUND_MIN_S = 1e-5


@dataclass(frozen=True)
class KernelModel:
    """One kernel as a stand-alone graph, and the key that decides its run time."""

    graph: Graph
    key: str
    config: str


def kernel_model(kernel: Kernel, graph: Graph) -> KernelModel:
    """The graph of `kernel`'s nodes alone: what it reads from outside as inputs (weights as weights),
    what it writes for outside as outputs. Its key is a canonical form: value names are replaced by
    their position, weights by their type (and, for small integer weights, their values)."""
    nodes = kernel.nodes
    inside = {v for n in nodes for v in n.outputs}
    members = {n.name for n in nodes}
    outputs = tuple(dict.fromkeys(
        v for n in nodes for v in n.outputs
        if v in graph.outputs or any(u.name not in members for u in graph.consumers.get(v, ()))))
    if not outputs:  # everything it computes stays inside: keep its last output so the run does the work
        outputs = (nodes[-1].outputs[0],)
    order = [n for n in graph.topological_order if n.name in members] if len(nodes) > 1 else list(nodes)
    acts: list[str] = []
    weights: dict[str, np.ndarray] = {}
    canon: dict[str, str] = {}
    for n in order:
        for v in n.inputs:
            if not v or v in inside or v in canon:
                continue
            if graph.is_weight(v):
                canon[v] = f"w{len(weights)}"
                weights[v] = graph.initializers[v]
            else:
                canon[v] = f"x{len(acts)}"
                acts.append(v)
    for i, n in enumerate(order):
        for j, v in enumerate(n.outputs):
            canon[v] = f"n{i}.{j}"
    entries = []
    for n in order:
        consts = {}
        for i, v in enumerate(n.inputs):
            w = weights.get(v)
            if w is not None and w.size <= _SMALL_CONST and not np.issubdtype(w.dtype, np.floating):
                consts[str(i)] = [int(x) for x in w.reshape(-1)]
        entries.append({"op": n.op, "domain": n.domain, "attrs": {k: stable_value(a) for k, a in n.attrs.items()},
                        "in": [canon.get(v, "") for v in n.inputs], "consts": consts,
                        "out": [canon[v] for v in n.outputs]})
    values = [*acts, *weights, *(v for n in order for v in n.outputs)]
    config = json.dumps({"kernel": kernel.op, "nodes": entries, "written": [canon[v] for v in outputs],
                         "types": {canon[v]: str(graph.type_of(v)) for v in values}},
                        sort_keys=True, separators=(",", ":"))
    types = {v: graph.type_of(v) for v in values}
    sub = Graph(order, acts, outputs, types, weights, name=f"kernel_{kernel.op}", domain_opsets=graph.domain_opsets)
    return KernelModel(sub, hashlib.sha256(config.encode()).hexdigest()[:32], config)


def trivial_chain(length: int) -> Graph:
    """`length` Adds of one-element tensors in a chain: the run overhead and per-kernel dispatch probe."""
    from xrl.ir import Node

    t = TensorType((1,), "float32")
    nodes, prev = [], "x"
    for i in range(length):
        nodes.append(Node(f"add{i}", "Add", (prev, "y"), (f"v{i}",)))
        prev = f"v{i}"
    types = {"x": t, "y": t, **{f"v{i}": t for i in range(length)}}
    return Graph(nodes, ["x", "y"], [prev], types, name=f"chain{length}")


@dataclass(frozen=True)
class RunOverhead:
    """What a session run costs besides its kernels: `fixed_s` once per run, `dispatch_s` per kernel."""

    fixed_s: float
    dispatch_s: float


@dataclass
class LocalPlan:
    """A graph's kernels as `MeasuredKernelCostModel.plan_costs` priced them: the total, each kernel's cost,
    node name -> kernel index, and each kernel's node names."""

    total: float
    costs: list[float]
    kernel_of: dict[str, int]
    kernel_nodes: list[tuple[str, ...]]


class MeasuredKernelCostModel(TargetCostModel):
    """The sum of the measured run times of the kernels a target's onnxruntime runs, plus its run overhead."""

    name = "target"
    measured = False  # cached timings: the same graph costs the same on every call, no confirmation needed
    local_costing = True  # plan_costs / local_cost: greedy re-costs only the kernels near a rewrite

    def __init__(self, *, device: str | None = None, target: str | None = None, threads: int | None = 1,
                 warmup: int = 2, repeats: int = 7, min_sample_s: float = 2e-4, cache_path: str | Path | None = None,
                 seed: int = 0, max_kernels_per_batch: int = 64) -> None:
        """threads: onnxruntime intra-op threads while timing (1, as `--measure`: timings other tenants of
            a shared machine inflate least); None: onnxruntime's default.
        min_sample_s: one sample runs a fast kernel as many times as it takes to last this long.
        """
        super().__init__(device=device, target=target)
        check_counts(warmup, repeats, "the measured kernel cost", threads=threads)
        self.threads, self.warmup, self.repeats, self.seed = threads, warmup, repeats, seed
        self.min_sample_s = min_sample_s
        self.max_kernels_per_batch = max_kernels_per_batch
        self.cache = OpTimingCache(cache_path or cache_dir() / KERNEL_CACHE_FILE)
        self.providers = _providers(self.target.provider)
        self.device_id = _device_id(self.target.provider, threads)
        self.deadline: float | None = None  # time.monotonic() past which new kernels are not timed
        self.stats: dict[str, float] = {"cache_hits": 0, "measured": 0, "measure_s": 0.0, "fallback": 0,
                                        "out_of_bounds": 0, "out_of_bounds_measured": 0}
        self._alias: dict[str, str] = {}  # kernel model key -> the key of what onnxruntime runs for it
        self._timing: dict[str, Measurement] = {}  # run key -> its timing
        self._anchors: dict[str, Prepared] = {}  # kernels re-timed beside every batch: the drift between batches
        self._trivial: Prepared | None = None  # a one-Add model timed in every batch: the run's fixed cost then
        self._drift = 1.0
        self._measured_costs: dict[tuple, float] = {}  # (op, nodes, written) -> seconds: node objects are shared
        self._models: dict[tuple, KernelModel] = {}  # the kernel models `_time_missing` built for `kernel_cost`
        self._roofline_s = 0.0  # the roofline of the kernels timed so far: the fallback's scale
        self._timed_s = 0.0
        self._overhead: RunOverhead | None = None

    def timing_device(self) -> str | None:
        """Where its kernels are timed: the target's provider on this machine."""
        return "cpu" if self.target.provider == "cpu" else "cuda"

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a worker process gets a copy): open sessions stay behind, to be made anew there."""
        state = dict(self.__dict__)
        state.update(_anchors={}, _trivial=None)
        return state

    # ----- the CostModel interface --------------------------------------------------------------
    def cost(self, graph: Graph) -> float:
        key = graph.canonical_hash
        c = self._costs.get(key)
        if c is None:
            plan, kernels = runtime_plan(graph, self.target.provider)
            written = written_values(kernels, plan, by_name=True)  # once for the timing and the costing
            self._time_missing(kernels, plan, written)
            c = self.overhead().fixed_s + math.fsum(self._measured_kernel_cost(k, plan, w)
                                                    for k, w in zip(kernels, written))
            if len(self._costs) >= self.CACHE_SIZE:
                self._costs.clear()
                self._kernel_costs.clear()
                self._measured_costs.clear()
            self._costs[key] = c
        return c

    def kernels(self, graph: Graph) -> list[Kernel]:
        return runtime_plan(graph, self.target.provider)[1]

    def op_costs(self, graph: Graph) -> dict[str, float]:
        plan, kernels = runtime_plan(graph, self.target.provider)
        written = written_values(kernels, plan, by_name=True)
        self._time_missing(kernels, plan, written)
        out = {n: 0.0 for n in graph.nodes}
        for k, w in zip(kernels, written):
            out[k.anchor.name] = out.get(k.anchor.name, 0.0) + self._measured_kernel_cost(k, plan, w)
        return out

    def kernel_cost(self, k: Kernel, graph: Graph) -> float:
        return self._measured_kernel_cost(k, graph, _written(k, graph))

    # ----- local re-costing (a search's candidates): only the kernels a rewrite changed -----------------
    def plan_costs(self, graph: Graph) -> LocalPlan:
        """`graph`'s kernels and their costs, for `local_cost` of its rewrites (its total is `cost(graph)`)."""
        plan, kernels = runtime_plan(graph, self.target.provider)
        written = written_values(kernels, plan, by_name=True)
        self._time_missing(kernels, plan, written)
        costs = [self._measured_kernel_cost(k, plan, w) for k, w in zip(kernels, written)]
        kernel_of = {n.name: i for i, k in enumerate(kernels) for n in k.nodes}
        return LocalPlan(self.overhead().fixed_s + math.fsum(costs), costs, kernel_of,
                         [tuple(n.name for n in k.nodes) for k in kernels])

    def local_cost(self, parent: LocalPlan, graph: Graph, seeds: Sequence[str]) -> float | None:
        """The cost of `graph`, a rewrite of the graph `parent` plans, with only the kernels near the rewrite
        (`seeds`: the node names it touched) planned and costed again: the parent's other kernels, and their
        costs, are unchanged (onnxruntime's fusions are local: `xrl.cost.runtime_fusion.local_region`). A
        kernel timed before is found by its structure (its nodes and what it writes), so a rewrite re-costs
        only what it changed. None where the region reads nothing outside (the caller costs the whole graph)."""
        region, touched = local_region(graph, seeds, parent.kernel_of, parent.kernel_nodes)
        sub = subgraph(graph, region) if region else None
        if sub is None:
            return None
        plan, kernels = runtime_plan(sub, self.target.provider)
        written = written_values(kernels, plan, by_name=True)
        self._time_missing(kernels, plan, written)
        new = [self._measured_kernel_cost(k, plan, w) for k, w in zip(kernels, written)]
        # one correctly rounded change: the same rewrite in two places (q and v adapters) costs exactly the same,
        # so ties still go to the engine's order
        return parent.total + math.fsum([*new, *(-parent.costs[i] for i in touched)])

    def _measured_kernel_cost(self, k: Kernel, graph: Graph, written: tuple[str, ...]) -> float:
        """`kernel_cost`, given what `k` writes for outside (`_written`)."""
        if k.op == ELIMINATED or k.op in VIEW_OPS or not k.nodes:
            return 0.0  # a separate activation kernel is timed with its anchor's model (exported as the pair)
        memo_key = (k.op, k.nodes, written)
        memo = self._measured_costs.get(memo_key)
        if memo is not None:
            return memo
        km = self._models.pop(memo_key, None) or kernel_model(k, graph)
        m = self._timing_of(km.key, lambda: self.roofline_bounds(k, graph))
        if m is None:  # not timed: the named fallback
            self.stats["fallback"] += 1
            c = super().kernel_cost(k, graph) * self._fallback_scale()
        else:  # timings are net of the run's fixed cost, which the graph pays once
            c = max(m.median_s, self.overhead().dispatch_s)
        self._measured_costs[memo_key] = c
        return c

    def describe(self) -> str:
        where = "cpu" if self.target.provider == "cpu" else "cuda"
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else "default threads"
        fallback = f"; {int(self.stats['fallback'])} kernels costed by the scaled roofline" \
            if self.stats["fallback"] else ""
        return f"{self.target.name}: measured kernels (onnxruntime {where}, {threads}){fallback}"

    def report(self) -> dict[str, Any]:
        """Cache hit rate and time spent measuring, for `--json` and training logs."""
        looked_up = self.stats["cache_hits"] + self.stats["measured"]
        return {"kernel_cache_hits": int(self.stats["cache_hits"]), "kernels_measured": int(self.stats["measured"]),
                "kernel_cache_hit_rate": self.stats["cache_hits"] / looked_up if looked_up else None,
                "measure_s": round(self.stats["measure_s"], 3), "fallback_kernels": int(self.stats["fallback"]),
                # cached rows refused (failed their keyed checksum, or outside their kernel's roofline bounds)
                "cache_rows_refused": int(self.cache.refused),
                "out_of_bounds_refused": int(self.stats["out_of_bounds"]),
                "out_of_bounds_measured": int(self.stats["out_of_bounds_measured"]),
                "drift": self._drift, "cache": str(self.cache.path), "device_id": self.device_id}

    # ----- measuring ----------------------------------------------------------------------------
    def overhead(self) -> RunOverhead:
        """The fixed cost of a run and the dispatch cost of a kernel: from the cache, else measured now."""
        if self._overhead is None:
            one, chain = kernel_model_of(trivial_chain(1)), kernel_model_of(trivial_chain(_OVERHEAD_CHAIN + 1))
            got = [self._cached_probe(k) for k in (one, chain)]
            if any(m is None for m in got):
                prepared = {k.key: self._prepare(k.graph) for k in (one, chain)}
                timed = self._time_batch(prepared, repeats=max(self.repeats, 15), anchors=False, net=False)
                got = [self.cache.put(k.key, self.device_id, k.config, timed[k.key]) for k in (one, chain)]
            t1, tn = got[0].median_s, got[1].median_s
            dispatch = max((tn - t1) / _OVERHEAD_CHAIN, 0.0)
            self._overhead = RunOverhead(max(t1 - dispatch, 0.0), dispatch)
        return self._overhead

    def _cached_probe(self, probe: KernelModel) -> Measurement | None:
        """A probe's cached timing (the run overhead's, a layout conversion's), refused above BOUND_HIGH x its
        roofline: it is added to, or taken off, every graph's cost."""
        m = self.cache.get(probe.key, self.device_id)
        if m is not None and not in_bounds(m.median_s, (0.0, BOUND_HIGH * self._probe_roofline(probe.graph))):
            self.cache.discard(probe.key, self.device_id)
            self.stats["out_of_bounds"] += 1
            log.warning("a cached probe timing (%.3g s) is above %gx its roofline; measured again", m.median_s,
                        BOUND_HIGH)
            return None
        return m

    def _probe_roofline(self, graph: Graph) -> float:
        """A probe graph's roofline: a launch per node and every value read or written once."""
        d = self.analytic.device
        nbytes = sum(graph.type_of(v).nbytes for v in graph.types)
        return len(graph) * d.launch_overhead_s + nbytes / d.bandwidth

    def roofline_bounds(self, k: Kernel, graph: Graph) -> tuple[float, float]:
        """(lowest, highest) seconds a cached timing of `k` may hold: BOUND_LOW x its work at the device
        profile's peak rates (no launch overhead, full efficiency: no kernel runs faster than its roofline,
        and a machine 10x faster than the profile is still inside; none where that is under BOUND_MIN_S) and
        BOUND_HIGH x its roofline estimate."""
        from xrl.cost.targets import contrib_flops
        from xrl.ir.ops import node_flops

        d = self.analytic.device
        inside = {v for n in k.nodes for v in n.outputs}
        read = {v for n in k.nodes for v in n.inputs if v and v not in inside}
        nbytes = sum(graph.type_of(v).nbytes for v in read.union(written_values([k], graph)[0]))
        anchor = k.anchor
        flops = contrib_flops(anchor, graph) if anchor.domain not in ("", "ai.onnx") else node_flops(anchor, graph)
        peak_s = max(flops / d.peak_flops if d.peak_flops else 0.0, nbytes / d.bandwidth if d.bandwidth else 0.0)
        low = BOUND_LOW * peak_s
        return (low if low >= BOUND_MIN_S else 0.0), BOUND_HIGH * super().kernel_cost(k, graph)

    def _timing_of(self, key: str, roofline: Any = None) -> Measurement | None:
        """The timing of the kernel whose model has `key`, through the kernel onnxruntime runs for it.

        `roofline` (a callable giving `roofline_bounds`): a timing read from the cache outside them is
        refused (deleted, counted) and the kernel is measured again. Timings measured in this process are
        kept whatever they are."""
        run_key = self._alias.get(key)
        if run_key is None:
            run_key = self.cache.get_alias(key, self.device_id)
            if run_key is None:
                return None
            self._alias[key] = run_key
        m = self._timing.get(run_key)
        if m is None:
            m = self.cache.get(run_key, self.device_id)
            if m is not None and roofline is not None and not in_bounds(m.median_s, roofline()):
                self.cache.discard(run_key, self.device_id)
                self.stats["out_of_bounds"] += 1
                log.warning("a cached kernel timing (%.3g s) is outside its roofline's bounds (%gx its work at peak "
                            "rates to %gx its estimate); measured again", m.median_s, BOUND_LOW, BOUND_HIGH)
                return None
            if m is not None:
                self._timing[run_key] = m
        return m

    def _time_missing(self, kernels: Sequence[Kernel], graph: Graph,
                      written: Sequence[tuple[str, ...]] | None = None) -> None:
        """Time, together and interleaved, every kernel of `graph` that has no timing yet.

        A kernel is known by what onnxruntime runs for it (`_run_key` of its optimised model): two
        kernels the runtime optimises to the same work (a Conv with and without a BatchNormalization it
        folds) share one timing, so a rewrite the runtime does itself costs exactly nothing.
        `written`: each kernel's `_written`, where the caller has them."""
        if written is None:
            written = written_values(kernels, graph, by_name=True)
        todo: dict[str, tuple[KernelModel, Kernel]] = {}
        self._models.clear()
        for k, w in zip(kernels, written):
            if k.op == ELIMINATED or k.op in VIEW_OPS or not k.nodes:
                continue
            memo_key = (k.op, k.nodes, w)
            if memo_key in self._measured_costs:
                continue
            km = self._models[memo_key] = kernel_model(k, graph)  # kernel_cost takes it from here
            if km.key in todo:
                continue
            if self._timing_of(km.key, lambda k=k: self.roofline_bounds(k, graph)) is not None:
                self.stats["cache_hits"] += 1
                continue
            todo[km.key] = (km, k)
        if not todo:
            return
        self.overhead()
        items = list(todo.values())
        for start in range(0, len(items), self.max_kernels_per_batch):
            if self.deadline is not None and time.monotonic() > self.deadline:
                return  # the rest falls back to the scaled roofline
            t0 = time.perf_counter()
            prepared: dict[str, Prepared] = {}
            bounds: dict[str, tuple[float, float]] = {}
            for km, k in items[start:start + self.max_kernels_per_batch]:
                p = self._prepare(km.graph)
                if p is None:
                    continue
                self._alias[km.key] = p.run_key
                self.cache.put_alias(km.key, self.device_id, p.run_key)
                bound = self.roofline_bounds(k, graph)
                if self._timing_of(km.key, lambda b=bound: b) is not None:  # the runtime runs it alike: timed
                    self.stats["cache_hits"] += 1
                elif p.run_key not in prepared:
                    prepared[p.run_key] = p
                    bounds[p.run_key] = bound
                    self._roofline_s += super().kernel_cost(k, graph)
            timed = self._time_batch(prepared)
            self.stats["measure_s"] += time.perf_counter() - t0
            for run_key, m in timed.items():
                if in_bounds(m.median_s, bounds[run_key]):
                    stored = self.cache.put(run_key, self.device_id, prepared[run_key].config, m)
                    m = stored if in_bounds(stored.median_s, bounds[run_key]) else m
                else:  # measured here, so real, but not what the bounds let a cache hold: used now, not stored
                    self.stats["out_of_bounds_measured"] += 1
                self._timing[run_key] = m
                self.stats["measured"] += 1
                self._timed_s += m.median_s
            self._keep_anchors(prepared, timed)

    def _fallback_scale(self) -> float:
        return self._timed_s / self._roofline_s if self._roofline_s > 0 and self._timed_s > 0 else 1.0

    def _keep_anchors(self, prepared: dict[str, Prepared], timed: dict[str, Measurement]) -> None:
        """Keep up to ANCHORS kernels of a first batch (sessions open) to re-time beside every later batch."""
        if len(self._anchors) >= ANCHORS:
            return
        steady = sorted((m.median_s, key) for key, m in timed.items() if 2e-5 <= m.median_s <= 2e-3 and m.cv < 0.2)
        for _, key in steady[len(steady) // 2:][: ANCHORS - len(self._anchors)]:
            self._anchors[key] = prepared[key]

    def _time_batch(self, prepared: dict[str, Prepared], repeats: int | None = None,
                    anchors: bool = True, net: bool = True) -> dict[str, Measurement]:
        """run key -> Measurement for each prepared kernel: warmed up, then `repeats` rounds that take one
        sample of every kernel in turn.

        Net of the run's fixed cost (`net`): a trivial model is timed in the same rounds, and its time
        less one dispatch is taken off every kernel's, so that a batch timed while the machine was busy
        (a larger fixed cost) does not shift the kernels' costs.

        Drift: the kernels kept as anchors (timed in an earlier batch) are timed in every round too, and
        the batch's timings are divided by the median ratio of the anchors' times now to their stored
        times, so that a batch timed while the machine was busier compares with one timed before.

        On the CPU, onnxruntime runs convolutions in its blocked NCHWc layout and converts at the
        boundaries of the layout (ReorderInput, ReorderOutput). A convolution alone pays both
        conversions, which in the whole graph only its first and last convolutions pay: each conversion
        the kernel's model holds is timed on its own (`_reorder_s`) and taken off the kernel's time."""
        if not prepared:
            return {}
        runs = {k: p.run for k, p in prepared.items()}
        extra = {f"anchor:{k}": p.run for k, p in self._anchors.items() if k not in prepared} if anchors else {}
        runs.update(extra)
        if net:
            if self._trivial is None:
                self._trivial = self._prepare(trivial_chain(1), key="trivial")
            runs["probe:trivial"] = self._trivial.run
        clock = calling_thread_clock(self.providers[0] == "CPUExecutionProvider", self.threads)
        inner: dict[str, int] = {}
        for key, run in runs.items():
            for _ in range(self.warmup):
                run()
            t0 = clock()
            run()
            one = clock() - t0
            inner[key] = max(1, min(10_000, math.ceil(self.min_sample_s / max(one, 1e-7))))
        samples: dict[str, list[float]] = {k: [] for k in runs}
        keys = list(runs)
        for r in range(repeats or self.repeats):
            order = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate who goes first
            for key in order:
                run, n = runs[key], inner[key]
                t0 = clock()
                for _ in range(n):
                    run()
                samples[key].append((clock() - t0) / n)
        fixed = 0.0
        if net:
            fixed = max(statistics.median(samples["probe:trivial"]) - self.overhead().dispatch_s, 0.0)

        def net_of(key: str, reorders: list[tuple[int, ...]]) -> float:
            return statistics.median(samples[key]) - fixed - sum(self._reorder_s(shape) for shape in reorders)

        ratios = [net_of(f"anchor:{k}", a.reorders) / self._timing[k].median_s
                  for k, a in self._anchors.items() if f"anchor:{k}" in samples and k in self._timing]
        drift = statistics.median(ratios) if ratios else 1.0
        drift = drift if 0.5 <= drift <= 2.0 else 1.0  # beyond that, the anchors themselves are unreliable
        self._drift = round(drift, 4)
        floor = max(self.overhead().dispatch_s, 1e-9) if net else 1e-9
        out = {}
        for key in prepared:
            m = summarize(samples[key])
            off = fixed + sum(self._reorder_s(shape) for shape in prepared[key].reorders)
            t = max((m.median_s - off) / drift, floor)
            m = Measurement(t, m.repeats, m.cv, max(min((m.min_s - off) / drift, t), 1e-9),
                            max((m.max_s - off) / drift, t))
            out[key] = m
        return out

    def _reorder_s(self, shape: tuple[int, ...]) -> float:
        """Seconds of one NCHWc layout conversion of a tensor of `shape`: half of a ReorderInput and
        ReorderOutput pair timed alone (optimisations off, so the pair is kept), less the run overhead."""
        c = -(-shape[1] // 4) * 4  # the blocked layout's channels are a multiple of 4
        probe = reorder_probe((shape[0], c, *shape[2:]))
        m = self._timing.get(probe.key) or self._cached_probe(probe)
        if m is None:
            p = self._prepare(probe.graph, level="disable", key=probe.key)
            if p is None:
                return 0.0
            m = self._time_batch({probe.key: p}, anchors=False)[probe.key]
            m = self.cache.put(probe.key, self.device_id, probe.config, m)
        self._timing[probe.key] = m
        return max(m.median_s - 2 * self.overhead().dispatch_s, 0.0) / 2  # net of the run's fixed cost already

    def _prepare(self, graph: Graph, level: str = "all", key: str | None = None) -> Prepared | None:
        """A session for `graph` (None where onnxruntime cannot run it alone): a callable that runs it,
        the key of what onnxruntime runs for it (its optimised model, canonical), and the shapes of the
        NCHWc layout conversions onnxruntime put at its boundary (CPU convolutions)."""
        import onnxruntime as ort

        from xrl.cost.ort import random_inputs, session_runner
        from xrl.frontends.onnx_io import to_onnx
        from xrl.quiet import quiet_onnxruntime

        quiet_onnxruntime()
        so = ort.SessionOptions()
        so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if level == "all"
                                       else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1
        if self.threads:
            so.intra_op_num_threads = self.threads
        so.log_severity_level = 3
        cpu = self.providers[0] == "CPUExecutionProvider"
        try:
            with tempfile.TemporaryDirectory(prefix="xrl-kernel-") as tmp:
                so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
                sess = ort.InferenceSession(to_onnx(graph).SerializeToString(), so, providers=list(self.providers))
                optimized = onnx.load(so.optimized_model_filepath)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors
            log.warning("onnxruntime cannot run kernel %s alone (%s); it is costed by the scaled roofline",
                        graph.name, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            return None
        config = key or run_config(optimized, graph)
        run_key = key or hashlib.sha256(config.encode()).hexdigest()[:32]
        shapes = _reorder_shapes(optimized, graph) if cpu and level == "all" else []
        return Prepared(session_runner(sess, random_inputs(graph, self.seed), cuda=not cpu), run_key, config, shapes)


def in_bounds(seconds: float, bounds: tuple[float, float]) -> bool:
    """Whether a kernel timing lies within its `roofline_bounds` (an upper bound of 0: no estimate, any)."""
    low, high = bounds
    return low <= seconds and (high <= 0 or seconds <= high)


def _is_default(name: str, value: Any, weighted: bool) -> bool:
    """Attributes whose value is the operator's default (convolution and pooling geometry), or derived
    from the weights (a convolution's kernel_shape; a pool's is its own)."""
    if name == "auto_pad":
        return value == "NOTSET"
    if name in ("dilations", "strides"):
        return isinstance(value, list) and all(v == 1 for v in value)
    if name == "pads":
        return isinstance(value, list) and all(v == 0 for v in value)
    return name == "kernel_shape" and weighted


@dataclass(frozen=True)
class Prepared:
    """A kernel's open session, ready to time."""

    run: Any
    run_key: str
    config: str
    reorders: list[tuple[int, ...]]


def run_config(optimized: onnx.ModelProto, graph: Graph) -> str:
    """What onnxruntime runs for a kernel, canonical: the optimised model's nodes with their attributes,
    its inputs' and weights' types (values only for small integer weights), wired by position."""
    from onnx import helper, numpy_helper

    canon = {v: f"x{i}" for i, v in enumerate(graph.inputs)}
    weights = {}
    for t in optimized.graph.initializer:
        small = int(np.prod(t.dims)) <= _SMALL_CONST and t.data_type in (6, 7)  # int32, int64
        weights[t.name] = [t.data_type, list(t.dims), numpy_helper.to_array(t).reshape(-1).tolist() if small else None]
    nodes = []
    for i, n in enumerate(optimized.graph.node):
        ins = [canon.get(v) or (["w", *weights[v]] if v in weights else v if not v else "?") for v in n.input]
        attrs = {}
        for a in n.attribute:
            value = helper.get_attribute_value(a)
            if isinstance(value, onnx.TensorProto):
                value = [value.data_type, list(value.dims), numpy_helper.to_array(value).reshape(-1)[:16].tolist()]
            elif isinstance(value, bytes):
                value = value.decode(errors="replace")
            elif isinstance(value, list):
                value = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in value]
            if _is_default(a.name, value, any(v in weights for v in n.input[1:2])):
                continue  # an attribute spelled out at its default is the same kernel as one left out
            attrs[a.name] = value if isinstance(value, (int, float, str, list)) else str(value)
        for j, v in enumerate(n.output):
            canon[v] = f"n{i}.{j}"
        nodes.append([n.domain, n.op_type, ins, sorted(attrs.items())])
    return json.dumps({"inputs": [str(graph.type_of(v)) for v in graph.inputs], "nodes": nodes,
                       "outputs": [canon.get(o.name, "?") for o in optimized.graph.output]},
                      sort_keys=True, separators=(",", ":"), default=str)


def _reorder_shapes(optimized: onnx.ModelProto, graph: Graph) -> list[tuple[int, ...]]:
    """The shapes of the layout conversions at the boundary of a kernel's optimised model: a
    ReorderInput of one of its inputs, a ReorderOutput into one of its outputs."""
    shapes = []
    for n in optimized.graph.node:
        if n.op_type == "ReorderInput" and n.input[0] in graph.inputs:
            shapes.append(graph.type_of(n.input[0]).shape)
        elif n.op_type == "ReorderOutput" and n.output[0] in graph.outputs:
            shapes.append(graph.type_of(n.output[0]).shape)
    return [s for s in shapes if len(s) == 4]


def reorder_probe(shape: tuple[int, ...]) -> KernelModel:
    """A ReorderInput and a ReorderOutput of a tensor of `shape` (channels a multiple of 4)."""
    from xrl.ir import Node

    t = TensorType(tuple(shape), "float32")
    nodes = [Node("to_blocked", "ReorderInput", ("x",), ("b",), {}, NCHWC),
             Node("from_blocked", "ReorderOutput", ("b",), ("y",), {"channels": shape[1]}, NCHWC)]
    graph = Graph(nodes, ["x"], ["y"], {"x": t, "b": t, "y": t}, name="reorder", domain_opsets={NCHWC: 1})
    config = json.dumps({"probe": "reorder", "shape": list(shape)})
    return KernelModel(graph, hashlib.sha256(config.encode()).hexdigest()[:32], config)


def _written(k: Kernel, graph: Graph) -> tuple[str, ...]:
    """The values `k` writes for readers outside it (its cost depends on them as well as its nodes);
    members by name: `graph` is the plan whose nodes the kernel holds. For all of a plan's kernels at
    once, `written_values(kernels, plan, by_name=True)`."""
    return written_values([k], graph, by_name=True)[0]


def kernel_model_of(graph: Graph) -> KernelModel:
    """A whole small graph as one KernelModel (the overhead probes)."""
    config = json.dumps({"probe": graph.name, "hash": graph.canonical_hash}, sort_keys=True)
    return KernelModel(graph, hashlib.sha256(config.encode()).hexdigest()[:32], config)


def _providers(provider: str) -> tuple[str, ...]:
    import onnxruntime as ort

    if provider == "cpu":
        return ("CPUExecutionProvider",)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ConfigError("the measured cost of target ort-cuda needs onnxruntime with the CUDA execution provider "
                          "(onnxruntime-gpu); estimate instead with --cost roofline")
    return ("CUDAExecutionProvider", "CPUExecutionProvider")


def _device_id(provider: str, threads: int | None) -> str:
    """What a kernel timing is valid for: the runtime, its provider and threads, and the processor."""
    import onnxruntime as ort

    if provider == "cuda":
        from xrl.cost.devices import gpu_model_names

        where = "|".join(gpu_model_names()) or "unknown gpu"
    else:
        where = cpu_model()
    return f"ort={ort.__version__}|{provider}|threads={threads or os.cpu_count()}|{where}|kernel-v2"

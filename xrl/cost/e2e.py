"""Whole-graph measured cost models: `e2e` (onnxruntime or PyTorch) and `cuda` (the native GPU harness).

`e2e` runs the whole graph and reports the median of `repeats` timed runs after `warmup`, with the
spread (`measure` returns repeats, median, CV, min, max). Two engines (engine="auto" picks onnxruntime
where it runs on the device, else PyTorch):
- engine="ort": onnxruntime (CPU provider, or CUDA where onnxruntime has it), through `OrtCostModel`;
- engine="torch": the PyTorch executor (`xrl.cost.torch_exec`); on a GPU the graph is captured once
  into a CUDA graph and replayed, so Python launch gaps are not timed. A graph the executor cannot
  run (an opaque op) is timed with onnxruntime instead, with a warning.
Whole-graph models have no per-op cost (`per_op = False`): `delta_cost` re-measures the new graph.
Measurements are cached per process by the graph's canonical hash.

`cuda` is the GPU-only backend: the measured models with the native harness (cuda/) as the timer:
events on the stream, CUDA-graph replay, an L2 flush between repetitions. granularity="graph" is
the e2e torch engine, granularity="op" the per-op model. Without a GPU it refuses to start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from xrl.cost.base import CostModel, Measurement, WholeGraphCostModel
from xrl.cost.timing import check_counts
from xrl.cost.torch_exec import (
    TorchExecutor,
    UnsupportedOpError,
    resolve_device,
    torch_dtype,
    torch_threads,
)
from xrl.cost.torch_timing import check_timer, time_run
from xrl.errors import ConfigError
from xrl.ir import Graph, Node

log = logging.getLogger(__name__)

ENGINES = ("auto", "ort", "torch")


class E2ECostModel(WholeGraphCostModel):
    """Median wall (CPU) or GPU time of one run of the whole graph, in seconds."""

    name = "e2e"

    def __init__(self, *, device: str | None = None, engine: str = "auto", warmup: int = 3, repeats: int = 10,
                 threads: int | None = 1, seed: int = 0, dtype: str = "float32", timer: str = "auto",
                 cuda_graph: bool = True, flush_l2: bool = False, cache: bool = True, min_run_s: float = 0.0) -> None:
        """device: "cpu", "cuda", "auto"/None (cuda when present) or a GPU profile name (meaning cuda).
        engine: "ort", "torch", or "auto": onnxruntime where it can run on the device (always on the CPU;
            on a GPU with onnxruntime-gpu), else torch.
        threads: CPU intra-op threads; None: the engine's default (every core). One by default, as for the
            `op` model: timings that other processes on the machine cannot inflate.
        dtype / timer / cuda_graph / flush_l2: torch engine only (see `xrl.cost.torch_timing.time_run`).
        min_run_s: one timed sample calls the graph as often as it takes to last about this long (CPU): a
            0.1 ms graph timed one call a sample is mostly jitter.
        """
        super().__init__()
        if engine not in ENGINES:
            raise ConfigError(f"unknown e2e engine {engine!r}; choose one of: {', '.join(ENGINES)}")
        check_counts(warmup, repeats, "the 'e2e' cost model", threads=threads)
        check_timer(timer)
        self.device = resolve_device(device, self.name)
        self.engine = _pick_engine(engine, self.device)
        self.warmup, self.repeats, self.threads, self.seed = warmup, repeats, threads, seed
        self.dtype = dtype
        self._torch_dtype = torch_dtype(dtype)
        self.timer, self.cuda_graph, self.flush_l2, self.cache = timer, cuda_graph, flush_l2, cache
        self.min_run_s = min_run_s
        self._ort: CostModel | None = None
        if self.engine == "ort":
            self._ort_model()  # fail now, not at the first measurement, if onnxruntime lacks the device

    def _ort_model(self) -> CostModel:
        if self._ort is None:
            from xrl.cost.ort import OrtCostModel

            self._ort = OrtCostModel(device=self.device, warmup=self.warmup, repeats=self.repeats,
                                     threads=self.threads, seed=self.seed, cache=False, min_run_s=self.min_run_s)
        return self._ort

    # ----- the CostModel interface --------------------------------------------------------------
    def _op_cost(self, node: Node, graph: Graph) -> float:
        raise ConfigError(f"the {self.name!r} cost model times whole graphs and has no per-op cost; use the 'op' "
                          f"cost model for per-op timings")

    def timing_device(self) -> str | None:
        return self.device

    def describe(self) -> str:
        threads = f", threads={self.threads}" if self.threads else ", threads=all" if self.device == "cpu" else ""
        return f"{self.name}({self.engine}, {self.device}, {self.warmup}+{self.repeats} runs{threads})"

    # ----- timing -------------------------------------------------------------------------------
    def _time(self, graph: Graph) -> Measurement:
        if self.engine == "ort":
            return self._ort_model().measure(graph)
        try:
            executor = TorchExecutor(graph, self.device, self._torch_dtype)
        except UnsupportedOpError as e:
            log.warning("e2e: timing %s with onnxruntime instead of torch: %s", graph.name, e)
            return self._ort_model().measure(graph)
        with torch_threads(self.threads if self.device == "cpu" else None):
            run = executor.bind(seed=self.seed, cuda_graph=self.cuda_graph)
            return time_run(run, warmup=self.warmup, repeats=self.repeats, timer=self.timer, flush_l2=self.flush_l2,
                            min_run_s=self.min_run_s)


def _pick_engine(engine: str, device: str) -> str:
    if engine != "auto":
        return engine
    if device == "cpu":
        return "ort"
    import onnxruntime

    return "ort" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "torch"


GRANULARITIES = ("graph", "op")


class CudaCostModel(CostModel):
    """GPU time from the native harness: the whole graph (granularity="graph") or per op ("op")."""

    name = "cuda"

    def __init__(self, *, device: str | None = None, granularity: str = "graph", warmup: int = 3,
                 repeats: int = 10, seed: int = 0, dtype: str = "float32", flush_l2: bool = True,
                 cache_path: str | Path | None = None) -> None:
        super().__init__()
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("no CUDA GPU found; use --cost op or e2e on the CPU")
        if device not in (None, "auto", "cuda") and resolve_device(device, self.name) != "cuda":
            raise ConfigError(f"the 'cuda' cost model runs on the GPU; device {device!r} does not name one "
                              f"(use --cost op or e2e for the CPU)")
        if granularity not in GRANULARITIES:
            raise ConfigError(f"unknown granularity {granularity!r}; choose one of: {', '.join(GRANULARITIES)}")
        from xrl.cost import cuda_harness

        cuda_harness.load(required=True)  # the harness is the point of this backend: no silent fallback
        self.granularity = granularity
        self.inner: CostModel
        if granularity == "graph":
            self.inner = E2ECostModel(device="cuda", engine="torch", warmup=warmup, repeats=repeats, seed=seed,
                                      dtype=dtype, timer="harness", cuda_graph=True, flush_l2=flush_l2)
        else:
            from xrl.cost.op_measured import OpMeasuredCostModel

            self.inner = OpMeasuredCostModel(device="cuda", cache_path=cache_path, warmup=warmup, repeats=repeats,
                                             seed=seed, dtype=dtype, timer="harness", cuda_graph=True,
                                             flush_l2=flush_l2)
        self.per_op = self.inner.per_op
        self.measured = self.inner.measured

    def op_cost(self, node: Node, graph: Graph) -> float:
        return self.inner.op_cost(node, graph)

    def _op_cost(self, node: Node, graph: Graph) -> float:
        return self.inner.op_cost(node, graph)

    def op_costs(self, graph: Graph) -> dict[str, float]:
        return self.inner.op_costs(graph)

    def cost(self, graph: Graph) -> float:
        return self.inner.cost(graph)

    def measure(self, graph: Graph) -> Measurement:
        return self.inner.measure(graph)

    def remeasure(self, graph: Graph) -> Measurement:
        return self.inner.remeasure(graph)

    def delta_cost(self, old: Graph, old_cost: float, new: Graph, removed: Iterable[Node],
                   added: Iterable[Node]) -> float:
        return self.inner.delta_cost(old, old_cost, new, removed, added)

    def timing_device(self) -> str | None:
        return self.inner.timing_device()

    def describe(self) -> str:
        return f"{self.name}({self.granularity}, harness, {self.inner.describe()})"

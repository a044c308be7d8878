"""End-to-end onnxruntime timing of a whole graph: what a deployment of the graph would see.

`measure(graph)` exports the graph to ONNX, opens an InferenceSession (with onnxruntime's own graph
optimisations at `graph_optimization_level`, "all" by default, as a deployment runs it), feeds
seeded random inputs, runs `warmup` untimed and `repeats` timed inferences, and reports their
median, coefficient of variation, min and max. Building the session and the inputs is not timed.

A whole-graph model has no per-op cost (`per_op = False`; `delta_cost` re-measures). `op_costs`
still answers, for tools that show where time goes: it splits the measured median over the nodes in
proportion to their analytic roofline costs on the closest device profile ("cpu" or "h100"). That
split is an estimate, not a measurement; `op_cost` of one node raises.

Measurements are cached by the graph's canonical hash (`cache=True`): search revisits graphs, and a
second timing of an identical graph only adds noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xrl.cost.analytic import AnalyticCostModel
from xrl.cost.base import Measurement, WholeGraphCostModel
from xrl.cost.devices import DEVICE_PROFILES
from xrl.cost.timing import calling_thread_clock, check_counts, time_callable
from xrl.errors import ConfigError, XrlError
from xrl.ir import Graph, Node
from xrl.quiet import quiet_onnxruntime

if TYPE_CHECKING:
    import onnxruntime

class OrtSessionError(XrlError):
    """onnxruntime cannot load or run an exported graph (e.g. an opaque op it does not implement)."""


OPT_LEVELS = ("disable", "basic", "extended", "all")
ORT_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class OrtOptions:
    """How `OrtCostModel` times a graph."""

    device: str = "auto"  # "cpu", "cuda" (needs CUDAExecutionProvider), "auto": cuda where onnxruntime has it
    warmup: int = 3
    repeats: int = 10
    threads: int | None = None  # intra-op threads; None: onnxruntime's default (one per core)
    seed: int = 0  # random inputs
    graph_optimization_level: str = "all"
    opset: int | None = None  # export opset; None: the exporter's default
    cache: bool = True
    min_run_s: float = 0.0  # a timed sample calls the graph as often as it takes to last this long


class OrtCostModel(WholeGraphCostModel):
    """Median wall time of `onnxruntime.InferenceSession.run` on the exported graph, in seconds."""

    name = "ort"

    def __init__(self, *, device: str | None = None, warmup: int = 3, repeats: int = 10, threads: int | None = None,
                 seed: int = 0, graph_optimization_level: str = "all", opset: int | None = None,
                 cache: bool = True, min_run_s: float = 0.0) -> None:
        super().__init__()
        check_counts(warmup, repeats, "the 'ort' cost model", threads=threads)
        if graph_optimization_level not in OPT_LEVELS:
            raise ConfigError(f"unknown graph_optimization_level {graph_optimization_level!r}; "
                              f"choose one of: {', '.join(OPT_LEVELS)}")
        self.options = OrtOptions(_ort_device(device), warmup, repeats, threads, seed, graph_optimization_level, opset,
                                  cache, min_run_s)
        self.cache = cache
        self.providers = _providers(self.options.device)
        self._split_model = AnalyticCostModel(device="cpu" if self.providers[0] == "CPUExecutionProvider" else "h100")

    # ----- the CostModel interface --------------------------------------------------------------
    def _op_cost(self, node: Node, graph: Graph) -> float:
        raise ConfigError("the 'ort' cost model times whole graphs and has no per-op cost; use op_costs(graph) "
                          "for a split of the measured time, or a per-op backend such as 'analytic'")

    def op_costs(self, graph: Graph) -> dict[str, float]:
        """node name -> seconds: the measured median split in proportion to analytic op costs (an estimate)."""
        shares = self._split_model.op_costs(graph)
        total = sum(shares.values())
        median = self.cost(graph)
        if total <= 0:
            return {name: median / len(shares) for name in shares} if shares else {}
        return {name: median * c / total for name, c in shares.items()}

    def timing_device(self) -> str | None:
        return self.options.device

    def describe(self) -> str:
        o = self.options
        where = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        threads = f", threads={o.threads}" if o.threads else ""
        return f"{self.name}({where}, opt={o.graph_optimization_level}, {o.warmup}+{o.repeats} runs{threads})"

    # ----- timing ------------------------------------------------------------------------------
    def session(self, graph: Graph) -> onnxruntime.InferenceSession:
        """An InferenceSession for `graph` with this model's options (untimed setup)."""
        import onnxruntime as ort

        from xrl.frontends.onnx_io import brief_error, to_onnx

        quiet_onnxruntime()
        so = ort.SessionOptions()
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.options.graph_optimization_level]
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1
        if self.options.threads:
            so.intra_op_num_threads = self.options.threads
        so.log_severity_level = 3  # errors only: no warnings per session in a search loop
        try:
            weights: dict = {}
            head = to_onnx(graph, opset=self.options.opset, external=weights)
            return _open_session(head, so, list(self.providers), weights)
        except Exception as e:  # onnxruntime raises its own untyped Fail/InvalidGraph/NotImplemented
            raise OrtSessionError(f"onnxruntime cannot load graph {graph.name!r} ({brief_error(e)}); "
                                  f"cost it with the 'analytic' model instead") from e

    def _time(self, graph: Graph) -> Measurement:
        sess = self.session(graph)
        feeds = random_inputs(graph, self.options.seed)
        cuda = self.providers[0] == "CUDAExecutionProvider"
        run = session_runner(sess, feeds, cuda=cuda)
        # one intra-op thread computes on the caller: its CPU time is what the graph costs, whatever else runs
        return time_callable(run, warmup=self.options.warmup, repeats=self.options.repeats,
                             clock=calling_thread_clock(not cuda, self.options.threads),
                             min_run_s=self.options.min_run_s)


def _open_session(model: Any, so: Any, providers: list[str], external: Any = None) -> onnxruntime.InferenceSession:
    """A session of `model` (an onnx.ModelProto, consumed; a head whose weights are the graph's own arrays in
    `external`) that costs the session's own copy of the weights and no other: onnxruntime gets the head
    and copies each array once (`xrl.frontends.verify.open_session`). The guard times a fresh session per
    graph per round: serialising each candidate whole held its weights three more times while it opened."""
    from xrl.frontends.verify import open_session

    return open_session(model, so, providers, external)


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Seeded feeds for `graph.inputs`: standard normal floats; zeros for ints and bools, which are
    mostly indices and masks, where zero is always in range."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        t = graph.type_of(v)
        if t.dtype == "bfloat16":  # numpy has no bfloat16
            raise ConfigError(f"the 'ort' cost model cannot feed bfloat16 input {v!r}; use the 'analytic' model")
        if np.issubdtype(np.dtype(t.dtype), np.floating):
            feeds[v] = rng.standard_normal(t.shape, dtype=np.float32).astype(t.dtype, copy=False)
        else:
            feeds[v] = np.zeros(t.shape, dtype=t.dtype)
    return feeds


def _ort_device(device: str | None) -> str:
    """ort's device from the shared `device` option: cpu, cuda, auto, or a profile name (GPU profiles mean cuda)."""
    if device is None or device in ORT_DEVICES:
        return device or "auto"
    if device in DEVICE_PROFILES:
        return "cpu" if device == "cpu" else "cuda"
    raise ConfigError(f"unknown device {device!r} for the 'ort' cost model; choose one of: {', '.join(ORT_DEVICES)} "
                      f"(or a GPU profile name: {', '.join(p for p in DEVICE_PROFILES if p != 'cpu')}, meaning cuda)")


def _providers(device: str) -> tuple[str, ...]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    if device == "cuda" and not has_cuda:
        raise ConfigError("the 'ort' cost model was asked for a GPU but this onnxruntime has no "
                          "CUDAExecutionProvider; install onnxruntime-gpu, or use device 'cpu' or 'auto' (--device)")
    if device == "cpu" or not has_cuda:
        return ("CPUExecutionProvider",)
    return ("CUDAExecutionProvider", "CPUExecutionProvider")


def session_runner(sess: onnxruntime.InferenceSession, feeds: dict[str, Any], *, cuda: bool):
    """A no-argument callable that runs one inference to completion."""
    if not cuda:
        return lambda: sess.run(None, feeds)
    # On a GPU, bind inputs and outputs on the device so a timed run is the graph, not host copies.
    import onnxruntime as ort

    binding = sess.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda")

    def run() -> None:
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()

    return run

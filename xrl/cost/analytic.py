"""A roofline cost model: each operator is one kernel, bound by compute or by memory traffic.

For a node with F FLOPs and B bytes read and written (`xrl.ir.ops.node_flops` / `node_bytes`) on a
device with peak P FLOP/s, bandwidth W bytes/s and per-kernel overhead L seconds:

    time = L + max(F / (P * e_c(F, kind)),  B / (W * e_m))

    e_c(F, "compute") = c * min(1, F / S) ** a      conv, matmul, gemm
    e_c(F, other)     = c                            elementwise, reductions, data movement

c = compute_efficiency, e_m = memory_efficiency, S = saturation_flops, a = saturation_exponent
(profiles in `xrl.cost.devices`). Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout,
Constant) run no kernel and cost 0. Opaque ops cost L + B / (W * e_m): a launch and their traffic.
An op only one runtime runs (onnxruntime's contrib ops, `xrl.ir.ops.op_runtime`) costs UNSUPPORTED_OP_S
unless the model is told that runtime runs it (`runtimes`): a device that runs every op as its own
kernel has no such kernel, so no search may keep one. The price is finite so that rewards stay numbers.

Why these terms: L per kernel makes fusing and merging pay (Conv+Relu -> one Conv drops the Relu's
launch and its round trip through memory; two GEMMs on one input -> one GEMM reads it once). The
small-kernel factor models a GEMM whose output tiles do not fill every SM: below S the kernel runs
one partial wave. If that wave took a fixed time (a = 1) small kernels would all cost the same;
if it scaled with work (a = 0) there would be no penalty. Tiny GEMMs lose some of both (fewer tiles
and shorter reductions), so a = 0.5: below S compute time is sqrt(F * S) / (P * c), and merging two
small GEMMs into one of twice the work saves a factor 1/sqrt(2) of their compute time, the effect
behind most of TASO's and X-RLflow's GPU gains. The profiles set S = P * c * 20 us, so that time is
sqrt(F * 20 us / (P * c)): a device with more FLOP/s is faster on every kernel size. The factor
applies to compute ops only: an elementwise op's arithmetic is never its bottleneck, and penalising
it would make it look compute-bound.
"""

from __future__ import annotations

from xrl.cost.base import CostModel
from xrl.cost.devices import DeviceProfile, get_device
from xrl.ir import Graph, Node
from xrl.ir.ops import node_bytes, node_flops, op_kind, op_runtime

# The cost of an op the device cannot run: more than any whole graph of the suites takes, so that every
# search prefers the graph without it, yet finite (an RL reward of -inf would poison training).
UNSUPPORTED_OP_S = 1.0


class AnalyticCostModel(CostModel):
    """Roofline estimate per op on a named device profile; deterministic, no measurement."""

    name = "analytic"
    per_op = True

    def __init__(self, *, device: str | DeviceProfile | None = None) -> None:
        super().__init__()
        self.device = get_device(device if device is not None else "h100")
        self.runtimes: frozenset[str] = frozenset()  # runtimes whose own ops this device runs (targets set it)

    def compute_efficiency(self, flops: float, kind: str) -> float:
        """The fraction of peak FLOP/s a kernel of `flops` work and this op kind reaches."""
        d = self.device
        if kind != "compute" or d.saturation_flops <= 0:
            return d.compute_efficiency
        fill = min(1.0, flops / d.saturation_flops)
        return d.compute_efficiency * fill**d.saturation_exponent

    def _op_cost(self, node: Node, graph: Graph) -> float:
        kind = op_kind(node.op) if node.domain in ("", "ai.onnx") else "opaque"
        if kind == "view":
            return 0.0
        runtime = op_runtime(node.op) if kind != "opaque" else None
        if runtime is not None and runtime not in self.runtimes:
            return UNSUPPORTED_OP_S
        d = self.device
        memory_s = node_bytes(node, graph) / (d.bandwidth * d.memory_efficiency)
        if kind == "opaque":
            return d.launch_overhead_s + memory_s
        flops = node_flops(node, graph)
        compute_s = flops / (d.peak_flops * self.compute_efficiency(flops, kind)) if flops else 0.0
        return d.launch_overhead_s + max(compute_s, memory_s)

    def describe(self) -> str:
        return f"{self.name}({self.device.name})"

"""Targets: what will run the written model, and so what a graph's cost means.

A target is the one object every layer agrees on (docs/architecture.md, "The target"): the runtime and its execution
provider (whose own fusions are applied before costing: `xrl.cost.runtime_fusion`), the device
profile of the roofline estimate, where `--measure` times the result, and the clean-up passes of
well-kept libraries the deployment pipeline runs before xrl's own search.

    ort-cpu    onnxruntime, CPU execution provider, all graph optimisations on (default without a GPU)
    ort-cuda   onnxruntime, CUDA execution provider (default on a machine with an NVIDIA GPU)
    paper      the research setting of TASO, Tensat and X-RLflow: every op one GPU kernel on the
               H100 profile, the unfused graph as baseline. Kept to compare with those papers; it
               is an estimate of no deployment runtime, and its speed-ups are not what a user gets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xrl.cost.analytic import AnalyticCostModel
from xrl.cost.base import CostModel
from xrl.cost.devices import this_machine_profile
from xrl.cost.runtime_fusion import ELIMINATED, VIEW_OPS, Kernel, runtime_kernels
from xrl.errors import ConfigError
from xrl.ir import Graph, Node
from xrl.ir.ops import OPS, node_flops, op_kind, op_runtime


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtime: str  # "onnxruntime": its fusions apply before costing; "kernels": every op is a kernel
    provider: str  # "cpu" | "cuda": the execution provider, and where --measure times
    profile: str  # the analytic device profile (xrl.cost.devices), "auto": this machine's GPU's
    prepasses: tuple[str, ...] = ()  # xrl.frontends.prepass names, run before the search
    research: bool = False  # the papers' setting: labelled as such wherever it is reported

    def runs(self, op: str) -> bool:
        """Whether this target's runtime runs IR op `op`: every standard op, and onnxruntime's contrib ops
        (SimplifiedLayerNormalization, ...) under onnxruntime only."""
        needs = op_runtime(op)
        return needs is None or needs == self.runtime

    @property
    def device_profile(self) -> str:
        """The profile name: this machine's GPU's for "auto"; for the CPU, this machine's calibration
        (`xrl calibrate`, profile cpu-local) where there is one, else the generic cpu profile."""
        if self.profile == "auto":
            return this_machine_profile()
        if self.profile == "cpu" and self.runtime == "onnxruntime":
            from xrl.cost.calibrate import calibrated_profile

            local = calibrated_profile()
            if local is not None:
                return local.name
        return self.profile


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("ort-cpu", "onnxruntime on the CPU (all graph optimisations on)", "onnxruntime", "cpu", "cpu",
               ("ort-transformers", "onnxslim", "ort-transformers")),
        Target("ort-cuda", "onnxruntime with the CUDA execution provider", "onnxruntime", "cuda", "auto",
               ("ort-transformers", "onnxslim", "ort-transformers")),
        Target("paper", "research setting of TASO/Tensat/X-RLflow: one H100 kernel per op, unfused baseline",
               "kernels", "cuda", "h100", (), research=True),
    )
}


def default_target() -> str:
    """ort-cuda on a machine with an NVIDIA GPU, else ort-cpu."""
    from xrl.cost.devices import gpu_model_names

    return "ort-cuda" if gpu_model_names() else "ort-cpu"


def get_target(name: str | None, device: str | None = None) -> Target:
    """A target by name; None or "auto" means this machine's default, or, when `device` names a device
    profile, onnxruntime on that kind of device (ort-cuda for a GPU profile, ort-cpu for cpu)."""
    if name in (None, "auto") and device not in (None, "auto"):
        name = "ort-cpu" if device == "cpu" else "ort-cuda"
    key = default_target() if name in (None, "auto") else name
    try:
        return TARGETS[key]
    except KeyError:
        raise ConfigError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None


# Contrib ops the runtime (or a pre-pass) writes, by the work their standard equivalent does.
_GEMM_LIKE = {"FusedMatMul": "MatMul", "FusedGemm": "Gemm", "FusedConv": "Conv", "NhwcConv": "Conv"}
_COMPUTE_CONTRIB = {*_GEMM_LIKE, "Attention", "MultiHeadAttention", "GroupQueryAttention", "DecoderMaskedSelfAttention"}


def contrib_flops(node: Node, graph: Graph) -> int:
    """FLOPs of an onnxruntime contrib op (com.microsoft), from its input and output types."""
    ins = [graph.type_of(v) if v else None for v in node.inputs]
    outs = [graph.type_of(v) for v in node.outputs]
    if node.op in _GEMM_LIKE:
        return int(OPS[_GEMM_LIKE[node.op]].flops(node, [t for t in ins if t is not None], outs))
    if node.op == "Attention" and len(ins) >= 2 and ins[0] is not None and ins[1] is not None:
        b, s, h = ins[0].shape if ins[0].rank == 3 else (1, *ins[0].shape)
        qkv = ins[1].shape[-1]  # packed Q, K, V projection width
        return 2 * b * s * h * qkv + 2 * 2 * b * s * s * (qkv // 3)
    if node.op in ("MultiHeadAttention", "GroupQueryAttention") and ins and ins[0] is not None and outs:
        q = ins[0]
        k = ins[1] if len(ins) > 1 and ins[1] is not None and ins[1].rank == q.rank else q
        b, s, h = q.shape[0], q.shape[1], outs[0].shape[-1]
        return 2 * 2 * b * s * k.shape[1] * h
    return sum(t.numel for t in outs) * 4  # elementwise and normalisations: a few FLOPs an element


def written_values(kernels: Sequence[Kernel], graph: Graph, *, by_name: bool = False) -> list[tuple[str, ...]]:
    """For each kernel, the values it writes for readers outside it, in the order of its nodes and their
    outputs: a graph output, or a value read by a node that is not one of the kernel's (told apart by
    object identity, or by name with `by_name`). Each node is looked up once in a map to its kernel,
    rather than scanned for in every kernel's members: this runs for every candidate a search costs."""
    owner: dict[object, int] = {}
    for i, k in enumerate(kernels):
        for n in k.nodes:
            owner[n.name if by_name else n] = i  # a Node hashes by identity
    if len(owner) != sum(len(k.nodes) for k in kernels):  # a node twice (never seen): the map would be wrong
        return [_written_by_scan(k, graph, by_name) for k in kernels]
    outputs = set(graph.outputs)
    consumers = graph.consumers
    out: list[tuple[str, ...]] = []
    for i, k in enumerate(kernels):
        written = []
        for n in k.nodes:
            for v in n.outputs:
                if v in outputs:
                    written.append(v)
                    continue
                for u in consumers.get(v, ()):
                    if owner.get(u.name if by_name else u) != i:
                        written.append(v)
                        break
        out.append(tuple(written))
    return out


def _written_by_scan(k: Kernel, graph: Graph, by_name: bool) -> tuple[str, ...]:
    members = {n.name if by_name else n for n in k.nodes}
    return tuple(v for n in k.nodes for v in n.outputs if v in graph.outputs
                 or any((u.name if by_name else u) not in members for u in graph.consumers.get(v, ())))


class TargetCostModel(CostModel):
    """The roofline estimate of the kernels a target's runtime runs for a graph (after its own fusions).

    Each kernel costs `L + max(F / (P e_c), B / (W e_m))` on the target's device profile, as in
    `xrl.cost.analytic`, where F is the work of its anchor op and B the bytes that cross the kernel's
    boundary (what it reads from outside and writes for outside): a fused kernel does not write its
    intermediate values. A graph's cost depends on which nodes fuse, so it is not a sum over nodes
    (`per_op` False); it is deterministic and cheap (one linear pass), so searches cost candidates
    directly rather than confirming them by timing (`measured` False). Costs are cached by hash.
    """

    name = "target"
    per_op = False
    measured = False
    CACHE_SIZE = 100_000

    def __init__(self, *, device: str | None = None, target: str | None = None) -> None:
        super().__init__()
        self.target = get_target(target, device)
        if self.target.runtime != "onnxruntime":
            raise ConfigError(f"target {self.target.name!r} costs every op as a kernel: use the analytic model")
        if device == "cuda":
            from xrl.cost.devices import gpu_model_names

            if not gpu_model_names():
                raise ConfigError("--device cuda: no NVIDIA GPU found on this machine; name a profile "
                                  "(h100, a100, v100, gtx1080, cpu) to estimate for another device")
        self.profile = device if device not in (None, "auto", "cuda") else self.target.device_profile
        self.analytic = AnalyticCostModel(device=self.profile)
        self.analytic.runtimes = frozenset({self.target.runtime})  # its contrib ops are kernels here
        self._costs: dict[str, float] = {}
        self._kernel_costs: dict[tuple, float] = {}

    def _op_cost(self, node: Node, graph: Graph) -> float:
        return self.analytic.op_cost(node, graph)

    def per_op_estimate(self) -> CostModel | None:
        return self if self.per_op else self.analytic

    def kernels(self, graph: Graph) -> list[Kernel]:
        return runtime_kernels(graph, self.target.provider)

    def kernel_cost(self, k: Kernel, graph: Graph) -> float:
        return self._roofline_kernel_cost(k, graph, written_values([k], graph)[0])

    def _roofline_kernel_cost(self, k: Kernel, graph: Graph, written: tuple[str, ...]) -> float:
        """`kernel_cost`, given what `k` writes for outside (`written_values`)."""
        if k.op == ELIMINATED or k.op in VIEW_OPS:
            return 0.0
        d = self.analytic.device
        anchor = k.anchor
        if not k.nodes:  # an activation the runtime runs on its own: read and write the anchor's output
            nbytes = 2 * graph.type_of(anchor.outputs[0]).nbytes
            return d.launch_overhead_s + nbytes / (d.bandwidth * d.memory_efficiency)
        # Nodes are immutable and shared by a graph and its rewrites, and their values keep their types:
        # a kernel over the same node objects writing the same values costs the same in every candidate.
        key = (k.op, k.nodes, written)
        cached = self._kernel_costs.get(key)
        if cached is not None:
            return cached
        inside = {v for n in k.nodes for v in n.outputs}
        read = {v for n in k.nodes for v in n.inputs if v and v not in inside}
        nbytes = sum(graph.type_of(v).nbytes for v in read.union(written))
        contrib = anchor.domain not in ("", "ai.onnx")
        flops = contrib_flops(anchor, graph) if contrib else node_flops(anchor, graph)
        compute = anchor.op in _COMPUTE_CONTRIB if contrib else op_kind(anchor.op) == "compute"
        memory_s = nbytes / (d.bandwidth * d.memory_efficiency)
        eff = self.analytic.compute_efficiency(flops, "compute" if compute else "other")
        compute_s = flops / (d.peak_flops * eff) if flops else 0.0
        c = self._kernel_costs[key] = d.launch_overhead_s + max(compute_s, memory_s)
        return c

    def cost(self, graph: Graph) -> float:
        key = graph.canonical_hash
        c = self._costs.get(key)
        if c is None:
            kernels = self.kernels(graph)
            written = written_values(kernels, graph)
            c = math.fsum(self._roofline_kernel_cost(k, graph, w) for k, w in zip(kernels, written))
            if len(self._costs) >= self.CACHE_SIZE:
                self._costs.clear()
                self._kernel_costs.clear()
            self._costs[key] = c
        return c

    def op_costs(self, graph: Graph) -> dict[str, float]:
        """node name -> seconds: each kernel's cost on its anchor node, 0 for the nodes it absorbs."""
        out = {n: 0.0 for n in graph.nodes}
        kernels = self.kernels(graph)
        for k, w in zip(kernels, written_values(kernels, graph)):
            out[k.anchor.name] = out.get(k.anchor.name, 0.0) + self._roofline_kernel_cost(k, graph, w)
        return out

    def describe(self) -> str:
        return f"{self.target.name}: estimate, {self.profile} roofline over onnxruntime's fusions"

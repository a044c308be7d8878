"""A model of onnxruntime's own graph fusions: which kernels the runtime will run for a graph.

A deployment runtime fuses Conv with BatchNorm, bias adds and activations, MatMul with a bias add
into Gemm, the erf pattern into Gelu, Add with LayerNorm into SkipLayerNorm, and more, before it
runs anything. A cost model that charges those ops separately measures a strawman: a rewrite that
does the same fusion looks like a gain, while the runtime would have done it anyway. So a target's
cost (`xrl.cost.target_cost`) is the cost of the **kernels** this module predicts, not of the nodes.

`runtime_kernels(graph, provider)` walks the graph once and groups nodes into kernels, following
onnxruntime's transformers at ORT_ENABLE_EXTENDED (the level below layout changes):

    eliminated      Identity, Dropout (inference), Cast to the same dtype, and every node that
                    computes what another computes (CommonSubexpressionElimination)
    ConvBNFusion    Conv -> BatchNormalization           (constant BN parameters; Conv has one consumer)
    ConvAdd/Mul     Conv -> Add|Mul(constant per-channel)
    PadFusion       Pad(constant zero pads on spatial dims) -> Conv | AveragePool (never MaxPool)
    MatMulAdd       MatMul(A, B 2-D) -> Add(constant bias)   => Gemm
    ConvActivation  Conv -> Relu|Sigmoid|Tanh|LeakyRelu|Clip|HardSigmoid   => FusedConv
    GemmActivation  Gemm -> Relu|Sigmoid|Tanh|LeakyRelu|...    => FusedGemm (cpu)
    GeluFusion      x * 0.5 * (1 + Erf(x / sqrt 2))            => Gelu
    BiasGelu        Add(constant bias) -> Gelu                 => BiasGelu
    QuickGelu       x * Sigmoid(x)                              => QuickGelu
    SkipLayerNorm   Add(x, y same shape) -> LayerNormalization  => SkipLayerNormalization
    MatMulTranspose Transpose(last two axes) -> MatMul          => FusedMatMul
    MatMulScale     Mul|Div(constant scalar) around a MatMul    => FusedMatMul
    GatherToSplit   Gathers of constant scalar indices on one axis of one tensor => Split

Views (Reshape, Squeeze, Unsqueeze, Flatten) run no kernel; onnxruntime adds and removes them freely
(MatMulAdd on a 3-D input inserts two), so `kernel_histogram` leaves them out, and the tests compare
it with the histogram of the model onnxruntime itself writes (`optimized_model_filepath`).

A node whose `activation` attribute came from one of xrl's fusion rules is exported as the op and
its activation; it becomes one kernel exactly when the runtime would fuse that pair, otherwise two.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from xrl.ir import Graph, Node

ORT_PROVIDERS = ("cpu", "cuda")

# Activations onnxruntime fuses into a preceding Conv (FusedConv) and Gemm (FusedGemm), per provider.
CONV_ACTIVATIONS = {"cpu": ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid"), "cuda": ("Relu",)}
GEMM_ACTIVATIONS = {"cpu": ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"), "cuda": ()}
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
ELIMINATED = "eliminated"


@dataclass(frozen=True)
class Kernel:
    """One kernel the runtime runs: its op (as onnxruntime names it, contrib ops as "com.microsoft:Op"),
    the node whose shapes stand for its work (`anchor`), and every node it covers (anchor included)."""

    op: str
    anchor: Node
    nodes: tuple[Node, ...]  # empty for an activation that runs as its own kernel after the anchor


def kernel_histogram(kernels: Iterable[Kernel]) -> dict[str, int]:
    """op -> count of the kernels that run (views and eliminated nodes left out)."""
    counts = Counter(k.op for k in kernels if k.op != ELIMINATED and k.op not in VIEW_OPS)
    return dict(sorted(counts.items()))


class _Walker:
    """One pass over the graph in topological order; each node joins at most one kernel."""

    def __init__(self, graph: Graph, provider: str) -> None:
        if provider not in ORT_PROVIDERS:
            raise ValueError(f"unknown onnxruntime provider {provider!r}; choose one of {ORT_PROVIDERS}")
        self.g = graph
        self.provider = provider
        self.taken: set[str] = set()
        self.kernels: list[Kernel | None] = []
        self.kernel_of: dict[str, int] = {}
        self._consumers = graph.consumers  # looked up for nearly every node: held here
        self._outputs = frozenset(graph.outputs)

    # ----- graph queries -----------------------------------------------------------------------
    def users(self, value: str) -> list[Node]:
        return self._consumers.get(value, [])

    def only_user(self, node: Node) -> Node | None:
        """The single consumer of a single-output node whose output is not a graph output."""
        if len(node.outputs) != 1 or node.outputs[0] in self._outputs:
            return None
        users = self._consumers.get(node.outputs[0], [])
        if len(users) != 1 or users[0].name in self.taken:
            return None
        return users[0]

    def const(self, value: str) -> np.ndarray | None:
        return self.g.const_value(value) if value and self.g.is_weight(value) else None

    def is_scalar_const(self, value: str) -> bool:
        c = self.const(value)
        return c is not None and c.size == 1

    def const_equals(self, value: str, target: float, rtol: float = 1e-3) -> bool:
        c = self.const(value)
        return c is not None and c.size == 1 and abs(float(c.reshape(())) - target) <= rtol * abs(target)

    def other_input(self, node: Node, value: str) -> str | None:
        ins = [v for v in node.inputs if v]
        if len(ins) != 2 or value not in ins:
            return None
        return ins[1] if ins[0] == value else ins[0]

    def emit(self, op: str, anchor: Node, *others: Node) -> None:
        nodes = (anchor, *others)
        index = len(self.kernels)
        for n in nodes:
            self.taken.add(n.name)
            self.kernel_of[n.name] = index
        self.kernels.append(Kernel(op, anchor, nodes))

    def unfused(self, node: Node, op: str) -> int | None:
        """The index of the kernel `node` runs alone as `op`, if it was emitted that way."""
        i = self.kernel_of.get(node.name)
        k = self.kernels[i] if i is not None else None
        return i if k is not None and k.op == op and len(k.nodes) == 1 else None

    def absorb(self, index: int) -> tuple[Node, ...]:
        """Take back a kernel emitted earlier, so that a later fusion can cover its nodes."""
        k = self.kernels[index]
        self.kernels[index] = None
        return k.nodes

    # ----- the walk --------------------------------------------------------------------------------
    def run(self) -> list[Kernel]:
        self.gather_to_split()
        for node in self.g.topological_order:
            if node.name in self.taken:
                continue
            if node.domain not in ("", "ai.onnx"):
                self.emit(f"{node.domain}:{node.op}", node)
                continue
            handler = _FUSERS.get(node.op)
            if handler is None or not handler(self, node):
                self.plain(node)
        return [k for k in self.kernels if k is not None]

    def plain(self, node: Node) -> None:
        if node.op in ("Identity", "Dropout"):
            self.emit(ELIMINATED, node)
        elif node.op == "Cast" and self.g.type_of(node.inputs[0]).dtype == self.g.type_of(node.outputs[0]).dtype:
            self.emit(ELIMINATED, node)
        elif node.op == "Mul" and self.quick_gelu(node):
            pass
        else:
            act = node.attr("activation")
            self.emit(node.op, node)
            if act:  # an xrl-fused activation the runtime does not fuse with this op runs on its own
                self.kernels.append(Kernel(act, node, ()))

    # Pad -> Conv / pooling: the Pad disappears into the consumer's pads (PadFusion)
    def fuse_Pad(self, pad: Node) -> bool:
        user = self.only_user(pad)
        # zero padding changes a max: onnxruntime folds only into Conv and AveragePool
        if user is None or user.op not in ("Conv", "AveragePool") or user.inputs[0] != pad.outputs[0]:
            return False
        pads = self.const(pad.inputs[1]) if len(pad.inputs) > 1 else None
        mode = pad.attr("mode", "constant")
        value = self.const(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] else None
        if pads is None or mode != "constant" or (value is not None and np.any(value != 0)):
            return False
        rank = self.g.type_of(pad.inputs[0]).rank
        if pads.size != 2 * rank or np.any(pads < 0) or pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
            return False
        if user.op == "AveragePool" and (user.attr("ceil_mode", 0) or not user.attr("count_include_pad", 0)
                                         and any(user.attr("pads") or ())):
            return False  # the folded pads must count as the Pad's zeros did
        self.emit(ELIMINATED, pad)
        return True

    def fuse_Conv(self, conv: Node) -> bool:
        covered: list[Node] = []
        tail = conv
        # BatchNorm, then constant Add/Mul, fold into the weights (ConvBNFusion, ConvAddFusion, ConvMulFusion)
        while not tail.attr("activation"):
            user = self.only_user(tail)
            if user is None:
                break
            if user.op == "BatchNormalization" and all(self.const(v) is not None for v in user.inputs[1:5]):
                covered.append(user)
            elif user.op in ("Add", "Mul") and self.const(self.other_input(user, tail.outputs[0]) or "") is not None:
                covered.append(user)
            else:
                break
            tail = user
        act = conv.attr("activation")
        if not act:
            user = self.only_user(tail)
            if user is not None and user.op in CONV_ACTIVATIONS[self.provider]:
                covered.append(user)
                act = user.op
        elif act not in CONV_ACTIVATIONS[self.provider]:
            self.emit("Conv", conv, *covered)
            self.kernels.append(Kernel(act, conv, ()))
            return True
        self.emit("com.microsoft:FusedConv" if act else "Conv", conv, *covered)
        return True

    def fuse_MatMul(self, mm: Node) -> bool:
        act = mm.attr("activation")
        if not act and self.matmul_add(mm):  # a basic-level fusion: it runs before the extended ones
            return True
        covered: list[Node] = []
        both_activations = not any(self.g.is_weight(v) for v in mm.inputs[:2])
        for v in mm.inputs[:2]:
            covered += self.fusable_prologue(v, batch=both_activations)
        user = self.only_user(mm)
        if user is not None and user.op in ("Mul", "Div") and self.is_scalar_const(user.inputs[1]) \
                and user.inputs[0] == mm.outputs[0] and not act:
            covered.append(user)
        self.emit("com.microsoft:FusedMatMul" if covered else "MatMul", mm, *covered)
        if act:
            self.kernels.append(Kernel(act, mm, ()))
        return True

    def fusable_prologue(self, value: str, *, batch: bool) -> list[Node]:
        """The nodes before a MatMul input that FusedMatMul absorbs, walking up from the input: a scalar
        Mul/Div (MatMulScale), a Transpose of the last two axes (transA/transB), and, for a MatMul of two
        activations, a Transpose of the batch axes behind a Reshape (transBatch). Only nodes emitted
        alone and read by nothing else; [] when there are none."""
        found: list[Node] = []
        swap = reshape = batch_done = False
        for _ in range(5):
            p = self.g.producer(value)
            if p is None or value in self.g.outputs or len(self.users(value)) != 1:
                break
            i = None
            if p.op in ("Mul", "Div") and self.is_scalar_const(p.inputs[1]) and not found and not reshape:
                i = self.unfused(p, p.op)
            elif p.op == "Transpose" and self._swaps_last_two(p) and not swap and not reshape:
                i, swap = self.unfused(p, "Transpose"), True
            elif p.op == "Reshape" and batch and not reshape:
                value, reshape = p.inputs[0], True  # a view: it stays, the walk looks behind it
                continue
            elif p.op == "Transpose" and batch and reshape and not batch_done and self._batch_transpose(p):
                i, batch_done = self.unfused(p, "Transpose"), True
            if i is None:
                break
            found += self.absorb(i)
            value = p.inputs[0]
        return found

    def matmul_add(self, mm: Node) -> bool:
        """MatMul(A, B 2-D) -> Add(C) => Gemm (MatMulAddFusion), then Gemm -> activation => FusedGemm.
        A 2-D A takes any C that broadcasts to [M, N]; a higher-rank A (flattened into a 2-D Gemm by
        Reshapes) only a bias over the last axis."""
        add = self.only_user(mm)
        a, b = self.g.type_of(mm.inputs[0]), self.g.type_of(mm.inputs[1])
        if add is None or add.op != "Add" or b.rank != 2 or a.rank < 2:
            return False
        c = self.other_input(add, mm.outputs[0])
        if not c or c == mm.outputs[0]:
            return False
        cs = self.g.type_of(c).shape
        n = b.shape[1]
        if a.rank == 2:
            m = a.shape[0]
            ok = len(cs) <= 2 and all(d in (1, want) for d, want in zip(cs[::-1], (n, m)))
        else:
            ok = len(cs) >= 1 and cs[-1] == n and all(d == 1 for d in cs[:-1])
        if not ok:
            return False
        act = self.only_user(add)
        if act is not None and act.op in GEMM_ACTIVATIONS[self.provider]:
            self.emit("com.microsoft:FusedGemm", mm, add, act)
        else:
            self.emit("Gemm", mm, add)
        return True

    def fuse_Gemm(self, gemm: Node) -> bool:
        act = gemm.attr("activation")
        if act:
            if act in GEMM_ACTIVATIONS[self.provider]:
                self.emit("com.microsoft:FusedGemm", gemm)
            else:
                self.emit("Gemm", gemm)
                self.kernels.append(Kernel(act, gemm, ()))
            return True
        user = self.only_user(gemm)
        if user is not None and user.op in GEMM_ACTIVATIONS[self.provider]:
            self.emit("com.microsoft:FusedGemm", gemm, user)
        else:
            self.emit("Gemm", gemm)
        return True

    # x / sqrt(2) -> Erf -> + 1 -> * x -> * 0.5 (either order of the two Muls)
    def fuse_Div(self, div: Node) -> bool:
        if not self.const_equals(div.inputs[1], 2 ** 0.5):
            return False
        x = div.inputs[0]
        erf = self.only_user(div)
        if erf is None or erf.op != "Erf":
            return False
        add = self.only_user(erf)
        if add is None or add.op != "Add" or not self.const_equals(self.other_input(add, erf.outputs[0]) or "", 1.0):
            return False
        m1 = self.only_user(add)
        if m1 is None or m1.op != "Mul":
            return False
        other = self.other_input(m1, add.outputs[0])
        if other == x:  # (1 + erf) * x, then * 0.5
            m2 = self.only_user(m1)
            if m2 is None or m2.op != "Mul" or not self.const_equals(self.other_input(m2, m1.outputs[0]) or "", 0.5):
                return False
            nodes = (div, erf, add, m1, m2)
        else:  # (1 + erf) * (x * 0.5)
            half = self.g.producer(other or "")
            if half is None or half.op != "Mul" or half.name in self.taken or x not in half.inputs \
                    or not self.const_equals(self.other_input(half, x) or "", 0.5):
                return False
            nodes = (div, erf, add, m1, half)
        # BiasGeluFusion: a constant-bias Add whose only users are this pattern
        p = self.g.producer(x)
        i = self.unfused(p, "Add") if p is not None else None
        if i is not None and any((c := self.const(v)) is not None and c.ndim == 1 for v in p.inputs) \
                and all(u in nodes for u in self.users(x)) and x not in self.g.outputs:
            self.emit("com.microsoft:BiasGelu", nodes[-1], *nodes[:-1], *self.absorb(i))
        else:
            self.emit("com.microsoft:Gelu", nodes[-1], *nodes[:-1])
        return True

    def fuse_Gelu(self, gelu: Node) -> bool:
        self.emit("com.microsoft:Gelu", gelu)
        return True

    def quick_gelu(self, mul: Node) -> bool:
        """x * Sigmoid(x) (SiLU / Swish), either operand order: one QuickGelu kernel."""
        for i in (0, 1):
            sig = self.g.producer(mul.inputs[i])
            if sig is not None and sig.op == "Sigmoid" and sig.inputs[0] == mul.inputs[1 - i] \
                    and len(self.users(sig.outputs[0])) == 1 and sig.outputs[0] not in self.g.outputs:
                j = self.unfused(sig, "Sigmoid")
                if j is None:
                    continue
                self.emit("com.microsoft:QuickGelu", mul, *self.absorb(j))
                return True
        return False

    def fuse_Add(self, add: Node) -> bool:
        """Add -> LayerNormalization: SkipLayerNormalization (when the sum feeds nothing else)."""
        ln = self.only_user(add)
        if ln is None or ln.op != "LayerNormalization" or ln.inputs[0] != add.outputs[0] \
                or len([v for v in add.inputs if v]) != 2:
            return False
        a, b = (self.g.type_of(v) for v in add.inputs)
        out = self.g.type_of(add.outputs[0])
        if a.shape != out.shape and b.shape != out.shape:
            return False
        if ln.attr("axis", -1) not in (-1, out.rank - 1):
            return False
        self.emit("com.microsoft:SkipLayerNormalization", ln, add)
        return True

    def gather_to_split(self) -> None:
        """Gathers of distinct constant scalar indices along one axis of one tensor: one Split (with Squeezes)."""
        groups: dict[tuple[str, int], list[Node]] = {}
        for n in self.g.nodes.values():
            if n.op == "Gather" and n.domain in ("", "ai.onnx") and self.g.producer(n.inputs[0]) is not None:
                idx = self.const(n.inputs[1])
                if idx is not None and idx.ndim == 0:
                    rank = self.g.type_of(n.inputs[0]).rank
                    axis = n.attr("axis", 0) % max(rank, 1)
                    groups.setdefault((n.inputs[0], axis), []).append(n)
        for (value, axis), nodes in groups.items():
            dim = self.g.type_of(value).shape[axis]
            indices = {int(self.const(n.inputs[1]) % dim) for n in nodes}
            if len(nodes) == dim and len(indices) == dim and dim > 1:
                self.emit("Split", nodes[0], *nodes[1:])

    def _batch_transpose(self, t: Node) -> bool:
        """A transpose that keeps the last axis and moves the leading ones (FusedMatMul's transBatch)."""
        perm = list(t.attr("perm") or ())
        return len(perm) in (3, 4) and perm[-1] == len(perm) - 1 and perm != sorted(perm)

    def _swaps_last_two(self, t: Node) -> bool:
        perm = list(t.attr("perm") or ())
        r = len(perm)
        return r >= 2 and perm[:-2] == list(range(r - 2)) and perm[-2:] == [r - 1, r - 2]


# op -> the _Walker method that tries its fusions (`fuse_<op>`): looked up once, not per node.
_FUSERS = {name.removeprefix("fuse_"): f for name, f in vars(_Walker).items() if name.startswith("fuse_")}


def deduplicate(graph: Graph) -> Graph:
    """`graph` with every node that computes what an earlier node computes removed and its uses
    redirected: onnxruntime's CommonSubexpressionElimination (same op, attributes and input values),
    after its ConstantSharing (weights of one element and equal value are one value; larger weights
    are told apart by name, as the runtime does, not by content)."""
    seen: dict[tuple, Node] = {}
    remove: list[str] = []
    rename: dict[str, str] = {}
    scalars = {v for v, w in graph.initializers.items() if w.size == 1}

    def key_of(v: str) -> object:
        if v in rename:
            return rename[v]
        w = graph.initializers.get(v)
        if w is not None and w.size == 1:
            return ("scalar", w.dtype.str, w.reshape(()).item())
        return v

    for n in graph.topological_order:
        if n.op in ("Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"):
            continue
        # attributes are compared only when op and inputs agree (attr_key is the expensive part)
        ins = n.inputs  # the names are the key when none is renamed or a one-element weight (most nodes)
        args = tuple([key_of(v) for v in ins]) if rename or not scalars.isdisjoint(ins) else ins
        key = (n.domain, n.op, args, len(n.outputs))
        rep = seen.setdefault(key, n)
        if rep is not n and rep.attr_key() != n.attr_key():
            seen.setdefault((*key, n.attr_key()), n)
            continue
        if rep is not n:
            remove.append(n.name)
            rename.update(zip(n.outputs, rep.outputs))
    return graph.replace(remove, rename=rename) if remove else graph


def runtime_kernels(graph: Graph, provider: str = "cpu") -> list[Kernel]:
    """The kernels onnxruntime (ORT_ENABLE_EXTENDED, `provider` "cpu" or "cuda") runs for `graph`."""
    return runtime_plan(graph, provider)[1]


def runtime_plan(graph: Graph, provider: str = "cpu") -> tuple[Graph, list[Kernel]]:
    """The graph onnxruntime runs after eliminating common subexpressions, and its kernels: a kernel's
    nodes are that graph's (a caller that builds a kernel alone must read their values there)."""
    dedup = deduplicate(graph)
    return dedup, _Walker(dedup, provider).run()


# ----- local re-planning: a rewrite changes the kernels near it only ----------------------------------------
# How far (in nodes) around a rewrite the kernels are planned again. onnxruntime's fusions reach at most a few
# nodes (Conv-BN-activation, the erf Gelu's five, MatMul-Mul-scale): a kernel of the parent that any node within
# this distance belongs to is planned again, with every node it covers, until no further kernel is touched.
LOCAL_RADIUS = 3


def local_region(graph: Graph, seeds: Iterable[str], kernel_of: dict[str, int],
                 kernel_nodes: list[tuple[str, ...]], radius: int = LOCAL_RADIUS) -> tuple[set[str], set[int]]:
    """The nodes of `graph` (a rewrite's result) to plan again, and the parent's kernels they replace.

    `seeds`: node names the rewrite touched (added nodes, consumers of renamed values, neighbours of removed
    nodes: names of `graph`, or of the parent for removed ones, whose kernels are replaced too);
    `kernel_of`/`kernel_nodes`: the parent's plan (node name -> kernel index, kernel index -> its nodes' names)."""
    producers, consumers = graph.producers, graph.consumers
    region = {s for s in seeds if s in graph.nodes}
    touched = {kernel_of[s] for s in seeds if s in kernel_of}
    # breadth first; a view op (which the fusions look through) costs no distance
    left = dict.fromkeys(region, radius)
    queue = list(region)
    while queue:
        name = queue.pop()
        node = graph.nodes[name]
        near = [p[0] for v in node.inputs if v and (p := producers.get(v)) is not None]
        near += [u for v in node.outputs if v for u in consumers.get(v, ())]
        for m in near:
            r = left[name] if m.op in VIEW_OPS else left[name] - 1
            if r >= 0 and left.get(m.name, -1) < r:
                left[m.name] = r
                region.add(m.name)
                queue.append(m.name)
    while True:  # whole kernels of the parent: their nodes are planned together again
        more = {kernel_of[n] for n in region if n in kernel_of} - touched
        if not more:
            break
        touched |= more
        for i in more:
            region.update(n for n in kernel_nodes[i] if n in graph.nodes)
    return region, touched


def subgraph(graph: Graph, names: set[str]) -> Graph | None:
    """The nodes `names` of `graph` as a graph of their own: what they read from outside are inputs (weights
    stay weights), what is read outside or is a graph output are outputs (so no fusion crosses the border).
    None when nothing is read outside (dead code: the caller costs the whole graph)."""
    nodes = [n for n in graph.topological_order if n.name in names]
    produced = {v for n in nodes for v in n.outputs if v}
    consumers = graph.consumers
    outs = set(graph.outputs)
    inputs = list(dict.fromkeys(v for n in nodes for v in n.inputs
                                if v and v not in produced and not graph.is_weight(v)))
    weights = {v: graph.initializers[v] for n in nodes for v in n.inputs if v and graph.is_weight(v)}
    outputs = [v for n in nodes for v in n.outputs
               if v and (v in outs or any(u.name not in names for u in consumers.get(v, ())))]
    if not outputs:
        return None
    used = {*inputs, *produced, *weights}
    types = {v: t for v, t in graph.types.items() if v in used}
    known = graph._digests  # digests already computed are passed on; none is computed here (hashing weights)
    return Graph(nodes, inputs, outputs, types, weights, name=f"{graph.name}:local",
                 weight_digests={v: known[v] for v in weights if v in known}, domain_opsets=graph.domain_opsets)

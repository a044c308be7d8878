"""A small ONNX model builder, so that each benchmark graph reads like its architecture.

Every method adds the nodes of one layer and returns the name of the value it computes. The
builder tracks each value's static shape (so a layer needs no redundant channel counts) and writes
it into the model as value_info, which `onnx.checker.check_model(..., full_check=True)` then checks
against ONNX's own shape inference.

Weights are seeded and fan-in scaled so that activations stay O(1) through the whole network:
graphs are compared across rewrites with a relative tolerance, which blow-ups or all-zero outputs
would make meaningless. BatchNormalization statistics are *calibrated*: `model()` runs the network
once in onnxruntime with every BatchNormalization in training mode on a seeded input, and stores the
batch statistics it measures as the running mean and variance. That is what a trained network's
running statistics are (the statistics of its own activations), so each BatchNormalization
normalises what really reaches it, however deep the network or its residual sums.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
# onnx>=1.16 stamps its newest IR version, which onnxruntime may not read yet; opset 17 needs IR 8.
IR_VERSION = 8

Shape = tuple[int, ...]
IntPair = int | tuple[int, int]


def _pair(v: IntPair) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pool_out(size: int, k: int, stride: int, pad_total: int, dilation: int = 1, ceil: bool = False) -> int:
    """ONNX's output size of a conv or pool window along one axis."""
    span = size + pad_total - ((k - 1) * dilation + 1)
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_total // 2:
        out -= 1  # the last window must start inside the input or its left padding
    if out <= 0:
        raise ValueError(f"window {k} (stride {stride}) does not fit size {size}")
    return out


class OnnxBuilder:
    """Builds one float32 ONNX model (opset 17) with seeded weights.

    >>> b = OnnxBuilder("demo", seed=0)
    >>> x = b.input("x", (1, 3, 32, 32))
    >>> y = b.relu(b.bn(b.conv(x, 16, 3)))
    >>> b.output(y, "y"); model = b.model()
    """

    def __init__(self, name: str, seed: int, doc: str = "") -> None:
        self.name = name
        self.doc = doc
        self.rng = np.random.default_rng(seed)
        self.shapes: dict[str, Shape] = {}
        self._nodes: list[onnx.NodeProto] = []
        self._inits: dict[str, np.ndarray] = {}
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._consts: dict[tuple, str] = {}
        self._scope: list[str] = []
        self._counts: dict[str, int] = {}
        self._names: set[str] = set()  # every name handed out: nodes, values, weights
        self._batchnorms: list[tuple[str, str]] = []  # (running mean, running var) names to calibrate

    # ----- naming ------------------------------------------------------------------------------
    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names made inside with `name/` (e.g. "layer3/attn/q")."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def fresh(self, base: str, scoped: bool = True) -> str:
        """A new unique name (under the current scope if `scoped`): base, then base_1, base_2, ..."""
        stem = "/".join([*self._scope, base]) if scoped else base
        n = self._counts.get(stem, 0)
        name = stem if n == 0 else f"{stem}_{n}"
        while name in self._names:  # taken by another stem ("conv_1" as a base of its own) or an input
            n += 1
            name = f"{stem}_{n}"
        self._counts[stem] = n + 1
        self._names.add(name)
        return name

    def shape(self, x: str) -> Shape:
        return self.shapes[x]

    # ----- values ------------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int]) -> str:
        if name in self._names:
            raise ValueError(f"input name {name!r} is already taken")
        self._names.add(name)
        self.shapes[name] = tuple(int(d) for d in shape)
        self._inputs.append(name)
        return name

    def output(self, x: str, name: str | None = None) -> str:
        """Declare x a graph output, renamed to `name` if given (an Identity only if x is an input or weight)."""
        if name is not None and name != x:
            if name in self._names:
                raise ValueError(f"output name {name!r} is already taken")
            if x in self._inputs or x in self._inits:
                x = self.node("Identity", [x], self.shapes[x], name=name)
            else:
                self._rename(x, name)
                x = name
        self._outputs.append(x)
        return x

    def _rename(self, old: str, new: str) -> None:
        for n in self._nodes:
            for field in (n.input, n.output):
                for i, v in enumerate(field):
                    if v == old:
                        field[i] = new
        self._outputs = [new if o == old else o for o in self._outputs]
        self.shapes[new] = self.shapes.pop(old)
        self._names.add(new)

    def param(self, array: np.ndarray, base: str, scoped: bool = True) -> str:
        """Add an initializer holding `array` (as given: no copy, no cast)."""
        name = self.fresh(base, scoped)
        self._inits[name] = array
        self.shapes[name] = tuple(array.shape)
        return name

    def weight(self, shape: Sequence[int], std: float, base: str = "w") -> str:
        """A float32 weight, uniform on [-a, a] with standard deviation `std` (a = std * sqrt 3).

        Uniform, as PyTorch initialises Linear and Conv, and drawn directly in float32: five times
        faster than normals, which matters for BERT's 100M parameters.
        """
        w = self.rng.random(tuple(shape), dtype=np.float32)
        a = np.float32(std * math.sqrt(3.0))
        w *= 2 * a
        w -= a
        return self.param(w, base)

    def const(self, values: Sequence[int] | Sequence[float] | np.ndarray | float, dtype: str = "int64") -> str:
        """A constant initializer (shapes, axes, scalars), shared between every user of the same value."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.param(array, "const", scoped=False)  # shared across scopes
        return self._consts[key]

    # ----- generic node ------------------------------------------------------------------------
    def node(self, op: str, inputs: Sequence[str], shape: Shape, name: str | None = None, **attrs) -> str:
        """Add a single-output node whose output has `shape`; its value takes the node's name."""
        return self.multi_node(op, inputs, [shape], name=name, **attrs)[0]

    def multi_node(self, op: str, inputs: Sequence[str], shapes: Sequence[Shape], name: str | None = None,
                   **attrs) -> list[str]:
        node_name = self.fresh(name or op.lower())
        outs = [node_name] if len(shapes) == 1 else [f"{node_name}:{i}" for i in range(len(shapes))]
        self._nodes.append(helper.make_node(op, list(inputs), outs, name=node_name, **attrs))
        for out, shape in zip(outs, shapes, strict=True):
            self.shapes[out] = tuple(int(d) for d in shape)
        return outs

    # ----- convolution family ------------------------------------------------------------------
    def conv(self, x: str, cout: int, k: IntPair, stride: IntPair = 1, pad: IntPair | None = None, group: int = 1,
             dilation: int = 1, bias: bool = False, name: str = "conv") -> str:
        """Conv with He-initialised weights; `pad` defaults to "same" padding for odd kernels."""
        n, cin, h, w = self.shapes[x]
        kh, kw = _pair(k)
        sh, sw = _pair(stride)
        ph, pw = _pair(pad) if pad is not None else (dilation * (kh - 1) // 2, dilation * (kw - 1) // 2)
        if cin % group or cout % group:
            raise ValueError(f"{name}: channels {cin}->{cout} not divisible by group {group}")
        fan_in = cin // group * kh * kw
        inputs = [x, self.weight((cout, cin // group, kh, kw), math.sqrt(2.0 / fan_in), f"{name}.weight")]
        if bias:
            inputs.append(self.weight((cout,), 0.05, f"{name}.bias"))
        out_hw = (_pool_out(h, kh, sh, 2 * ph, dilation), _pool_out(w, kw, sw, 2 * pw, dilation))
        return self.node("Conv", inputs, (n, cout, *out_hw), name=name, kernel_shape=[kh, kw], strides=[sh, sw],
                         pads=[ph, pw, ph, pw], dilations=[dilation, dilation], group=group)

    def bn(self, x: str, eps: float = 1e-5, name: str = "bn") -> str:
        """Inference BatchNormalization: random scale/shift, running statistics calibrated in `model()`."""
        c = self.shapes[x][1]
        scale = self.param(self.rng.uniform(0.6, 1.4, c).astype(np.float32), f"{name}.weight")
        shift = self.param((0.1 * self.rng.standard_normal(c)).astype(np.float32), f"{name}.bias")
        mean = self.param(np.zeros(c, np.float32), f"{name}.running_mean")
        var = self.param(np.ones(c, np.float32), f"{name}.running_var")
        self._batchnorms.append((mean, var))
        return self.node("BatchNormalization", [x, scale, shift, mean, var], self.shapes[x], name=name, epsilon=eps)

    def _pool(self, op: str, x: str, k: IntPair, stride: IntPair | None, pad: IntPair, ceil: bool, **attrs) -> str:
        n, c, h, w = self.shapes[x]
        kh, kw = _pair(k)
        sh, sw = _pair(stride if stride is not None else k)
        ph, pw = _pair(pad)
        out_hw = (_pool_out(h, kh, sh, 2 * ph, ceil=ceil), _pool_out(w, kw, sw, 2 * pw, ceil=ceil))
        return self.node(op, [x], (n, c, *out_hw), kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
                         ceil_mode=int(ceil), **attrs)

    def maxpool(self, x: str, k: IntPair, stride: IntPair | None = None, pad: IntPair = 0, ceil: bool = False) -> str:
        return self._pool("MaxPool", x, k, stride, pad, ceil)

    def avgpool(self, x: str, k: IntPair, stride: IntPair | None = None, pad: IntPair = 0, ceil: bool = False,
                count_include_pad: bool = True) -> str:
        """AveragePool; padding counts towards the mean by default, as PyTorch's avg_pool2d does."""
        return self._pool("AveragePool", x, k, stride, pad, ceil, count_include_pad=int(count_include_pad))

    def global_avgpool(self, x: str) -> str:
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], (n, c, 1, 1))

    # ----- dense layers ------------------------------------------------------------------------
    def matmul(self, a: str, b: str, name: str = "matmul") -> str:
        sa, sb = self.shapes[a], self.shapes[b]
        if sa[-1] != sb[-2]:
            raise ValueError(f"{name}: cannot multiply {sa} by {sb}")
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.node("MatMul", [a, b], (*batch, sa[-2], sb[-1]), name=name)

    def linear(self, x: str, dout: int, bias: bool = True, gain: float = 1.0, name: str = "linear") -> str:
        """x @ W (+ b) as MatMul then Add, the way frameworks export nn.Linear on 3-D inputs.

        W has variance gain^2 / fan_in: unit-variance inputs give unit-variance outputs (LeCun).
        """
        din = self.shapes[x][-1]
        with self.scope(name):
            y = self.matmul(x, self.weight((din, dout), gain / math.sqrt(din), "weight"))
            if bias:
                y = self.add(y, self.weight((dout,), 0.02, "bias"))
        return y

    def gemm(self, x: str, dout: int, gain: float = 1.0, name: str = "fc") -> str:
        """Gemm(x, W^T, b), as PyTorch exports nn.Linear on a matrix; W scaled as in `linear`."""
        n, din = self.shapes[x]
        w = self.weight((dout, din), gain / math.sqrt(din), f"{name}.weight")
        b = self.weight((dout,), 0.02, f"{name}.bias")
        return self.node("Gemm", [x, w, b], (n, dout), name=name, transB=1)

    # ----- elementwise -------------------------------------------------------------------------
    def _binary(self, op: str, a: str, b: str) -> str:
        return self.node(op, [a, b], np.broadcast_shapes(self.shapes[a], self.shapes[b]))

    def add(self, a: str, b: str) -> str:
        return self._binary("Add", a, b)

    def sub(self, a: str, b: str) -> str:
        return self._binary("Sub", a, b)

    def mul(self, a: str, b: str) -> str:
        return self._binary("Mul", a, b)

    def div(self, a: str, b: str) -> str:
        return self._binary("Div", a, b)

    def scalar(self, value: float) -> str:
        return self.const(value, "float32")

    def _unary(self, op: str, x: str) -> str:
        return self.node(op, [x], self.shapes[x])

    def relu(self, x: str) -> str:
        return self._unary("Relu", x)

    def sigmoid(self, x: str) -> str:
        return self._unary("Sigmoid", x)

    def tanh(self, x: str) -> str:
        return self._unary("Tanh", x)

    def gelu(self, x: str) -> str:
        """Exact GELU, 0.5 * x * (1 + erf(x / sqrt 2)), as PyTorch exports it (opset 17 has no Gelu)."""
        e = self._unary("Erf", self.div(x, self.scalar(math.sqrt(2.0))))
        return self.mul(self.mul(x, self.add(e, self.scalar(1.0))), self.scalar(0.5))

    def softmax(self, x: str, axis: int = -1) -> str:
        return self.node("Softmax", [x], self.shapes[x], axis=axis)

    def layernorm(self, x: str, eps: float = 1e-5, name: str = "ln") -> str:
        """LayerNormalization over the last axis, with a near-identity random affine."""
        d = self.shapes[x][-1]
        scale = self.param((1.0 + 0.1 * self.rng.standard_normal(d)).astype(np.float32), f"{name}.weight")
        shift = self.param((0.05 * self.rng.standard_normal(d)).astype(np.float32), f"{name}.bias")
        return self.node("LayerNormalization", [x, scale, shift], self.shapes[x], name=name, axis=-1, epsilon=eps)

    # ----- data movement -----------------------------------------------------------------------
    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        shape = list(self.shapes[xs[0]])
        shape[axis] = sum(self.shapes[x][axis] for x in xs)
        return self.node("Concat", list(xs), tuple(shape), axis=axis)

    def split(self, x: str, sizes: Sequence[int], axis: int) -> list[str]:
        """Split with its sizes as an int64 initializer input (opset 13+)."""
        base = self.shapes[x]
        shapes = [base[:axis % len(base)] + (s,) + base[axis % len(base) + 1:] for s in sizes]
        return self.multi_node("Split", [x, self.const(sizes)], shapes, axis=axis)

    def slice(self, x: str, axis: int, start: int, end: int) -> str:
        shape = list(self.shapes[x])
        shape[axis] = len(range(*slice(start, end).indices(shape[axis])))
        inputs = [x, self.const([start]), self.const([end]), self.const([axis])]
        return self.node("Slice", inputs, tuple(shape))

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        """Reshape to a fully specified target (no 0 or -1: the shape constant says what it is)."""
        if math.prod(shape) != math.prod(self.shapes[x]):
            raise ValueError(f"cannot reshape {self.shapes[x]} to {tuple(shape)}")
        return self.node("Reshape", [x, self.const(shape)], tuple(shape))

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        s = self.shapes[x]
        return self.node("Transpose", [x], tuple(s[p] for p in perm), perm=list(perm))

    def flatten(self, x: str, axis: int = 1) -> str:
        s = self.shapes[x]
        return self.node("Flatten", [x], (math.prod(s[:axis]), math.prod(s[axis:])), axis=axis)

    def squeeze(self, x: str, axis: int) -> str:
        s = list(self.shapes[x])
        if s[axis] != 1:
            raise ValueError(f"cannot squeeze axis {axis} of {tuple(s)}")
        del s[axis]
        return self.node("Squeeze", [x, self.const([axis])], tuple(s))

    def unsqueeze(self, x: str, axis: int) -> str:
        s = list(self.shapes[x])
        s.insert(axis % (len(s) + 1), 1)
        return self.node("Unsqueeze", [x, self.const([axis])], tuple(s))

    # ----- composite: multi-head self-attention --------------------------------------------------
    def attention(self, x: str, heads: int, mask: str | None = None, name: str = "attn") -> str:
        """Multi-head self-attention as frameworks export it.

        Separate Q, K and V projections (MatMul + bias Add) all read x; heads split by Reshape +
        Transpose; softmax(Q K^T / sqrt(d_head) + mask) V; heads merged; output projection.
        `mask` is an additive constant broadcast against the (batch, heads, seq, seq) scores.
        """
        b, s, d = self.shapes[x]
        if d % heads:
            raise ValueError(f"{name}: hidden size {d} not divisible by {heads} heads")
        dh = d // heads
        with self.scope(name):
            q, k, v = (self.linear(x, d, name=p) for p in ("q", "k", "v"))
            q = self.transpose(self.reshape(q, (b, s, heads, dh)), (0, 2, 1, 3))  # (b, h, s, dh)
            k = self.transpose(self.reshape(k, (b, s, heads, dh)), (0, 2, 3, 1))  # (b, h, dh, s)
            v = self.transpose(self.reshape(v, (b, s, heads, dh)), (0, 2, 1, 3))  # (b, h, s, dh)
            scores = self.div(self.matmul(q, k), self.scalar(math.sqrt(dh)))  # (b, h, s, s)
            if mask is not None:
                scores = self.add(scores, mask)
            ctx = self.matmul(self.softmax(scores, axis=-1), v)  # (b, h, s, dh)
            ctx = self.reshape(self.transpose(ctx, (0, 2, 1, 3)), (b, s, d))
            return self.linear(ctx, d, name="out")

    # ----- the model ---------------------------------------------------------------------------
    def model(self) -> onnx.ModelProto:
        """The finished model, with calibrated BatchNormalization statistics."""
        if self._batchnorms:
            self._calibrate_batchnorms()
            self._batchnorms = []  # calibrated once: a second model() call returns the same model
        return self._make_model(self._nodes, self._outputs, self._inits)

    def _value_info(self, name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(self.shapes[name]))

    def _make_model(self, nodes: Sequence[onnx.NodeProto], outputs: Sequence[str], weights: dict[str, np.ndarray],
                    extra_outputs: Sequence[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
        produced = [o for n in nodes for o in n.output if o not in outputs]
        graph = helper.make_graph(
            list(nodes), self.name, [self._value_info(i) for i in self._inputs],
            [self._value_info(o) for o in outputs] + list(extra_outputs),
            value_info=[self._value_info(v) for v in produced if v in self.shapes],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                  producer_name="xrl.graphs", doc_string=self.doc)
        # Weights go straight into the model's own graph: make_graph and make_model would each copy them.
        for name, array in weights.items():
            tensor = model.graph.initializer.add()
            tensor.name = name
            tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            tensor.dims.extend(array.shape)
            tensor.raw_data = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        return model

    def _calibrate_batchnorms(self) -> None:
        """Set each BatchNormalization's running statistics to those of its input on a seeded sample.

        One onnxruntime pass over a calibration copy of the network in which every
        BatchNormalization normalises with the batch statistics of its own input, computed by plain
        ReduceMean/Sub/Mul nodes (ONNX's training-mode BatchNormalization would do the same, but
        onnxruntime has had bugs there). Those statistics become the running mean and variance, so
        the real network computes on this sample exactly what the calibration copy computed. The
        sample is one draw repeated over the batch, so the statistics do not depend on the batch
        size (up to float rounding). Single-threaded: the same seed gives byte-identical statistics.
        """
        import onnxruntime as ort  # only builders of networks with BatchNormalization need it

        model, stats = self._calibration_model()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feeds = {}
        for name in self._inputs:
            shape = self.shapes[name]
            sample = self.rng.standard_normal((1, *shape[1:]), dtype=np.float32)
            feeds[name] = np.repeat(sample, shape[0], axis=0)
        values = session.run(stats, feeds)
        for (mean, var), m, v in zip(self._batchnorms, values[0::2], values[1::2], strict=True):
            self._inits[mean] = np.asarray(m, np.float32)
            self._inits[var] = np.asarray(v, np.float32)

    def _calibration_model(self) -> tuple[onnx.ModelProto, list[str]]:
        """The network with each BatchNormalization fed its input's batch mean and variance (also outputs)."""
        placeholders = {name for pair in self._batchnorms for name in pair}
        weights = {k: v for k, v in self._inits.items() if k not in placeholders}
        nodes, stats = [], []
        for n in self._nodes:
            if n.op_type == "BatchNormalization":
                x, p = n.input[0], n.name
                mean, var = f"{p}:batch_mean", f"{p}:batch_var"
                weights[f"{p}:channels"] = np.array([self.shapes[x][1]], np.int64)
                nodes += [  # per-channel statistics over batch and space, kept (1, C, 1, 1) to broadcast
                    helper.make_node("ReduceMean", [x], [f"{p}:mean"], axes=[0, 2, 3], keepdims=1),
                    helper.make_node("Sub", [x, f"{p}:mean"], [f"{p}:centred"]),
                    helper.make_node("Mul", [f"{p}:centred", f"{p}:centred"], [f"{p}:square"]),
                    helper.make_node("ReduceMean", [f"{p}:square"], [f"{p}:var"], axes=[0, 2, 3], keepdims=1),
                    helper.make_node("Reshape", [f"{p}:mean", f"{p}:channels"], [mean]),
                    helper.make_node("Reshape", [f"{p}:var", f"{p}:channels"], [var]),
                ]
                n = copy.deepcopy(n)
                n.input[3:5] = [mean, var]
                stats += [mean, var]
            nodes.append(n)
        extra = [helper.make_tensor_value_info(s, TensorProto.FLOAT, None) for s in stats]
        return self._make_model(nodes, self._outputs, weights, extra), stats

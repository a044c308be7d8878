"""Compile an IR graph to PyTorch: the engine behind the measured `op`, `e2e` (engine="torch") and `cuda` backends
(timed by `xrl.cost.torch_timing`).

`TorchExecutor(graph)` compiles the graph once into a list of steps, one closure over a torch op per
node, with every weight already on the device; `run(feeds)` walks them under `torch.inference_mode`.
Values live in a flat slot list, and each intermediate is dropped after its last use, so a big graph
holds no more activations than eager PyTorch would.

Semantics follow ONNX (opset 17) on the IR's op set. Two choices matter for timing:
- "view" ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout) return torch views: no kernel;
- "memory" ops (Transpose, Slice, Split, Expand, Pad, Concat) return contiguous tensors, as an ONNX
  runtime does, so the data movement the IR counts is the data movement that is timed.

`bind(feeds)` fixes the inputs on the device and returns a `BoundRun`, a no-argument callable that
runs the whole graph. On CUDA it can capture the graph once into a `torch.cuda.CUDAGraph` and replay
it, so kernel launch gaps from Python do not dominate a measurement of small kernels.

An op outside the IR's op set (opaque) cannot be executed: compiling raises UnsupportedOpError, and
the `e2e` backend falls back to onnxruntime.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from xrl.cost.devices import DEVICE_PROFILES
from xrl.errors import ConfigError, XrlError
from xrl.ir import Graph, Node
from xrl.ir.ops import is_known, slice_bounds

if TYPE_CHECKING:
    import torch

MEASURED_DEVICES = ("auto", "cpu", "cuda")


class UnsupportedOpError(XrlError):
    """The graph has an op the PyTorch executor cannot run (an opaque op, or an unsupported variant)."""


def resolve_device(device: str | None, who: str) -> str:
    """The device a measured backend runs on ("cpu" or "cuda") from its `device` option.

    None and "auto" pick cuda when torch sees a GPU; a GPU profile name ("h100", ...) means cuda and
    "cpu" the CPU. Asking for cuda without a GPU is an error, not a silent CPU measurement.
    """
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device == "cuda" or device in DEVICE_PROFILES:
        if not torch.cuda.is_available():
            raise ConfigError(f"the {who!r} cost model was given device {device!r}, which means a CUDA GPU, but "
                              f"torch finds none; pass device 'cpu' (CLI: --device cpu)")
        return "cuda"
    gpus = ", ".join(p for p in DEVICE_PROFILES if p != "cpu")
    raise ConfigError(f"unknown device {device!r} for the {who!r} cost model; choose one of: "
                      f"{', '.join(MEASURED_DEVICES)} (or a GPU profile name, meaning cuda: {gpus})")


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` for the block (a process-wide setting), then restored."""
    import torch

    if n is None or n == torch.get_num_threads():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    try:
        return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
                "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}[name]
    except KeyError:
        raise UnsupportedOpError(f"dtype {name!r} has no torch equivalent here") from None


@dataclass
class _Step:
    fn: Callable[..., Any]  # tensors in `operands` order -> one tensor, or a tuple for multi-output ops
    operands: tuple[int, ...]  # slots read
    outputs: tuple[int, ...]  # slots written
    frees: tuple[int, ...] = ()  # slots whose last reader this step is


@dataclass
class BoundRun:
    """The graph bound to fixed device inputs: calling it runs the graph once and returns its outputs.

    `cuda_graph` is the captured torch.cuda.CUDAGraph when the run replays one (its outputs are then
    the same static tensors on every call).
    """

    fn: Callable[[], list[Any]]
    device: str
    cuda_graph: Any = None
    keep: list[Any] = field(default_factory=list)  # device inputs the run reads: kept alive

    def __call__(self) -> list[Any]:
        return self.fn()

    def graph_exec_handle(self) -> int | None:
        """The cudaGraphExec_t of the captured graph (torch >= 2.9), for the native harness; else None."""
        if self.cuda_graph is None or not hasattr(self.cuda_graph, "raw_cuda_graph_exec"):
            return None
        return int(self.cuda_graph.raw_cuda_graph_exec())


class TorchExecutor:
    """An IR graph compiled to torch ops on one device. `dtype` replaces float32 (e.g. torch.float16)."""

    def __init__(self, graph: Graph, device: str = "cpu", dtype: torch.dtype | None = None) -> None:
        import torch

        self.graph = graph
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        order = graph.topological_order
        self._slot: dict[str, int] = {}
        for v in (*graph.inputs, *graph.initializers, *(o for n in order for o in n.outputs)):
            self._slot.setdefault(v, len(self._slot))
        self._steps = [self._compile(n) for n in order]
        self._template: list[Any] = [None] * len(self._slot)
        read = {s for st in self._steps for s in st.operands} | {self._slot[v] for v in graph.outputs}
        for name, array in graph.initializers.items():
            if self._slot[name] in read:  # shape-like constants were folded into their steps at compile time
                self._template[self._slot[name]] = self._tensor(array)
        self._input_slots = [self._slot[v] for v in graph.inputs]
        self._output_slots = [self._slot[v] for v in graph.outputs]
        self._plan_frees()

    # ----- running ------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any]) -> list[torch.Tensor]:
        """Outputs (in `graph.outputs` order) for `feeds`: input name -> ndarray or tensor."""
        import torch

        with torch.inference_mode():
            return self._execute([self._input(v, feeds) for v in self.graph.inputs])

    def bind(self, feeds: Mapping[str, Any] | None = None, *, seed: int = 0, cuda_graph: bool = False) -> BoundRun:
        """A no-argument runner over fixed device inputs (`feeds`, or seeded random ones).

        With `cuda_graph` on a CUDA device the graph is warmed up on a side stream, captured once, and
        each call replays the capture.
        """
        import torch

        if feeds is None:
            from xrl.cost.ort import random_inputs

            feeds = random_inputs(self.graph, seed)
        with torch.inference_mode():
            inputs = [self._input(v, feeds) for v in self.graph.inputs]
        if not (cuda_graph and self.device.type == "cuda"):
            def eager() -> list[torch.Tensor]:
                with torch.inference_mode():
                    return self._execute(inputs)

            return BoundRun(eager, self.device.type, keep=inputs)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(3):  # warm-up outside capture: lazy inits (cuBLAS handles, workspaces) happen here
                self._execute(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(captured):
            static_out = self._execute(inputs)

        def replay() -> list[torch.Tensor]:
            captured.replay()
            return static_out

        return BoundRun(replay, "cuda", captured, keep=[inputs, static_out])

    def _execute(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env = list(self._template)
        for s, t in zip(self._input_slots, inputs):
            env[s] = t
        for st in self._steps:
            res = st.fn(*[env[i] for i in st.operands])
            if len(st.outputs) == 1:
                env[st.outputs[0]] = res
            else:
                for s, r in zip(st.outputs, res):
                    env[s] = r
            for s in st.frees:
                env[s] = None
        return [env[s] for s in self._output_slots]

    def _input(self, name: str, feeds: Mapping[str, Any]) -> torch.Tensor:
        import torch

        if name not in feeds:
            raise XrlError(f"no value fed for graph input {name!r}; feed every input: {', '.join(self.graph.inputs)}")
        v = feeds[name]
        if not isinstance(v, torch.Tensor):
            a = np.asarray(v)  # (ascontiguousarray would turn a 0-d feed into 1-d)
            v = torch.from_numpy(a if a.flags.c_contiguous else a.copy())
        t = v
        return t.to(self.device, self._dtype_of(self.graph.type_of(name).dtype))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        import torch

        t = torch.from_numpy(np.array(array))  # a writable copy: graph weights are read-only views
        return t.to(self.device, self._dtype_of(np.dtype(array.dtype).name))

    def _dtype_of(self, name: str) -> torch.dtype:
        return self.dtype if name == "float32" else torch_dtype(name)

    def _plan_frees(self) -> None:
        keep = set(self._output_slots)
        keep.update(i for i, t in enumerate(self._template) if t is not None)
        last: dict[int, int] = {}
        for k, st in enumerate(self._steps):
            for s in st.operands:
                last[s] = k
            for s in st.outputs:
                last.setdefault(s, k)  # an output nobody reads dies at once
        frees: dict[int, list[int]] = {}
        for s, k in last.items():
            if s not in keep and s not in self._input_slots:
                frees.setdefault(k, []).append(s)
        for k, st in enumerate(self._steps):
            st.frees = tuple(sorted(frees.get(k, ())))

    # ----- compiling ----------------------------------------------------------------------------
    def _compile(self, node: Node) -> _Step:
        if not is_known(node.op, node.domain):
            where = f"{node.domain}::" if node.domain else ""
            raise UnsupportedOpError(f"the torch executor cannot run opaque op {where}{node.op} (node {node.name!r}); "
                                     f"use onnxruntime (cost model 'e2e' with engine='ort', or 'ort')")
        builder = getattr(self, f"_op_{node.op}", None)
        if builder is not None:
            fn, positions = builder(node)
        elif node.op in _TORCH_FUNCTIONS:
            fn, positions = _torch_function(*_TORCH_FUNCTIONS[node.op])
        else:
            raise UnsupportedOpError(f"the torch executor has no lowering for {node.op} (node {node.name!r})")
        return _Step(fn, tuple(self._slot[node.inputs[i]] for i in positions),
                     tuple(self._slot[v] for v in node.outputs))

    # helpers for builders
    def _const(self, node: Node, i: int) -> np.ndarray | None:
        """The constant value of input i (None when absent); an activation there is unsupported."""
        if i >= len(node.inputs) or not node.inputs[i]:
            return None
        c = self.graph.const_value(node.inputs[i])
        if c is None:
            raise UnsupportedOpError(f"node {node.name!r} ({node.op}): input {i} must be a constant (a weight)")
        return c

    def _ints(self, node: Node, i: int) -> list[int] | None:
        c = self._const(node, i)
        return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]

    def _out_shape(self, node: Node, k: int = 0) -> tuple[int, ...]:
        return self.graph.type_of(node.outputs[k]).shape

    def _rank(self, node: Node, i: int = 0) -> int:
        return self.graph.type_of(node.inputs[i]).rank

    def _present(self, node: Node, *positions: int) -> list[int]:
        return [i for i in positions if i < len(node.inputs) and node.inputs[i]]

    # compute
    def _op_Conv(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        w = self.graph.type_of(node.inputs[1])
        k = w.rank - 2
        if not 1 <= k <= 3:
            raise UnsupportedOpError(f"node {node.name!r}: only 1-3 spatial dimensions are supported")
        strides = tuple(node.attr("strides", (1,) * k))
        dil = tuple(node.attr("dilations", (1,) * k))
        group = node.attr("group", 1)
        x_shape = self.graph.type_of(node.inputs[0]).shape
        begin, end = _explicit_pads(node, x_shape[2:], w.shape[2:], strides, dil)
        conv = (F.conv1d, F.conv2d, F.conv3d)[k - 1]
        padding, pre = (begin, None) if begin == end else ((0,) * k, _torch_pad(begin, end))
        act = _activation(node.attr("activation"))
        positions = self._present(node, 0, 1, 2)

        def fn(x, weight, bias=None):
            if pre is not None:
                x = F.pad(x, pre)
            y = conv(x, weight, bias, strides, padding, dil, group)
            return act(y) if act else y

        return fn, positions

    def _op_MatMul(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        act = _activation(node.attr("activation"))
        if act is None:
            return torch.matmul, [0, 1]
        return (lambda a, b: act(torch.matmul(a, b))), [0, 1]

    def _op_Gemm(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
        ta, tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
        act = _activation(node.attr("activation"))
        positions = self._present(node, 0, 1, 2)

        def fn(a, b, c=None):
            a = a.t() if ta else a
            b = b.t() if tb else b
            if c is None:
                y = torch.matmul(a, b)
                y = y * alpha if alpha != 1.0 else y
            else:
                y = torch.addmm(c, a, b, beta=beta, alpha=alpha)  # one fused kernel, as a deployment runs it
            return act(y) if act else y

        return fn, positions

    # normalisation, softmax, pooling, reductions
    def _op_Softmax(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        axis = node.attr("axis", -1)
        return (lambda x: torch.softmax(x, axis)), [0]

    def _op_LayerNormalization(self, node: Node) -> tuple[Callable, list[int]]:
        import torch
        import torch.nn.functional as F

        rank = self._rank(node)
        axis = node.attr("axis", -1) % rank
        eps = float(node.attr("epsilon", 1e-5))
        norm_shape = self.graph.type_of(node.inputs[0]).shape[axis:]
        positions = self._present(node, 0, 1, 2)
        dims = tuple(range(axis, rank))
        extra = len(node.outputs) > 1

        def fn(x, scale=None, bias=None):
            if scale is not None and tuple(scale.shape) != norm_shape:
                scale = scale.expand(norm_shape)
            if bias is not None and tuple(bias.shape) != norm_shape:
                bias = bias.expand(norm_shape)
            y = F.layer_norm(x, norm_shape, scale, bias, eps)
            if not extra:
                return y
            xf = x.float()
            mean = xf.mean(dim=dims, keepdim=True)
            inv_std = torch.rsqrt(xf.var(dim=dims, unbiased=False, keepdim=True) + eps)
            return (y, mean, inv_std)[: len(node.outputs)]

        return fn, positions

    # onnxruntime's contrib ops: the same semantics as their numpy kernels in xrl/ir/execute.py
    def _op_SimplifiedLayerNormalization(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        rank = self._rank(node)
        dims = tuple(range(node.attr("axis", -1) % rank, rank))
        eps = float(node.attr("epsilon", 1e-5))
        stats = len(node.outputs) > 1

        def fn(x, scale):
            inv = torch.rsqrt(x.float().pow(2).mean(dim=dims, keepdim=True) + eps)
            y = (x * inv.to(x.dtype)) * scale
            return (y, inv) if stats else y

        return fn, [0, 1]

    def _op_SkipSimplifiedLayerNormalization(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        eps = float(node.attr("epsilon", 1e-12))
        n_out = len(node.outputs)

        def fn(x, skip, gamma, bias=None):
            total = x + skip if bias is None else x + skip + bias
            inv = torch.rsqrt(total.float().pow(2).mean(dim=-1, keepdim=True) + eps)
            y = (total * inv.to(total.dtype)) * gamma
            # onnxruntime writes no mean for an RMSNorm: zeros, as the numpy kernel does
            return y if n_out == 1 else (y, torch.zeros_like(inv), inv, total)[:n_out]

        return fn, self._present(node, 0, 1, 2, 3)

    def _op_RotaryEmbedding(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        interleaved = bool(node.attr("interleaved", 0))

        def fn(x, pos, cos, sin):
            s, d = x.shape[2], x.shape[3]
            positions = pos.reshape(1, 1) + torch.arange(s, device=x.device) if pos.numel() == 1 else pos
            c, n = cos[positions][:, None], sin[positions][:, None]  # (batch, 1, sequence, head size / 2)
            if interleaved:
                x1, x2 = x[..., 0::2], x[..., 1::2]
                return torch.stack([x1 * c - x2 * n, x2 * c + x1 * n], dim=-1).reshape(x.shape)
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return torch.cat([x1 * c - x2 * n, x2 * c + x1 * n], dim=-1)

        return fn, [0, 1, 2, 3]

    def _op_MultiHeadAttention(self, node: Node) -> tuple[Callable, list[int]]:
        import torch
        import torch.nn.functional as F

        heads = node.attr("num_heads")
        scale = float(node.attr("scale", 0.0)) or None  # None: SDPA's 1 / sqrt(head size), as onnxruntime
        causal = bool(node.attr("unidirectional", 0))
        fill = float(node.attr("mask_filter_value", -10000.0))
        positions = self._present(node, 0, 1, 2, 3, 4, 5)
        optional = [i for i in positions if i >= 3]

        def fn(q, k, v, *rest):
            given = dict(zip(optional, rest))
            if 3 in given:
                hq, hk = q.shape[2], k.shape[2]
                bias = given[3]
                q, k, v = q + bias[:hq], k + bias[hq: hq + hk], v + bias[hq + hk:]
            split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)  # noqa: E731
            mask = given.get(5)
            if 4 in given:  # mask_filter_value where the key is padding
                pad = torch.where(given[4][:, None, None, :] == 0, fill, 0.0).to(q.dtype)
                mask = pad if mask is None else mask + pad
            if causal and mask is not None:  # SDPA takes a mask or is_causal, not both
                s, kv = q.shape[1], k.shape[1]
                later = torch.ones(s, kv, dtype=torch.bool, device=q.device).triu(1)
                mask = mask + torch.zeros(s, kv, dtype=q.dtype, device=q.device).masked_fill(later, float("-inf"))
            out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask,
                                                 is_causal=causal and mask is None, scale=scale)
            return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)

        return fn, positions

    def _op_GroupQueryAttention(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        heads, kv_heads = node.attr("num_heads"), node.attr("kv_num_heads")
        scale = float(node.attr("scale", 0.0)) or None  # None: SDPA's 1 / sqrt(head size), as onnxruntime
        n_out = len(node.outputs)

        def fn(q, k, v):
            b, s = q.shape[0], q.shape[1]
            split = lambda t, n: t.reshape(b, s, n, -1).transpose(1, 2)  # noqa: E731
            kh, vh = split(k, kv_heads), split(v, kv_heads)
            group = heads // kv_heads  # query head h reads key/value head h // group
            out = F.scaled_dot_product_attention(split(q, heads), kh.repeat_interleave(group, dim=1),
                                                 vh.repeat_interleave(group, dim=1), is_causal=True, scale=scale)
            out = out.transpose(1, 2).reshape(b, s, -1)
            return out if n_out == 1 else (out, kh, vh)

        return fn, [0, 1, 2]  # no past; seqlens_k and total_sequence_length only restate the sequence

    def _op_BatchNormalization(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        eps = float(node.attr("epsilon", 1e-5))
        return (lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, eps)), [0, 1, 2, 3, 4]

    def _op_MaxPool(self, node: Node) -> tuple[Callable, list[int]]:
        return self._pool(node, "max")

    def _op_AveragePool(self, node: Node) -> tuple[Callable, list[int]]:
        return self._pool(node, "avg")

    def _pool(self, node: Node, kind: str) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        if len(node.outputs) > 1:
            raise UnsupportedOpError(f"node {node.name!r}: MaxPool's Indices output is not supported")
        ks = tuple(node.attr("kernel_shape"))
        k = len(ks)
        if not 1 <= k <= 3:
            raise UnsupportedOpError(f"node {node.name!r}: only 1-3 spatial dimensions are supported")
        strides = tuple(node.attr("strides", (1,) * k))
        dil = tuple(node.attr("dilations", (1,) * k))
        ceil = bool(node.attr("ceil_mode", 0))
        x_shape = self.graph.type_of(node.inputs[0]).shape
        begin, end = _explicit_pads(node, x_shape[2:], ks, strides, dil)
        # torch pads symmetrically and at most half a kernel; anything else is padded explicitly first.
        native = begin == end and all(p <= kk // 2 for p, kk in zip(begin, ks))
        padding = begin if native else (0,) * k
        pre = None if native else _torch_pad(begin, end)
        if kind == "max":
            pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[k - 1]

            def max_fn(x):
                if pre is not None:
                    x = F.pad(x, pre, value=-math.inf)
                return pool(x, ks, strides, padding, dil, ceil_mode=ceil)

            return max_fn, [0]
        if any(d != 1 for d in dil):
            raise UnsupportedOpError(f"node {node.name!r}: dilated AveragePool is not supported")
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[k - 1]
        include_pad = bool(node.attr("count_include_pad", 0))

        def avg_fn(x):
            if pre is None:
                return pool(x, ks, strides, padding, ceil_mode=ceil, count_include_pad=include_pad)
            y = pool(F.pad(x, pre), ks, strides, 0, ceil_mode=ceil, count_include_pad=True)
            if include_pad:
                return y
            # Excluding padding: divide by the fraction of each window that lies inside the input.
            ones = F.pad(x.new_ones((1, 1, *x.shape[2:])), pre)
            return y / pool(ones, ks, strides, 0, ceil_mode=ceil, count_include_pad=True)

        return avg_fn, [0]

    def _op_GlobalAveragePool(self, node: Node) -> tuple[Callable, list[int]]:
        dims = tuple(range(2, self._rank(node)))
        return (lambda x: x.mean(dim=dims, keepdim=True)), [0]

    def _op_GlobalMaxPool(self, node: Node) -> tuple[Callable, list[int]]:
        dims = tuple(range(2, self._rank(node)))
        return (lambda x: x.amax(dim=dims, keepdim=True)), [0]

    def _reduce_axes(self, node: Node) -> tuple[tuple[int, ...] | None, bool]:
        """A Reduce* node's reduced dims (sorted; None: empty axes with noop_with_empty_axes) and keepdims."""
        rank = self._rank(node)
        axes = node.attr("axes")
        if axes is None:
            axes = self._ints(node, 1)
        keep = bool(node.attr("keepdims", 1))
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return None, keep
            axes = list(range(rank))
        return tuple(sorted({a % rank for a in axes})), keep

    def _reduce(self, node: Node, method: str) -> tuple[Callable, list[int]]:
        dims, keep = self._reduce_axes(node)
        if dims is None:
            return (lambda x: x), [0]
        return (lambda x: getattr(x, method)(dim=dims, keepdim=keep)), [0]

    def _op_ReduceMean(self, node: Node) -> tuple[Callable, list[int]]:
        return self._reduce(node, "mean")

    def _op_ReduceSum(self, node: Node) -> tuple[Callable, list[int]]:
        return self._reduce(node, "sum")

    def _op_ReduceMax(self, node: Node) -> tuple[Callable, list[int]]:
        return self._reduce(node, "amax")

    def _op_ReduceMin(self, node: Node) -> tuple[Callable, list[int]]:
        return self._reduce(node, "amin")

    def _op_ReduceProd(self, node: Node) -> tuple[Callable, list[int]]:
        dims, keep = self._reduce_axes(node)
        if dims is None:
            return (lambda x: x), [0]

        def prod(x):  # torch.prod takes one dim at a time: the last first, so the others keep their index
            for d in reversed(dims):
                x = x.prod(dim=d, keepdim=keep, dtype=x.dtype)  # torch widens ints to int64; ONNX does not
            return x

        return prod, [0]

    # data movement
    def _op_Concat(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        axis = node.attr("axis")
        return (lambda *xs: torch.cat(xs, axis)), self._present(node, *range(len(node.inputs)))

    def _op_Split(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        rank = self._rank(node)
        axis = node.attr("axis", 0) % rank
        sizes = [self._out_shape(node, k)[axis] for k in range(len(node.outputs))]  # shape inference decided
        return (lambda x: tuple(t.contiguous() for t in torch.split(x, sizes, axis))), [0]

    def _op_Slice(self, node: Node) -> tuple[Callable, list[int]]:
        shape = self.graph.type_of(node.inputs[0]).shape
        bounds = slice_bounds(node, shape, self._ints(node, 1), self._ints(node, 2), self._ints(node, 3),
                              self._ints(node, 4))
        flips, index = [], [slice(None)] * len(shape)
        for a, start, stop, step in bounds:
            count = len(range(start, stop, step))
            if step < 0:  # torch has no negative steps: flip the axis and walk it forwards
                flips.append(a)
                start = shape[a] - 1 - start
                step = -step
            index[a] = slice(start, start + (count - 1) * step + 1 if count else start, step)
        idx = tuple(index)

        def fn(x):
            if flips:
                x = x.flip(flips)
            return x[idx].contiguous()

        return fn, [0]

    def _reshape(self, node: Node) -> tuple[Callable, list[int]]:
        shape = self._out_shape(node)
        return (lambda x: x.reshape(shape)), [0]

    _op_Reshape = _op_Flatten = _op_Squeeze = _op_Unsqueeze = _reshape

    def _op_Identity(self, node: Node) -> tuple[Callable, list[int]]:
        return (lambda x: x), [0]

    def _op_Dropout(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        if len(node.outputs) == 1:
            return (lambda x: x), [0]
        return (lambda x: (x, torch.ones_like(x, dtype=torch.bool))), [0]

    def _op_Constant(self, node: Node) -> tuple[Callable, list[int]]:
        value = self._tensor(node.attr("value"))
        return (lambda: value), []

    def _op_Transpose(self, node: Node) -> tuple[Callable, list[int]]:
        perm = node.attr("perm")
        perm = tuple(perm) if perm is not None else tuple(reversed(range(self._rank(node))))
        return (lambda x: x.permute(perm).contiguous()), [0]

    def _op_Expand(self, node: Node) -> tuple[Callable, list[int]]:
        shape = self._out_shape(node)
        return (lambda x: x.expand(shape).contiguous()), [0]

    def _op_Pad(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        rank = self._rank(node)
        pads = node.attr("pads") or self._ints(node, 1)
        cval = self._const(node, 2)
        value = float(node.attr("value", 0.0))  # opset < 11 attribute; later opsets: input 2
        if cval is not None and cval.size:
            value = float(np.asarray(cval).reshape(-1)[0])
        axes = self._ints(node, 3)
        axes = [a % rank for a in axes] if axes is not None else list(range(rank))
        full_begin, full_end = [0] * rank, [0] * rank
        for i, a in enumerate(axes):
            full_begin[a], full_end[a] = pads[i], pads[i + len(axes)]
        first = next((a for a in range(rank) if full_begin[a] or full_end[a]), rank)
        spec = _torch_pad(full_begin[first:], full_end[first:])  # F.pad wants the trailing dims only
        mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(
            node.attr("mode", "constant"))
        if mode is None:
            raise UnsupportedOpError(f"node {node.name!r}: Pad mode {node.attr('mode')!r} is not supported")
        if mode == "constant":
            return (lambda x: F.pad(x, spec, value=value)), [0]
        return (lambda x: F.pad(x, spec, mode=mode)), [0]

    # elementwise with attributes or constant operands
    def _op_Clip(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        lo, hi = node.attr("min"), node.attr("max")  # opset < 11 attributes
        positions = [0]
        bounds: list[Any] = [lo, hi]
        for k, i in enumerate((1, 2)):
            if i < len(node.inputs) and node.inputs[i]:
                c = self.graph.const_value(node.inputs[i])
                if c is None:
                    positions.append(i)
                    bounds[k] = "tensor"
                else:
                    bounds[k] = np.asarray(c).reshape(-1)[0].item()

        def fn(x, *ts):
            it = iter(ts)
            lo_v, hi_v = (next(it) if b == "tensor" else b for b in bounds)
            return torch.clamp(x, lo_v, hi_v)

        return fn, positions

    def _op_Cast(self, node: Node) -> tuple[Callable, list[int]]:
        to = self._dtype_of(node.attr("to"))
        return (lambda x: x.to(to)), [0]

    def _op_Gelu(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        approximate = node.attr("approximate", "none")
        return (lambda x: F.gelu(x, approximate=approximate)), [0]

    def _op_LeakyRelu(self, node: Node) -> tuple[Callable, list[int]]:
        import torch.nn.functional as F

        alpha = float(node.attr("alpha", 0.01))
        return (lambda x: F.leaky_relu(x, alpha)), [0]

    def _op_HardSigmoid(self, node: Node) -> tuple[Callable, list[int]]:
        alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
        return (lambda x: (x * alpha + beta).clamp_(0.0, 1.0)), [0]

    def _op_Div(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        if np.issubdtype(np.dtype(self.graph.type_of(node.outputs[0]).dtype), np.integer):
            return (lambda a, b: torch.div(a, b, rounding_mode="trunc")), [0, 1]  # ONNX integer division truncates
        return torch.div, [0, 1]

    def _op_Max(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        return (lambda *xs: functools.reduce(torch.maximum, xs)), self._present(node, *range(len(node.inputs)))

    def _op_Min(self, node: Node) -> tuple[Callable, list[int]]:
        import torch

        return (lambda *xs: functools.reduce(torch.minimum, xs)), self._present(node, *range(len(node.inputs)))


# Ops that are one torch function of their first `arity` inputs: op -> (function name, arity).
_TORCH_FUNCTIONS: dict[str, tuple[str, int]] = {
    "Add": ("add", 2), "Sub": ("sub", 2), "Mul": ("mul", 2), "Pow": ("pow", 2), "Equal": ("eq", 2),
    "Less": ("lt", 2), "Greater": ("gt", 2), "Where": ("where", 3), "Relu": ("relu", 1), "Sigmoid": ("sigmoid", 1),
    "Tanh": ("tanh", 1), "Erf": ("erf", 1), "Exp": ("exp", 1), "Log": ("log", 1), "Sqrt": ("sqrt", 1),
    "Reciprocal": ("reciprocal", 1), "Neg": ("neg", 1), "Abs": ("abs", 1), "Softplus": ("softplus", 1),
    "Not": ("logical_not", 1), "And": ("logical_and", 2), "Or": ("logical_or", 2), "IsNaN": ("isnan", 1),
}


def _torch_function(name: str, arity: int) -> tuple[Callable, list[int]]:
    import torch
    import torch.nn.functional as F

    return getattr(torch, name, None) or getattr(F, name), list(range(arity))


def _activation(name: str | None) -> Callable | None:
    """The fused activation of a Conv/MatMul/Gemm, applied in place to the op's fresh output."""
    if name is None:
        return None
    import torch.nn.functional as F

    acts = {"Relu": lambda y: y.relu_(), "Sigmoid": lambda y: y.sigmoid_(), "Tanh": lambda y: y.tanh_(),
            "Gelu": F.gelu}
    if name not in acts:
        raise UnsupportedOpError(f"fused activation {name!r} is not supported")
    return acts[name]


def _explicit_pads(node: Node, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                   dil: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begin, end) padding per spatial axis, resolving ONNX auto_pad."""
    k = len(kernel)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(k):
            eff = (kernel[i] - 1) * dil[i] + 1
            total = max((math.ceil(spatial[i] / strides[i]) - 1) * strides[i] + eff - spatial[i], 0)
            small = total // 2
            b, e = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
            begin.append(b)
            end.append(e)
        return tuple(begin), tuple(end)
    if auto == "VALID":
        return (0,) * k, (0,) * k
    pads = tuple(node.attr("pads", (0,) * (2 * k)))
    return pads[:k], pads[k:]


def _torch_pad(begin: Sequence[int], end: Sequence[int]) -> tuple[int, ...]:
    """F.pad's argument: (begin, end) pairs from the last axis backwards."""
    return tuple(p for i in reversed(range(len(begin))) for p in (begin[i], end[i]))

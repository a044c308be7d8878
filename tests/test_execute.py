"""The float64 reference executor against onnxruntime, one op at a time, on random inputs."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from xrl.ir import Graph, Node, TensorType
from xrl.ir.execute import ExecutionError, execute
from xrl.ir.ops import OPS, infer_node, onnx_domain

RNG_SEED = 0


@dataclass
class Case:
    """One node: `inputs` are shapes (random activations) or arrays (weights). `ir_attrs` are the IR's
    attributes; ONNX gets `onnx_attrs` (default: the same) and `onnx_consts` appended as weight inputs."""

    op: str
    inputs: list[Any]
    ir_attrs: dict = field(default_factory=dict)
    onnx_attrs: dict | None = None
    onnx_consts: list[np.ndarray] = field(default_factory=list)
    outputs: int = 1
    opset: int = 17
    positive: bool = False  # inputs drawn > 0 (Log, Sqrt, Pow)
    onnx_op: str | None = None
    tag: str = ""

    @property
    def id(self) -> str:
        return f"{self.op}{'-' + self.tag if self.tag else ''}"


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _f(shape: tuple[int, ...], seed: int = 1, positive: bool = False) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


CASES = [
    *(Case(op, [(2, 3, 4)], tag="") for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Softplus")),
    Case("Log", [(2, 3, 4)], positive=True),
    Case("Sqrt", [(2, 3, 4)], positive=True),
    Case("Reciprocal", [(2, 3, 4)], positive=True),
    Case("LeakyRelu", [(2, 3, 4)], {"alpha": 0.2}),
    Case("HardSigmoid", [(2, 3, 4)], {"alpha": 0.3, "beta": 0.4}),
    Case("Gelu", [(2, 3, 4)], opset=20),
    Case("Gelu", [(2, 3, 4)], {"approximate": "tanh"}, opset=20, tag="tanh"),
    *(Case(op, [(2, 3, 4), (3, 1)]) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")),
    Case("Pow", [(2, 3), (3,)], positive=True),
    Case("Where", [np.array([[True, False, True]]), (2, 3), (2, 3)]),
    Case("Clip", [(2, 5)], onnx_consts=[np.array(-0.5, np.float32), np.array(0.7, np.float32)],
         ir_attrs={"min": -0.5, "max": 0.7}, onnx_attrs={}),
    Case("Cast", [(2, 3)], {"to": "float64"}, {"to": onnx.TensorProto.DOUBLE}),
    Case("Identity", [(2, 3)]),
    Case("Conv", [(2, 3, 9, 8), _f((4, 3, 3, 3))]),
    Case("Conv", [(2, 3, 9, 8), _f((4, 3, 3, 3)), _f((4,))], {"strides": (2, 1), "pads": (1, 0, 2, 1),
                                                            "dilations": (1, 2)}, tag="bias-stride-pad-dil"),
    Case("Conv", [(1, 6, 7, 7), _f((4, 3, 3, 3))], {"group": 2, "pads": (1, 1, 1, 1)}, tag="group"),
    Case("Conv", [(1, 4, 7, 7), _f((4, 1, 3, 3))], {"group": 4, "auto_pad": "SAME_UPPER", "strides": (2, 2)},
         tag="depthwise-same"),
    Case("Conv", [(2, 3, 10), _f((5, 3, 4))], {"strides": (3,)}, tag="1d"),
    Case("MatMul", [(2, 3, 4), (4, 5)]),
    Case("MatMul", [(2, 1, 3, 4), (5, 4, 2)], tag="batch-broadcast"),
    Case("Gemm", [(3, 4), (5, 4), (5,)], {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    Case("Gemm", [(4, 3), (4, 5), (3, 5)], {"transA": 1}, tag="transA"),
    Case("Softmax", [(2, 3, 4)], {"axis": 1}),
    Case("LayerNormalization", [(2, 3, 4), _f((4,)), _f((4,))], {"epsilon": 1e-3}),
    Case("LayerNormalization", [(2, 3, 4), _f((3, 4)), _f((3, 4))], {"axis": 1}, tag="axis1"),
    Case("SimplifiedLayerNormalization", [(2, 3, 4), _f((4,))], {"axis": -1, "epsilon": 1e-6}, outputs=2),
    Case("SkipSimplifiedLayerNormalization", [(2, 3, 4), (2, 3, 4), _f((4,)), _f((4,), seed=2)], {"epsilon": 1e-5},
         outputs=4),
    Case("RotaryEmbedding", [(1, 2, 5, 8), _i64(1), _f((6, 4)), _f((6, 4), seed=2)], {"interleaved": 0}),
    Case("RotaryEmbedding", [(1, 2, 5, 8), _i64(0), _f((6, 4)), _f((6, 4), seed=2)], {"interleaved": 1},
         tag="interleaved"),
    Case("MultiHeadAttention", [(2, 5, 12), (2, 7, 12), (2, 7, 12), _f((36,))], {"num_heads": 3}),
    Case("MultiHeadAttention", [(2, 5, 12), (2, 5, 12), (2, 5, 12)], {"num_heads": 2, "unidirectional": 1,
                                                                       "scale": 0.3}, tag="causal"),
    Case("MultiHeadAttention", [(2, 5, 12), (2, 7, 12), (2, 7, 12), _f((36,)),
                                np.array([[1, 1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1, 0]], np.int32), _f((1, 3, 5, 7))],
         {"num_heads": 3, "mask_filter_value": -1e4}, tag="masks"),
    Case("GroupQueryAttention", [(2, 5, 64), (2, 5, 32), (2, 5, 32), np.zeros((2, 2, 0, 16), np.float32),
                                 np.zeros((2, 2, 0, 16), np.float32), np.array([4, 4], np.int32),
                                 np.array(5, np.int32)], {"num_heads": 4, "kv_num_heads": 2}, outputs=3),
    Case("GroupQueryAttention", [(1, 6, 32), (1, 6, 8), (1, 6, 8), np.zeros((1, 1, 0, 8), np.float32),
                                 np.zeros((1, 1, 0, 8), np.float32), np.array([5], np.int32),
                                 np.array(6, np.int32)], {"num_heads": 4, "kv_num_heads": 1, "scale": 0.3},
         tag="group4-scale"),
    Case("BatchNormalization", [(2, 3, 4, 5), _f((3,)), _f((3,)), _f((3,)), _f((3,), positive=True)],
         {"epsilon": 1e-3}),
    Case("MaxPool", [(1, 2, 7, 7)], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    Case("MaxPool", [(1, 2, 8, 8)], {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}, tag="ceil"),
    Case("AveragePool", [(1, 2, 7, 7)], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
         tag="exclude-pad"),
    Case("AveragePool", [(1, 2, 7, 7)], {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1), "count_include_pad": 1},
         tag="include-pad"),
    Case("AveragePool", [(1, 2, 8, 8)], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1),
                                         "ceil_mode": 1, "count_include_pad": 1}, tag="ceil-include-pad"),
    Case("AveragePool", [(1, 2, 8, 8)], {"kernel_shape": (2, 2), "strides": (3, 3), "ceil_mode": 1}, tag="ceil"),
    Case("GlobalAveragePool", [(2, 3, 4, 5)]),
    Case("GlobalMaxPool", [(2, 3, 4, 5)]),
    Case("ReduceMean", [(2, 3, 4)], {"axes": (1,), "keepdims": 0}),
    Case("ReduceMax", [(2, 3, 4)], {"axes": (0, 2)}),
    Case("ReduceMin", [(2, 3, 4)], {"axes": (-1,)}),
    Case("ReduceSum", [(2, 3, 4)], {"axes": (1, 2), "keepdims": 1}, {"keepdims": 1}, [_i64(1, 2)]),
    Case("Concat", [(2, 3), (2, 4)], {"axis": 1}),
    Case("Split", [(2, 7)], {"axis": 1, "split": (3, 4)}, {"axis": 1}, [_i64(3, 4)], outputs=2),
    Case("Split", [(6, 2)], {"axis": 0}, outputs=3, tag="equal"),
    Case("Slice", [(4, 10), _i64(1, -8), _i64(3, 100), _i64(0, 1), _i64(1, 3)]),
    Case("Slice", [(5, 6), _i64(-1), _i64(-100), _i64(1), _i64(-2)], tag="negative-step"),
    Case("Reshape", [(2, 3, 4), _i64(0, -1, 2)]),
    Case("Flatten", [(2, 3, 4)], {"axis": 2}),
    Case("Squeeze", [(2, 1, 3, 1)], {"axes": (1, -1)}, {}, [_i64(1, -1)]),
    Case("Unsqueeze", [(2, 3)], {"axes": (0, -1)}, {}, [_i64(0, -1)]),
    Case("Transpose", [(2, 3, 4)], {"perm": (2, 0, 1)}),
    Case("Transpose", [(2, 3, 4)], tag="default"),
    Case("Pad", [(2, 3), _i64(1, 0, 2, 3), np.array(1.5, np.float32)]),
    Case("Pad", [(2, 5), _i64(0, -1, 1, -2)], tag="crop"),
    Case("Pad", [(2, 3, 4), _i64(0, 1, 2, 0, 1, 2)], {"mode": "reflect"}, onnx_consts=[], tag="reflect"),
    Case("Expand", [(3, 1), _i64(2, 3, 4)]),
    Case("Equal", [np.array([1, 2, 3]), np.array([1, 0, 3])]),
    Case("Less", [(2, 3), (3,)]),
    Case("Greater", [(2, 3), (3,)]),
    Case("Dropout", [(2, 3)]),
    Case("ReduceProd", [(2, 3, 4)], {"axes": (0, 2), "keepdims": 0}),
    Case("ReduceProd", [np.array([[1, -2, 3], [4, 5, -1]], np.int64)], {"axes": (1,)}, {}, [_i64(1)], opset=18,
         tag="int64-axes-input"),
    Case("Not", [np.array([[True, False, True], [False, False, True]])]),
    Case("IsNaN", [np.array([[1.0, np.nan, -np.inf], [np.nan, 0.0, 2.5]], np.float32)]),
    Case("And", [np.array([[True, False, True], [False, True, True]]), np.array([True, True, False])]),
    Case("Or", [np.array([[True, False, True], [False, False, False]]), np.array([[False], [True]])]),
]


def _onnx_model(case: Case, names: list[str], arrays: dict[str, np.ndarray], outs: dict[str, TensorType]
                ) -> onnx.ModelProto:
    consts = [(f"c{i}", a) for i, a in enumerate(case.onnx_consts)]
    attrs = case.ir_attrs if case.onnx_attrs is None else case.onnx_attrs
    domain = onnx_domain(case.op)  # onnxruntime's contrib ops (com.microsoft)
    node = helper.make_node(case.onnx_op or case.op, names + [n for n, _ in consts], list(outs), domain=domain or None,
                            **attrs)
    feeds_info = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                  for n, a in arrays.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in consts]
    out_info = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), None)
                for o, t in outs.items()]
    g = helper.make_graph([node], "t", feeds_info, out_info, initializer=inits)
    opsets = [helper.make_opsetid("", case.opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def _case_graph(case: Case) -> tuple[Graph, list[str], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The case's one-node graph, its input names, activations (fed) and weights."""
    rng = np.random.default_rng(RNG_SEED)
    names, arrays, weights, types = [], {}, {}, {}
    for i, spec in enumerate(case.inputs):
        name = f"in{i}"
        if isinstance(spec, tuple):
            a = rng.standard_normal(spec).astype(np.float32)
            if case.positive:
                a = np.abs(a) + 0.5
            arrays[name] = a
        else:
            weights[name] = spec
        names.append(name)
        types[name] = TensorType.of(arrays.get(name, weights.get(name)))
    outs = [f"out{i}" for i in range(case.outputs)]
    node = Node("n", case.op, tuple(names), tuple(outs), case.ir_attrs)
    probe = Graph([], list(arrays), [], types, weights)
    for o, t in zip(outs, infer_node(node, probe)):
        types[o] = t
    return Graph([node], list(arrays), outs, types, weights).validate(), names, arrays, weights


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_onnxruntime(case: Case) -> None:
    graph, names, arrays, weights = _case_graph(case)
    outs, types = graph.outputs, graph.types
    got = execute(graph, arrays)

    # ONNX sees weights as graph inputs too (its initializers are the case's extra constants).
    onnx_arrays = {**arrays, **weights}
    model = _onnx_model(case, names, onnx_arrays, {o: types[o] for o in outs})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, onnx_arrays)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w.astype(np.float64), rtol=2e-5, atol=2e-5)
        else:
            np.testing.assert_array_equal(g, w)


# onnxruntime's contrib ops: the torch executor (`--measure torch`, the `op` and `e2e` costs on a GPU) must
# run every op a rule can write, or a GPU search stops at the first fused candidate.
CONTRIB_CASES = [c for c in CASES if OPS[c.op].runtime == "onnxruntime"]


@pytest.mark.parametrize("case", CONTRIB_CASES, ids=[c.id for c in CONTRIB_CASES])
def test_torch_executor_computes_what_the_numpy_reference_computes(case: Case) -> None:
    from xrl.cost.torch_exec import TorchExecutor

    graph, _, arrays, _ = _case_graph(case)
    want = execute(graph, arrays)
    got = TorchExecutor(graph).run(arrays)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-5)


def test_every_registered_op_has_a_torch_lowering() -> None:
    from xrl.cost import torch_exec

    missing = [op for op in OPS if not hasattr(torch_exec.TorchExecutor, f"_op_{op}")
               and op not in torch_exec._TORCH_FUNCTIONS]
    assert not missing, missing


def test_every_registered_op_has_a_case() -> None:
    tested = {c.op for c in CASES}
    assert set(OPS) - tested <= {"Constant"}, sorted(set(OPS) - tested)


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh"])
def test_fused_activation_is_applied(act: str) -> None:
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5))
    w = np.random.default_rng(2).standard_normal((3, 2, 3, 3))
    types = {"x": TensorType.of(x), "w": TensorType.of(w), "y": TensorType((1, 3, 3, 3), "float64")}
    fused = Graph([Node("c", "Conv", ("x", "w"), ("y",), {"activation": act})], ["x"], ["y"], types, {"w": w})
    plain = Graph([Node("c", "Conv", ("x", "w"), ("t",)), Node("a", act, ("t",), ("y",))], ["x"], ["y"],
                  {**types, "t": types["y"]}, {"w": w})
    np.testing.assert_allclose(execute(fused, {"x": x})[0], execute(plain, {"x": x})[0], rtol=1e-12)


def test_constant_and_float64_weights() -> None:
    value = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    g = Graph([Node("c", "Constant", (), ("k",), {"value": value}), Node("a", "Add", ("x", "k"), ("y",))],
              ["x"], ["y"], {"x": TensorType((2, 3)), "k": TensorType((2, 3)), "y": TensorType((2, 3))})
    y = execute(g, {"x": np.zeros((2, 3), np.float32)})[0]
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, value.astype(np.float64))


def test_opaque_op_raises_a_clear_error() -> None:
    g = Graph([Node("m", "MyCustomOp", ("x",), ("y",), domain="com.example")], ["x"], ["y"],
              {"x": TensorType((2,)), "y": TensorType((2,))})
    with pytest.raises(ExecutionError, match="MyCustomOp"):
        execute(g, {"x": np.zeros(2)})


def test_missing_feed_raises() -> None:
    g = Graph([Node("r", "Relu", ("x",), ("y",))], ["x"], ["y"], {"x": TensorType((2,)), "y": TensorType((2,))})
    with pytest.raises(ExecutionError, match="no value fed"):
        execute(g, {})


def test_small_cnn_runs_fast() -> None:
    rng = np.random.default_rng(0)
    nodes, types, weights = [], {"x": TensorType((1, 3, 32, 32))}, {}
    x, c, hw = "x", 3, 32
    for i, cout in enumerate((16, 32, 64)):
        w = f"w{i}"
        weights[w] = rng.standard_normal((cout, c, 3, 3)).astype(np.float32)
        types[w] = TensorType.of(weights[w])
        y = f"y{i}"
        hw = (hw + 2 - 3) // 2 + 1
        nodes.append(Node(f"c{i}", "Conv", (x, w), (y,), {"pads": (1, 1, 1, 1), "strides": (2, 2),
                                                         "activation": "Relu"}))
        types[y] = TensorType((1, cout, hw, hw))
        x, c = y, cout
    g = Graph(nodes, ["x"], [x], types, weights).validate()
    feed = {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    execute(g, feed)
    times = []
    for _ in range(3):  # the best of three, and a generous bound: it catches a pathological slowdown only
        t0 = time.perf_counter()
        execute(g, feed)
        times.append(time.perf_counter() - t0)
    assert min(times) < 2.0
    assert math.isfinite(float(execute(g, feed)[0].sum()))

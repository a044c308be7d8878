"""Rules for what onnxruntime leaves: which patterns its own optimizer already removes, and that xrl's rules
remove the rest without changing what the model computes (checked under onnxruntime itself)."""

from __future__ import annotations

import io
import os
import tempfile
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine, load_rules

LEVELS = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
X = (1, 8, 16, 16)


def _model(nodes: list, inits: dict[str, np.ndarray], extra_inputs: dict[str, tuple] | None = None) -> onnx.ModelProto:
    ins = [h.make_tensor_value_info("x", TP.FLOAT, list(X))]
    ins += [h.make_tensor_value_info(k, TP.FLOAT, list(s)) for k, s in (extra_inputs or {}).items()]
    out = h.make_tensor_value_info("y", TP.FLOAT, None)
    graph = h.make_graph(nodes, "g", ins, [out], [nh.from_array(a, k) for k, a in inits.items()])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


PADS = _i64(0, 0, 1, 1, 0, 0, 1, 1)
NEG_INF = np.array(-np.inf, np.float32)

# name -> (model, (an op, how many of it onnxruntime's optimized model keeps), xrl's rule, the op the rule removes
# (None: it merges a pair into one)). Where the runtime keeps none (or merges the pair itself), xrl's rule is
# redundant for onnxruntime and only counts for other targets.
CASES = {
    "pad_conv": (_model([h.make_node("Pad", ["x", "p"], ["t"]), h.make_node("Conv", ["t", "w", "b"], ["y"])],
                        {"p": PADS, "w": _f32(8, 8, 3, 3), "b": _f32(8)}), ("Pad", 0), "fold_pad_conv", "Pad"),
    "pad_depthwise_conv": (_model([h.make_node("Pad", ["x", "p"], ["t"]),
                                   h.make_node("Conv", ["t", "w"], ["y"], group=8, strides=[2, 2])],
                                  {"p": _i64(0, 0, 0, 0, 0, 0, 1, 1), "w": _f32(8, 1, 3, 3)}),
                           ("Pad", 0), "fold_pad_conv", "Pad"),
    "pad_avgpool": (_model([h.make_node("Pad", ["x", "p"], ["t"]),
                            h.make_node("AveragePool", ["t"], ["y"], kernel_shape=[3, 3], count_include_pad=1)],
                           {"p": PADS}), ("Pad", 0), "fold_pad_avgpool", "Pad"),
    "pad_maxpool": (_model([h.make_node("Pad", ["x", "p", "v"], ["t"]),
                            h.make_node("MaxPool", ["t"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
                           {"p": _i64(0, 0, 0, 0, 0, 0, 1, 1), "v": NEG_INF}), ("Pad", 1), "fold_pad_maxpool", "Pad"),
    "relu_pad_maxpool": (_model([h.make_node("Relu", ["x"], ["r"]), h.make_node("Pad", ["r", "p"], ["t"]),
                                 h.make_node("MaxPool", ["t"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
                                {"p": _i64(0, 0, 1, 1, 0, 0, 1, 1)}), ("Pad", 1), "fold_pad_relu_maxpool", "Pad"),
    "expand_add": (_model([h.make_node("Expand", ["z", "s"], ["t"]), h.make_node("Add", ["x", "t"], ["y"])],
                          {"s": _i64(*X)}, {"z": (8, 1, 1)}), ("Expand", 1), "remove_expand_Add", "Expand"),
    "expand_sub_rhs": (_model([h.make_node("Expand", ["z", "s"], ["t"]), h.make_node("Sub", ["x", "t"], ["y"])],
                              {"s": _i64(*X)}, {"z": (8, 1, 1)}), ("Expand", 1), "remove_expand_rhs_Sub", "Expand"),
    "where_true_mask": (_model([h.make_node("Where", ["m", "x", "z"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                               {"m": np.ones(X, bool)}, {"z": (8, 1, 1)}), ("Where", 1), "remove_where_true", "Where"),
    "slice_whole": (_model([h.make_node("Slice", ["x", "st", "en", "ax"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                           {"st": _i64(0), "en": _i64(16), "ax": _i64(2)}), ("Slice", 1), "remove_slice_noop", "Slice"),
    "concat_single": (_model([h.make_node("Concat", ["x"], ["t"], axis=1), h.make_node("Relu", ["t"], ["y"])], {}),
                      ("Concat", 1), "remove_concat_single", "Concat"),
    # Patterns an older xrl rule already covers: what the runtime does with them.
    "transpose_cancel": (_model([h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                                 h.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
                                 h.make_node("Relu", ["u"], ["y"])], {}),
                         ("Transpose", 0), "transpose_cancel", "Transpose"),
    "reshape_reshape": (_model([h.make_node("Reshape", ["x", "s1"], ["t"]), h.make_node("Reshape", ["t", "s2"], ["y"])],
                               {"s1": _i64(8, 256), "s2": _i64(1, 8, 256)}), ("Reshape", 1), "reshape_reshape", None),
    "reshape_noop": (_model([h.make_node("Reshape", ["x", "s"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                            {"s": _i64(*X)}), ("Reshape", 1), "reshape_noop", "Reshape"),
    "squeeze_unsqueeze": (_model([h.make_node("Unsqueeze", ["x", "a"], ["t"]),
                                  h.make_node("Squeeze", ["t", "a"], ["u"]), h.make_node("Relu", ["u"], ["y"])],
                                 {"a": _i64(0)}),
                          ("Squeeze", 1), "squeeze_unsqueeze_cancel", "Squeeze"),
    "mul_one": (_model([h.make_node("Mul", ["x", "c"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                       {"c": np.ones(1, np.float32)}), ("Mul", 1), "remove_mul_one", "Mul"),
    "add_zero": (_model([h.make_node("Add", ["x", "c"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                        {"c": np.zeros(16, np.float32)}), ("Add", 1), "remove_add_zero", "Add"),
}
# Kept by the runtime, removed by fold_mul_mul / fold_add_add: two scalings or shifts by weights in a row.
CASES["mul_mul"] = (_model([h.make_node("Mul", ["x", "c1"], ["t"]), h.make_node("Mul", ["t", "c2"], ["y"])],
                           {"c1": np.array(2.0, np.float32), "c2": _f32(16)}), ("Mul", 2), "fold_mul_mul", None)
CASES["add_add"] = (_model([h.make_node("Add", ["x", "c1"], ["t"]), h.make_node("Add", ["t", "c2"], ["y"])],
                           {"c1": _f32(16), "c2": _f32(16, seed=1)}), ("Add", 2), "fold_add_add", None)


def ort_optimized_ops(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> Counter:
    """The op histogram of the model onnxruntime actually runs (its optimized model, written to disk)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3  # the NCHWc warning about hardware-specific models
    with tempfile.TemporaryDirectory() as d:
        so.optimized_model_filepath = os.path.join(d, "opt.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    return RewriteEngine(load_rules())


def apply_rule(engine: RewriteEngine, g: Graph, rule: str) -> Graph:
    cands = [c for c in engine.candidates(g) if c.rule == rule]
    assert cands, f"{rule} found no match; candidates: {sorted({c.rule for c in engine.candidates(g)})}"
    return cands[0].graph.validate()


@pytest.mark.parametrize("name", list(CASES))
def test_onnxruntime_leaves_or_removes_the_pattern(name: str) -> None:
    model, (op, count), _, _ = CASES[name]
    for level in LEVELS.values():
        # onnxruntime 1.32 folds Pad into Conv and zero Pad into AveragePool (PadFusion, from ORT_ENABLE_BASIC),
        # cancels transposes and merges Reshapes; it keeps the rest.
        assert ort_optimized_ops(model, level)[op] == count


@pytest.mark.parametrize("name", list(CASES))
def test_xrl_rule_removes_the_op_and_keeps_the_outputs(engine: RewriteEngine, name: str) -> None:
    model, _, rule, removed = CASES[name]
    g = from_onnx(model)
    new = apply_rule(engine, g, rule)
    if removed is not None:
        assert Counter(n.op for n in new.nodes.values())[removed] == 0
    else:
        assert len(new.nodes) < len(g.nodes)
    out = to_onnx(new)
    onnx.checker.check_model(out)
    feeds = random_feeds(model)
    for a, b in zip(ort_run(model, feeds), ort_run(out, feeds)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_pad_folds_keep_their_conditions(engine: RewriteEngine) -> None:
    """No fold where it would change the result: a channel pad, a non-zero value, a zero pad before MaxPool,
    an AveragePool whose own pads do not count, a pad as large as the pool's kernel."""
    cases = [
        ([h.make_node("Pad", ["x", "p"], ["t"]), h.make_node("Conv", ["t", "w"], ["y"])],
         {"p": _i64(0, 1, 1, 1, 0, 1, 1, 1), "w": _f32(8, 10, 3, 3)}),
        ([h.make_node("Pad", ["x", "p", "v"], ["t"]), h.make_node("Conv", ["t", "w"], ["y"])],
         {"p": PADS, "v": np.array(1.0, np.float32), "w": _f32(8, 8, 3, 3)}),
        ([h.make_node("Pad", ["x", "p"], ["t"]), h.make_node("Conv", ["t", "w"], ["y"])],
         {"p": _i64(0, 0, -1, 0, 0, 0, 1, 1), "w": _f32(8, 8, 3, 3)}),
        ([h.make_node("Pad", ["x", "p"], ["t"], mode="reflect"), h.make_node("Conv", ["t", "w"], ["y"])],
         {"p": PADS, "w": _f32(8, 8, 3, 3)}),
        ([h.make_node("Pad", ["x", "p"], ["t"]), h.make_node("MaxPool", ["t"], ["y"], kernel_shape=[3, 3])],
         {"p": PADS}),
        ([h.make_node("Pad", ["x", "p"], ["t"]),
          h.make_node("AveragePool", ["t"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])], {"p": PADS}),
        ([h.make_node("Pad", ["x", "p", "v"], ["t"]), h.make_node("MaxPool", ["t"], ["y"], kernel_shape=[2, 2])],
         {"p": _i64(0, 0, 2, 0, 0, 0, 0, 0), "v": NEG_INF}),
    ]
    for nodes, inits in cases:
        cands = engine.candidates(from_onnx(_model(nodes, inits)))
        assert not [c.rule for c in cands if c.rule.startswith("fold_pad_")], (nodes, inits)


def _efficientnet_block_model() -> onnx.ModelProto:
    """A TF-style ("same"-padded) stem and depthwise block, exported by torch's TorchScript exporter."""
    torch = pytest.importorskip("torch")
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(3, 16, 3, 2), nn.ReLU())
            self.dw = nn.Sequential(nn.ZeroPad2d(1), nn.Conv2d(16, 16, 3, 1, groups=16), nn.ReLU())

        def forward(self, x):
            x = self.dw(self.stem(x))
            return F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2)

    buf = io.BytesIO()
    torch.onnx.export(Net().eval(), torch.randn(1, 3, 32, 32), buf, dynamo=False, opset_version=17)
    return onnx.load_from_string(buf.getvalue())


def test_exported_model_loses_every_pad(engine: RewriteEngine) -> None:
    model = _efficientnet_block_model()
    assert ort_optimized_ops(model, LEVELS["all"])["Pad"] == 1  # only the -inf Pad before MaxPool survives
    g = from_onnx(model)
    assert Counter(n.op for n in g.nodes.values())["Pad"] == 3
    for _ in range(3):
        g = apply_rule(engine, g, next(c.rule for c in engine.candidates(g) if c.rule.startswith("fold_pad_")))
    assert Counter(n.op for n in g.nodes.values())["Pad"] == 0
    out = to_onnx(g)
    assert ort_optimized_ops(out, LEVELS["all"])["Pad"] == 0
    feeds = random_feeds(model)
    np.testing.assert_allclose(ort_run(model, feeds)[0], ort_run(out, feeds)[0], rtol=1e-5, atol=1e-5)


def test_keras_style_stem_folds_after_the_relu_is_fused(engine: RewriteEngine) -> None:
    """Conv, Relu, ZeroPadding2D, MaxPooling2D (Keras' ResNet50 stem), the Relu also feeding a second branch:
    the zero Pad still folds once the Relu is fused into the Conv, and the Conv's other consumer is kept."""
    model = _model([h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
                    h.make_node("Pad", ["r", "p"], ["t"]),
                    h.make_node("MaxPool", ["t"], ["m"], kernel_shape=[3, 3], strides=[2, 2]),
                    h.make_node("ReduceMean", ["r"], ["s"], axes=[2, 3]), h.make_node("Add", ["m", "s"], ["y"])],
                   {"w": _f32(8, 8, 3, 3), "p": PADS})
    assert ort_optimized_ops(model, LEVELS["all"])["Pad"] == 1
    g = apply_rule(engine, from_onnx(model), "fuse_conv_Relu")
    g = apply_rule(engine, g, "fold_pad_conv_relu_maxpool")
    assert Counter(n.op for n in g.nodes.values())["Pad"] == 0
    feeds = random_feeds(model)
    np.testing.assert_allclose(ort_run(model, feeds)[0], ort_run(to_onnx(g), feeds)[0], rtol=1e-5, atol=1e-5)

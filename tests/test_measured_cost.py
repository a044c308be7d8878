"""Measured cost models: the PyTorch executor against onnxruntime, the timing/noise utilities, the per-op
backend and its on-disk cache (shared between processes, safe against a killed writer), the e2e backend."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from xrl import graphs
from xrl.cost.base import Measurement
from xrl.cost.e2e import CudaCostModel, E2ECostModel
from xrl.cost.op_measured import OpMeasuredCostModel, OpTimingCache, combine, config_key, op_config
from xrl.cost.ort import random_inputs
from xrl.cost.timing import (
    combined_noise,
    improvement_is_significant,
    median_stderr,
    noisier_than,
    summarize,
    time_callable,
)
from xrl.cost.torch_exec import TorchExecutor, UnsupportedOpError, resolve_device
from xrl.errors import ConfigError
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir import Graph, Node

HAS_GPU = torch.cuda.is_available()
FAST = {"warmup": 1, "repeats": 3}  # enough to exercise the machinery; not for real numbers


# ----- helpers --------------------------------------------------------------------------------
def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def model(nodes: list, inputs: dict[str, tuple[tuple[int, ...], int]], weights: dict[str, np.ndarray],
          outputs: list[str], opset: int = 17) -> onnx.ModelProto:
    """An ONNX model: inputs name -> (shape, TensorProto dtype), weights as initializers."""
    g = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(k, dt, s) for k, (s, dt) in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(w, k) for k, w in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)  # onnxruntime reads <= 13
    inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(m, strict_mode=True).graph.value_info}
    for out in m.graph.output:  # onnxruntime wants typed outputs: take onnx's own inference
        out.type.CopyFrom(inferred[out.name])
    return m


def ort_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_matches_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None, *, graph: Graph | None = None,
                       rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """TorchExecutor on the imported graph (or `graph`) computes what onnxruntime computes on `m`."""
    g = graph if graph is not None else from_onnx(m)
    feeds = feeds if feeds is not None else random_inputs(g, seed=3)
    got = TorchExecutor(g).run(feeds)
    ref = ort_run(m, feeds)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert tuple(a.shape) == b.shape
        np.testing.assert_allclose(a.numpy(), b, rtol=rtol, atol=atol)


F32 = TensorProto.FLOAT
X4 = {"x": ((2, 4, 9, 11), F32)}
CASES = {
    "conv_asym_pads_groups_stride_dilation_bias": (
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 2, 3], strides=[2, 1], dilations=[1, 2],
                          group=2)], X4, {"w": rand(6, 2, 3, 3), "b": rand(6, seed=1)}),
    "conv_same_upper": (
        [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])], X4,
        {"w": rand(5, 4, 4, 4)}),
    "conv1d": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 1])], {"x": ((1, 3, 10), F32)},
               {"w": rand(4, 3, 3)}),
    "maxpool_ceil_pads": (
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                          ceil_mode=1)], X4, {}),
    "maxpool_asym_pads": (
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], pads=[0, 1, 2, 0])], X4, {}),
    "avgpool_asym_exclude_pad": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 2], pads=[2, 0, 1, 1])],
        X4, {}),
    "avgpool_include_pad": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                          count_include_pad=1)], X4, {}),
    "global_pools_concat": (
        [helper.make_node("GlobalAveragePool", ["x"], ["a"]), helper.make_node("GlobalMaxPool", ["x"], ["m"]),
         helper.make_node("Concat", ["a", "m"], ["y"], axis=1)], X4, {}),
    "batchnorm_relu": (
        [helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"], ["t"], epsilon=1e-3),
         helper.make_node("Relu", ["t"], ["y"])], X4,
        {"s": rand(4), "b": rand(4, seed=1), "mu": rand(4, seed=2), "var": np.abs(rand(4, seed=3)) + 0.5}),
    "matmul_batched_broadcast_softmax": (
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=1)],
        {"x": ((3, 5, 8), F32)}, {"w": rand(8, 6)}),
    "gemm_trans_alpha_beta": (
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)], {"x": ((4, 8), F32)},
        {"w": rand(6, 8), "c": rand(6, seed=1)}),
    "gemm_transA_no_bias": (
        [helper.make_node("Gemm", ["x", "w"], ["y"], transA=1, alpha=1.5)], {"x": ((8, 4), F32)}, {"w": rand(8, 6)}),
    "layernorm_gelu_by_erf": (
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["t"], axis=-1, epsilon=1e-6),
         helper.make_node("Div", ["t", "sq2"], ["u"]), helper.make_node("Erf", ["u"], ["e"]),
         helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["t", "f"], ["y"])],
        {"x": ((2, 3, 16), F32)},
        {"s": rand(16), "b": rand(16, seed=1), "sq2": np.array(1.4142135, np.float32),
         "one": np.array(1.0, np.float32)}),
    "reduces": (
        [helper.make_node("ReduceMean", ["x"], ["a"], axes=[1, -1], keepdims=0),
         helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1),
         helper.make_node("ReduceMax", ["x"], ["m"]), helper.make_node("ReduceMin", ["x"], ["n"], axes=[2])],
        X4, {"ax": np.array([0, 2], np.int64)}),
    "split_slice_negative_step": (
        [helper.make_node("Split", ["x", "sz"], ["a", "b"], axis=3),
         helper.make_node("Slice", ["a", "st", "en", "axs", "stp"], ["y"])], X4,
        {"sz": np.array([4, 7], np.int64), "st": np.array([-1, 1], np.int64), "en": np.array([-100, 9], np.int64),
         "axs": np.array([3, 2], np.int64), "stp": np.array([-2, 3], np.int64)}),
    "reshape_transpose_flatten_squeeze": (
        [helper.make_node("Reshape", ["x", "shp"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
         helper.make_node("Unsqueeze", ["t", "ax"], ["u"]), helper.make_node("Squeeze", ["u", "ax"], ["s"]),
         helper.make_node("Flatten", ["s"], ["y"], axis=2)], X4,
        {"shp": np.array([8, -1, 11], np.int64), "ax": np.array([1], np.int64)}),
    "pad_constant_and_reflect": (
        [helper.make_node("Pad", ["x", "p", "v"], ["a"], mode="constant"),
         helper.make_node("Pad", ["x", "p2"], ["b"], mode="reflect")], X4,
        {"p": np.array([0, 1, 2, -1, 0, 0, 1, 3], np.int64), "v": np.array(0.5, np.float32),
         "p2": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)}),
    "pad_edge_on_axes": (
        [helper.make_node("Pad", ["x", "p", "", "axs"], ["y"], mode="edge")], X4,
        {"p": np.array([1, 2, 3, 0], np.int64), "axs": np.array([2, 3], np.int64)}, 18),
    "expand_where_compare": (
        [helper.make_node("Expand", ["v", "shp"], ["e"]), helper.make_node("Greater", ["x", "e"], ["c"]),
         helper.make_node("Where", ["c", "x", "e"], ["y"]), helper.make_node("Equal", ["x", "x"], ["q"])],
        {"x": ((2, 3, 4), F32)}, {"v": rand(3, 1), "shp": np.array([2, 3, 4], np.int64)}),
    "clip_leaky_hardsigmoid_max_min": (
        [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.2),
         helper.make_node("HardSigmoid", ["x"], ["h"]), helper.make_node("Max", ["c", "l", "h"], ["mx"]),
         helper.make_node("Min", ["c", "l"], ["mn"]), helper.make_node("Sub", ["mx", "mn"], ["y"])],
        {"x": ((3, 7), F32)}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}),
    "clip_by_activation_bounds": (
        [helper.make_node("Clip", ["x", "lo"], ["y"])], {"x": ((3, 7), F32), "lo": ((), F32)}, {}),
    "unary_chain": (
        [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
         helper.make_node("Log", ["s"], ["l"]), helper.make_node("Exp", ["l"], ["e"]),
         helper.make_node("Neg", ["e"], ["n"]), helper.make_node("Sigmoid", ["n"], ["g"]),
         helper.make_node("Tanh", ["g"], ["t"]), helper.make_node("Softplus", ["t"], ["p"]),
         helper.make_node("Reciprocal", ["p"], ["r"]), helper.make_node("Pow", ["r", "two"], ["y"])],
        {"x": ((4, 5), F32)}, {"two": np.array(2.0, np.float32)}),
    "cast_and_integer_div": (
        [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64), helper.make_node("Div", ["i", "d"], ["q"]),
         helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
        {"x": ((4, 5), F32)}, {"d": np.array(3, np.int64)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_executor_matches_onnxruntime_per_op(name: str) -> None:
    nodes, inputs, weights, *opset = CASES[name]
    outputs = [o for n in nodes for o in n.output if not any(o in m.input for m in nodes)]
    m = model(nodes, inputs, weights, outputs, *opset)
    feeds = {k: np.asarray(rand(*s, seed=7) * 3, np.float32) for k, (s, _) in inputs.items()}
    if name == "cast_and_integer_div":
        feeds["x"] = np.abs(feeds["x"]) * 5 - 7  # negatives: ONNX integer division truncates toward zero
    assert_matches_ort(m, feeds)


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh", "Gelu"])
def test_fused_activation_matches_its_onnx_lowering(act: str) -> None:
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
               helper.make_node("MatMul", ["c", "v"], ["y"])],
              X4, {"w": rand(6, 4, 3, 3), "b": rand(6, seed=1), "v": rand(11, 5, seed=2)}, ["y"])
    g = from_onnx(m)
    g = g.replace(remove=[n.name for n in g.nodes.values()],
                  add=[Node(n.name, n.op, n.inputs, n.outputs, {**n.attrs, "activation": act})
                       for n in g.topological_order])
    assert_matches_ort(to_onnx(g), graph=g, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny_cnn", "mlp"])
def test_torch_executor_matches_onnxruntime_on_builtin_graphs(name: str) -> None:
    m = graphs.build(name)
    assert_matches_ort(m, graph=from_onnx(m, name=name), rtol=1e-4, atol=1e-4)


def test_executor_frees_intermediates_and_bind_repeats_the_same_result() -> None:
    g = from_onnx(graphs.build("tiny_cnn"))
    ex = TorchExecutor(g)
    # every intermediate that is not an output is released after its last reader
    freed = {s for st in ex._steps for s in st.frees}
    produced = {s for st in ex._steps for s in st.outputs}
    assert produced - freed == set(ex._output_slots)
    run = ex.bind(seed=1)
    a, b = run()[0], run()[0]
    torch.testing.assert_close(a, b)
    ref = ex.run(random_inputs(g, 1))[0]
    torch.testing.assert_close(a, ref)


def test_executor_rejects_opaque_ops_with_a_clear_error() -> None:
    g = from_onnx(model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], {"x": ((5, 3), F32)},
                        {"i": np.array([0, 4], np.int64)}, ["y"]))
    with pytest.raises(UnsupportedOpError, match="opaque op Gather.*onnxruntime"):
        TorchExecutor(g)


def test_executor_requires_every_input() -> None:
    ex = TorchExecutor(from_onnx(graphs.build("mlp")))
    with pytest.raises(Exception, match="no value fed"):
        ex.run({})


def test_device_resolution() -> None:
    assert resolve_device("cpu", "op") == "cpu"
    assert resolve_device(None, "op") == ("cuda" if HAS_GPU else "cpu")
    with pytest.raises(ConfigError, match="unknown device 'tpu'.*cpu, cuda"):
        resolve_device("tpu", "op")
    if not HAS_GPU:
        for gpu in ("cuda", "h100"):
            with pytest.raises(ConfigError, match=f"device '{gpu}'.*CUDA GPU.*--device cpu"):
                resolve_device(gpu, "op")


# ----- timing and noise -----------------------------------------------------------------------
def test_summarize_and_time_callable() -> None:
    m = summarize([3.0, 1.0, 2.0, 2.0])
    assert (m.median_s, m.repeats, m.min_s, m.max_s) == (2.0, 4, 1.0, 3.0)
    assert m.cv == pytest.approx(np.std([3, 1, 2, 2]) / 2.0)
    assert summarize([5.0]).cv == 0.0
    calls = []
    m = time_callable(lambda: (calls.append(1), time.sleep(0.002)), warmup=2, repeats=5)
    assert len(calls) == 7 and m.repeats == 5
    assert 0.0019 < m.min_s <= m.median_s <= m.max_s < 0.1
    syncs = []
    time_callable(lambda: None, warmup=0, repeats=3, sync=lambda: syncs.append(1))
    assert len(syncs) == 6  # before each clock start and before each clock stop
    with pytest.raises(ConfigError):
        time_callable(lambda: None, repeats=0)


def test_time_callable_batches_fast_calls_into_longer_samples() -> None:
    calls = []
    m = time_callable(lambda: calls.append(1), warmup=0, repeats=4, min_run_s=1e-3)
    assert len(calls) > 40  # each sample ran the call many times
    assert m.median_s < 1e-4  # and reports time per call


def test_improvement_must_exceed_the_combined_noise() -> None:
    def ms(median_ms: float, cv: float, n: int = 10) -> Measurement:
        return Measurement(median_ms / 1e3, n, cv, median_ms / 1e3, median_ms / 1e3)

    assert improvement_is_significant(ms(10, 0.01), ms(9, 0.01))  # 10% gain, 1% noise
    assert not improvement_is_significant(ms(10, 0.20), ms(9.9, 0.20))  # 1% gain, 20% noise
    assert not improvement_is_significant(ms(9, 0.01), ms(10, 0.01))  # a slowdown is never an improvement
    assert not improvement_is_significant(ms(10, 0.0), ms(10, 0.0))
    assert improvement_is_significant(ms(10, 0.0, 1), ms(9.999, 0.0, 1))  # deterministic: any gain counts
    # more repeats shrink the standard error of the median: the same gain becomes significant
    assert not improvement_is_significant(ms(10, 0.1, 5), ms(9.5, 0.1, 5))
    assert improvement_is_significant(ms(10, 0.1, 500), ms(9.5, 0.1, 500))
    # z scales the bar
    before, after = ms(10, 0.05), ms(9.8, 0.05)
    noise = combined_noise(before, after, z=1.0)
    assert noise == pytest.approx(math.hypot(median_stderr(before), median_stderr(after)))
    assert improvement_is_significant(before, after, z=0.5) and not improvement_is_significant(before, after, z=3.0)
    assert noisier_than(ms(10, 0.2), ms(9.9, 0.2)) and not noisier_than(ms(10, 0.01), ms(8, 0.01))


# ----- the op backend -------------------------------------------------------------------------
@pytest.fixture()
def cache_path(tmp_path: Path) -> Path:
    return tmp_path / "op_costs.sqlite"


def op_model(cache_path: Path, **kw) -> OpMeasuredCostModel:
    return OpMeasuredCostModel(device="cpu", cache_path=cache_path, min_sample_s=2e-4, **{**FAST, **kw})


def test_op_config_keys_what_decides_run_time() -> None:
    w1, w2 = rand(4, 4, 3, 3, seed=1), rand(4, 4, 3, 3, seed=2)
    g = from_onnx(model([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                         helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
                         helper.make_node("Slice", ["a", "s0", "e1"], ["c"]),
                         helper.make_node("Slice", ["a", "s0", "e2"], ["d"])],
                        X4, {"w1": w1, "w2": w2, "s0": np.array([0], np.int64), "e1": np.array([1], np.int64),
                             "e2": np.array([2], np.int64)}, ["b", "c", "d"]))
    n = {node.op + node.outputs[0]: node for node in g.nodes.values()}
    cfg = {k: op_config(v, g) for k, v in n.items()}
    assert cfg["Conva"] == cfg["Convb"]  # weights' values do not change run time
    assert cfg["Slicec"] != cfg["Sliced"]  # a slice's bounds do
    assert json.loads(cfg["Conva"])["op"] == "Conv"
    assert op_config(n["Conva"], g, "float16") != cfg["Conva"]
    assert len(config_key(cfg["Conva"])) == 32


def test_op_backend_sums_measured_ops_and_views_are_free(cache_path: Path) -> None:
    g = from_onnx(graphs.build("tiny_cnn"))
    cm = op_model(cache_path)
    costs = cm.op_costs(g)
    assert cm.per_op and cm.name == "op"
    assert cm.cost(g) == pytest.approx(sum(costs.values()))
    for node in g.nodes.values():
        free = node.op in ("Flatten", "Identity")
        assert (costs[node.name] == 0.0) == free, node.op
    distinct = {op_config(n, g) for n in g.nodes.values() if n.op not in ("Flatten", "Identity")}
    assert cm.stats["measured"] == len(distinct) == len(OpTimingCache(cache_path))
    m = cm.measure(g)
    assert m.median_s == pytest.approx(cm.cost(g)) and m.min_s <= m.median_s <= m.max_s and m.repeats == 3
    assert 0 < m.cv and math.isfinite(m.cv)  # the formula: test_combined_spread_of_op_measurements


def test_op_backend_delta_cost_is_exact(cache_path: Path) -> None:
    g = from_onnx(model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                         helper.make_node("MatMul", ["r", "w2"], ["y"])],
                        {"x": ((16, 32), F32)}, {"w1": rand(32, 64), "w2": rand(64, 8, seed=1)}, ["y"]))
    cm = op_model(cache_path)
    old = cm.cost(g)
    mm = next(n for n in g.topological_order if n.op == "MatMul")
    relu = next(n for n in g.nodes.values() if n.op == "Relu")
    fused = Node(mm.name, "MatMul", mm.inputs, relu.outputs, {"activation": "Relu"})
    new = g.replace(remove=[mm.name, relu.name], add=[fused]).validate()
    assert cm.delta_cost(g, old, new, [mm, relu], [fused]) == pytest.approx(cm.cost(new), rel=1e-12)
    assert cm.cost(new) != old


def test_combined_spread_of_op_measurements() -> None:
    a = Measurement(1.0, 10, 0.1, 0.9, 1.2)
    b = Measurement(2.0, 5, 0.05, 1.9, 2.3)
    m = combine([(a, 3), (b, 1)])
    assert m.median_s == pytest.approx(5.0) and m.repeats == 5
    assert m.cv == pytest.approx(math.hypot(3 * 0.1, 0.1) / 5.0)  # one measurement used 3 times: errors add
    assert (m.min_s, m.max_s) == (pytest.approx(4.6), pytest.approx(5.9))
    assert combine([]).median_s == 0.0


def test_op_cache_is_shared_with_another_process(cache_path: Path) -> None:
    g = from_onnx(graphs.build("mlp"))
    first = op_model(cache_path)
    costs = first.op_costs(g)
    assert first.stats["measured"] > 0
    again = op_model(cache_path)  # a fresh model in this process: the disk answers
    assert again.op_costs(g) == costs and again.stats["measured"] == 0
    code = ("import json; from xrl import graphs; from xrl.frontends.onnx_io import from_onnx; "
            "from xrl.cost.op_measured import OpMeasuredCostModel as M; "
            "m = M(device='cpu', warmup=1, repeats=3); g = from_onnx(graphs.build('mlp')); "
            "print(json.dumps([m.op_costs(g), m.stats]))")
    env = {**os.environ, "XRL_CACHE_DIR": str(cache_path.parent)}  # the default path, through the env variable
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    other_costs, stats = json.loads(out)
    assert other_costs == costs and stats["measured"] == 0 and stats["cache_hits"] > 0


def test_a_killed_writer_leaves_a_readable_cache(cache_path: Path) -> None:
    code = ("import sys; from xrl.cost.op_measured import OpTimingCache; from xrl.cost.base import Measurement\n"
            "c = OpTimingCache(sys.argv[1]); i = 0\n"
            "while True:\n"
            "    c.put(f'k{i}', 'dev', '{}', Measurement((i + 1) * 1e-6, 3, 0.01, (i + 1) * 1e-6, 1.0)); i += 1\n"
            "    if i == 50: print('ready', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cache_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-write, with no chance to clean up
        proc.wait()
    with sqlite3.connect(cache_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    cache = OpTimingCache(cache_path)
    n = len(cache)
    assert n >= 50
    for i in range(n):  # every committed timing reads back whole
        m = cache.get(f"k{i}", "dev")
        assert m is not None and m.median_s == pytest.approx((i + 1) * 1e-6) and m.repeats == 3
    assert cache.get("k0", "other device") is None


def test_first_writer_wins_and_cache_survives_pickling(cache_path: Path) -> None:
    import pickle

    a, b = OpTimingCache(cache_path), OpTimingCache(cache_path)
    assert a.put("k", "d", "{}", Measurement(1.0, 3, 0.1, 0.9, 1.1)).median_s == 1.0
    assert b.put("k", "d", "{}", Measurement(2.0, 3, 0.1, 1.9, 2.1)).median_s == 1.0  # both agree on the first
    c = pickle.loads(pickle.dumps(a))
    assert c.get("k", "d") == a.get("k", "d")


def test_op_cache_rejects_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "op_costs.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(Exception, match="cannot use .* as xrl's timing cache"):
        len(OpTimingCache(bad))


def test_op_backend_times_opaque_ops_with_onnxruntime(cache_path: Path) -> None:
    g = from_onnx(model([helper.make_node("Gather", ["x", "i"], ["g"], axis=0), helper.make_node("Relu", ["g"], ["y"])],
                        {"x": ((50, 30), F32)}, {"i": np.arange(20, dtype=np.int64)}, ["y"]))
    costs = op_model(cache_path).op_costs(g)
    assert all(c > 0 for c in costs.values())


def test_op_backend_options_are_checked(cache_path: Path) -> None:
    with pytest.raises(ConfigError, match="repeats >= 1"):
        op_model(cache_path, repeats=0)
    with pytest.raises(ConfigError, match="threads"):
        op_model(cache_path, threads=0)
    with pytest.raises(ConfigError, match="unknown timer"):
        op_model(cache_path, timer="sundial")


# ----- the e2e backend ------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_e2e_measures_the_whole_graph_with_spread(engine: str) -> None:
    g = from_onnx(graphs.build("tiny_cnn"))
    cm = E2ECostModel(device="cpu", engine=engine, warmup=1, repeats=5)
    m = cm.measure(g)
    assert not cm.per_op and m.repeats == 5 and 0 < m.min_s <= m.median_s <= m.max_s and m.cv >= 0
    assert cm.measure(g) is m  # cached by canonical hash: search revisits graphs
    assert cm.cost(g) == m.median_s
    assert engine in cm.describe()
    with pytest.raises(ConfigError, match="no per-op cost"):
        cm.op_cost(next(iter(g.nodes.values())), g)


def test_e2e_torch_falls_back_to_onnxruntime_for_opaque_ops(caplog) -> None:
    g = from_onnx(model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], {"x": ((5, 3), F32)},
                        {"i": np.array([0, 4], np.int64)}, ["y"]))
    m = E2ECostModel(device="cpu", engine="torch", warmup=1, repeats=3).measure(g)
    assert m.median_s > 0 and m.repeats == 3
    assert "onnxruntime instead of torch" in caplog.text


def test_e2e_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown e2e engine 'tvm'"):
        E2ECostModel(device="cpu", engine="tvm")
    with pytest.raises(ConfigError, match="repeats >= 1"):
        E2ECostModel(device="cpu", repeats=0)


@pytest.mark.skipif(HAS_GPU, reason="checks the error on a machine without a GPU")
def test_cuda_backend_refuses_to_start_without_a_gpu() -> None:
    with pytest.raises(ConfigError, match="no CUDA GPU found; use --cost op or e2e on the CPU"):
        CudaCostModel()
    from xrl.cost import get_cost_model

    with pytest.raises(ConfigError, match="no CUDA GPU found"):
        get_cost_model("cuda")


def test_registry_builds_the_measured_backends(cache_path: Path) -> None:
    from xrl.cost import get_cost_model

    op = get_cost_model("op", device="cpu", cache_path=cache_path, repeats=3)
    e2e = get_cost_model("e2e", device="cpu", engine="torch", repeats=3)
    assert isinstance(op, OpMeasuredCostModel) and op.repeats == 3
    assert isinstance(e2e, E2ECostModel) and e2e.engine == "torch"


def test_cli_cost_with_measured_backends(tmp_path: Path, capsys, monkeypatch) -> None:
    from xrl.cli import main

    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    for backend in ("op", "e2e"):
        code = main(["cost", "mlp", "--cost", backend, "--device", "cpu", "--repeats", "3", "--json"])
        out = capsys.readouterr().out
        assert code == 0
        result = json.loads(out)
        assert result["cost_s"] > 0 and result["repeats"] == 3 and backend in result["cost_model"]
    assert (tmp_path / "op_costs.sqlite").exists()


# ----- GPU ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny_cnn", "mlp"])
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_torch_executor_on_cuda_matches_cpu(name: str, cuda_graph: bool) -> None:
    g = from_onnx(graphs.build(name))
    feeds = random_inputs(g, 0)
    ref = TorchExecutor(g).run(feeds)[0]
    run = TorchExecutor(g, "cuda").bind(feeds, cuda_graph=cuda_graph)
    assert (run.cuda_graph is not None) == cuda_graph
    for _ in range(2):  # a replay reads the same static inputs and writes the same outputs
        torch.testing.assert_close(run()[0].cpu(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("timer", ["harness", "events", "wall"])
def test_gpu_backends_measure_tiny_cnn(timer: str, cache_path: Path) -> None:
    g = from_onnx(graphs.build("tiny_cnn"))
    e2e = E2ECostModel(device="cuda", engine="torch", timer=timer, warmup=3, repeats=10).measure(g)
    op = OpMeasuredCostModel(device="cuda", cache_path=cache_path, timer=timer, warmup=3, repeats=10).measure(g)
    assert 1e-6 < e2e.median_s < 0.05 and 1e-6 < op.median_s < 0.05
    cuda = CudaCostModel(granularity="graph", repeats=10)
    assert cuda.measure(g).median_s > 0 and not cuda.per_op
    assert CudaCostModel(granularity="op", cache_path=cache_path).per_op

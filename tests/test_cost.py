"""Cost models: the analytic roofline's orderings (fusion and merging pay), the registry, onnxruntime timing."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from graph_helpers import build

from xrl.cost import COST_MODELS, DEVICE_PROFILES, AnalyticCostModel, DeviceProfile, get_cost_model
from xrl.errors import ConfigError
from xrl.ir import Graph, Node, TensorType

GPUS = [d for d in DEVICE_PROFILES if d != "cpu"]


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_relu(fused: bool, c: int = 64, hw: int = 56) -> Graph:
    w, b = rand(c, c, 3, 3), rand(c)
    conv = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}
    if fused:
        nodes = [Node("conv", "Conv", ("x", "w", "b"), ("y",), {**conv, "activation": "Relu"})]
    else:
        nodes = [Node("conv", "Conv", ("x", "w", "b"), ("c",), conv), Node("relu", "Relu", ("c",), ("y",))]
    return build({"x": (1, c, hw, hw)}, {"w": w, "b": b}, nodes, ["y"])


def two_matmuls(m: int, k: int, n: int) -> Graph:
    nodes = [Node("mm1", "MatMul", ("x", "w1"), ("y1",)), Node("mm2", "MatMul", ("x", "w2"), ("y2",))]
    return build({"x": (m, k)}, {"w1": rand(k, n, seed=1), "w2": rand(k, n, seed=2)}, nodes, ["y1", "y2"])


def merged_matmul(m: int, k: int, n: int) -> Graph:
    w = np.concatenate([rand(k, n, seed=1), rand(k, n, seed=2)], axis=1)
    nodes = [Node("mm", "MatMul", ("x", "w"), ("y",)),
             Node("split", "Split", ("y", "sizes"), ("y1", "y2"), {"axis": 1})]
    return build({"x": (m, k)}, {"w": w, "sizes": np.array([n, n], np.int64)}, nodes, ["y1", "y2"])


def every_kind() -> Graph:
    """One graph with ops of every kind: compute, elementwise, reduction, memory, view, opaque."""
    weights = {"w": rand(8, 4, 3, 3), "wm": rand(8, 16), "shape": np.array([2, 8, 16], np.int64),
               "starts": np.array([0], np.int64), "ends": np.array([4], np.int64), "axes": np.array([2], np.int64),
               "g": rand(8), "beta": rand(8)}
    nodes = [
        Node("conv", "Conv", ("x", "w"), ("c",), {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}),
        Node("relu", "Relu", ("c",), ("r",)),
        Node("pool", "MaxPool", ("r",), ("p",), {"kernel_shape": (2, 2), "strides": (2, 2)}),
        Node("resh", "Reshape", ("p", "shape"), ("v",)),
        Node("tr", "Transpose", ("v",), ("t",), {"perm": (0, 2, 1)}),
        Node("mm", "MatMul", ("t", "wm"), ("m",)),
        Node("sm", "Softmax", ("m",), ("s",), {"axis": -1}),
        Node("ln", "LayerNormalization", ("t", "g", "beta"), ("l",), {"axis": -1}),
        Node("cat", "Concat", ("s", "l"), ("cc",), {"axis": 2}),
        Node("sl", "Slice", ("cc", "starts", "ends", "axes"), ("sl_out",)),
        Node("red", "ReduceMean", ("sl_out",), ("rm",), {"axes": (2,), "keepdims": 1}),
        Node("custom", "MyCustomOp", ("rm",), ("out",), domain="com.example"),
    ]
    return build({"x": (2, 4, 8, 8)}, weights, nodes, ["out"], extra_types={"out": TensorType((2, 16, 1))})


@pytest.mark.parametrize("device", list(DEVICE_PROFILES))
def test_analytic_cost_of_every_op_kind_is_finite_and_views_are_free(device: str) -> None:
    g = every_kind()
    costs = AnalyticCostModel(device=device).op_costs(g)
    assert costs["resh"] == 0.0
    launch = DEVICE_PROFILES[device].launch_overhead_s
    for name, c in costs.items():
        if name != "resh":
            assert math.isfinite(c) and c > launch, name
    assert AnalyticCostModel(device=device).cost(g) == pytest.approx(sum(costs.values()))


@pytest.mark.parametrize("device", list(DEVICE_PROFILES))
def test_fused_conv_relu_is_cheaper_than_conv_then_relu(device: str) -> None:
    model = get_cost_model("analytic", device=device)
    unfused, fused = model.cost(conv_relu(False)), model.cost(conv_relu(True))
    assert fused < unfused
    # The saving is at least the Relu's launch overhead, which fusion removes.
    assert unfused - fused >= DEVICE_PROFILES[device].launch_overhead_s


@pytest.mark.parametrize("device", GPUS)
@pytest.mark.parametrize("mkn", [(128, 768, 768), (32, 256, 256), (1, 64, 64)])
def test_merged_matmul_with_split_beats_two_matmuls_on_gpus(device: str, mkn: tuple[int, int, int]) -> None:
    model = get_cost_model("analytic", device=device)
    merged, separate = model.cost(merged_matmul(*mkn)), model.cost(two_matmuls(*mkn))
    if device == "gtx1080" and mkn[0] == 128:
        # 20 SMs are already nearly full with one BERT-sized GEMM: merging gains little efficiency,
        # and the Split's copy at 320 GB/s costs more than that.
        assert merged > separate
    else:
        assert merged < separate


def test_merging_small_matmuls_pays_on_cpu_but_big_compute_bound_ones_do_not() -> None:
    # On a CPU a big GEMM is compute-bound at full efficiency, so merging saves nothing and the Split's
    # copy is pure loss; small ones still gain a dispatch and efficiency.
    model = get_cost_model("analytic", device="cpu")
    assert model.cost(merged_matmul(1, 64, 64)) < model.cost(two_matmuls(1, 64, 64))
    assert model.cost(merged_matmul(512, 1024, 1024)) > model.cost(two_matmuls(512, 1024, 1024))


def test_small_compute_kernels_run_below_peak_efficiency() -> None:
    model = AnalyticCostModel(device="h100")
    d = model.device
    assert model.compute_efficiency(d.saturation_flops * 10, "compute") == d.compute_efficiency
    assert model.compute_efficiency(d.saturation_flops / 4, "compute") == pytest.approx(d.compute_efficiency / 2)
    assert model.compute_efficiency(1e3, "elementwise") == d.compute_efficiency


def test_delta_cost_equals_a_full_recost_after_replace() -> None:
    model = get_cost_model("analytic")
    old = conv_relu(False)
    conv, relu = old.nodes["conv"], old.nodes["relu"]
    fused = Node("fused", "Conv", conv.inputs, ("y2",), {**conv.attrs, "activation": "Relu"})
    new = old.replace(remove=["conv", "relu"], add=[fused], rename={"y": "y2"},
                      new_types={"y2": old.type_of("y")}).validate()
    assert new.canonical_hash == conv_relu(True).canonical_hash
    delta = model.delta_cost(old, model.cost(old), new, removed=[conv, relu], added=[fused])
    assert delta == pytest.approx(get_cost_model("analytic").cost(new), rel=1e-12)


@pytest.mark.parametrize("graph", [lambda: conv_relu(True, c=256, hw=56), lambda: conv_relu(True, c=16, hw=8),
                                   lambda: two_matmuls(128, 768, 768), lambda: two_matmuls(8, 64, 64)],
                         ids=["big-conv", "small-conv", "bert-gemm", "small-gemm"])
def test_slower_devices_cost_more(graph) -> None:
    g = graph()
    cost = {d: get_cost_model("analytic", device=d).cost(g) for d in DEVICE_PROFILES}
    assert cost["h100"] < cost["a100"] < cost["v100"] < cost["gtx1080"] < cost["cpu"]


def test_analytic_is_deterministic_and_fast() -> None:
    g = every_kind()
    a, b = AnalyticCostModel(), AnalyticCostModel()
    assert a.cost(g) == b.cost(g) == a.cost(g)  # fresh, cached, and cached again agree bit for bit
    assert a.op_costs(g) == b.op_costs(every_kind())
    big = _deep_chain(300)
    times = []
    for _ in range(3):  # the best of three: one sample on a loaded machine is the scheduler's, not the code's
        t0 = time.perf_counter()
        AnalyticCostModel().cost(big)
        times.append(time.perf_counter() - t0)
    assert min(times) < 0.25  # ~1 ms; the bound only catches a pathological slowdown


def _deep_chain(n: int) -> Graph:
    """`n` ops alternating MatMul / Add / Gelu, the size of BERT-base's op count."""
    weights = {"w": rand(64, 64), "b": rand(64)}
    nodes, x = [], "x"
    for i in range(n):
        op, ins = [("MatMul", (x, "w")), ("Add", (x, "b")), ("Gelu", (x,))][i % 3]
        nodes.append(Node(f"n{i}", op, ins, (f"v{i}",)))
        x = f"v{i}"
    return build({"x": (16, 64)}, weights, nodes, [x])


def test_custom_device_profile_is_accepted() -> None:
    slow = DeviceProfile("slow", 1e9, 1e9, 1e-3, 1.0, 1.0, "a made-up device")
    g = conv_relu(False)
    assert get_cost_model("analytic", device=slow).cost(g) > get_cost_model("analytic", device="cpu").cost(g)
    with pytest.raises(ValueError, match="efficiencies"):
        DeviceProfile("bad", 1e9, 1e9, 0.0, 1.5, 1.0, "")


def test_registry_and_unknown_names() -> None:
    assert {"analytic", "ort"} <= set(COST_MODELS)
    assert isinstance(get_cost_model(), AnalyticCostModel)
    assert get_cost_model().describe() == "analytic(h100)"
    with pytest.raises(ConfigError, match="unknown cost model 'nope'.*analytic.*ort"):
        get_cost_model("nope")
    with pytest.raises(ConfigError, match="unknown device 'tpu'.*h100.*gtx1080"):
        get_cost_model("analytic", device="tpu")
    with pytest.raises(ConfigError, match="no option 'repeats'"):
        get_cost_model("analytic", repeats=3)
    with pytest.raises(ConfigError, match="graph_optimization_level"):
        get_cost_model("ort", graph_optimization_level="max")
    with pytest.raises(ConfigError, match="unknown device"):
        get_cost_model("ort", device="tpu")


# ----- onnxruntime ------------------------------------------------------------------------------
def small_mlp() -> Graph:
    nodes = [Node("mm", "MatMul", ("x", "w"), ("h",), {"activation": "Relu"}),
             Node("add", "Add", ("h", "b"), ("y",))]
    return build({"x": (8, 32)}, {"w": rand(32, 16), "b": rand(16)}, nodes, ["y"])


def test_ort_measures_the_whole_graph() -> None:
    pytest.importorskip("xrl.frontends.onnx_io")
    model = get_cost_model("ort", device="cpu", warmup=1, repeats=7, threads=1)
    assert not model.per_op
    g = small_mlp()
    m = model.measure(g)
    assert m.repeats == 7 and m.cv >= 0
    assert 0 < m.min_s <= m.median_s <= m.max_s < 1.0
    assert model.cost(g) == m.median_s  # cached by canonical hash: a second timing is not taken
    split = model.op_costs(g)
    assert set(split) == {"mm", "add"} and sum(split.values()) == pytest.approx(m.median_s)
    with pytest.raises(ConfigError, match="whole graphs"):
        model.op_cost(g.nodes["mm"], g)
    assert "cpu" in model.describe()


def test_ort_uncached_measurements_are_fresh() -> None:
    pytest.importorskip("xrl.frontends.onnx_io")
    model = get_cost_model("ort", device="cpu", warmup=0, repeats=2, threads=1, cache=False)
    g = small_mlp()
    assert model.measure(g) is not model.measure(g)


def test_ort_gpu_profile_needs_cuda() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(ConfigError, match="CUDAExecutionProvider"):
        get_cost_model("ort", device="h100")
    assert "cpu" in get_cost_model("ort").describe()  # the default, "auto", falls back to the CPU


def test_ort_names_a_graph_it_cannot_run() -> None:
    pytest.importorskip("xrl.frontends.onnx_io")
    from xrl.cost.ort import OrtSessionError

    g = build({"x": (4,)}, {}, [Node("n", "NoSuchOp", ("x",), ("y",), domain="com.example")], ["y"],
              extra_types={"y": TensorType((4,))})
    with pytest.raises(OrtSessionError, match="cannot load graph"):
        get_cost_model("ort", device="cpu", repeats=1).cost(g)


def test_the_default_profile_is_this_machines(tmp_path):
    from xrl.cost.devices import gpu_model_names, profile_for_gpu, this_machine_profile

    assert this_machine_profile(str(tmp_path / "none" / "*" / "information"), smi=None) == "cpu"
    # without the /proc files, nvidia-smi answers (a sandbox such as gVisor)
    fake_smi = tmp_path / "fake-smi"
    fake_smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    fake_smi.chmod(0o755)
    assert gpu_model_names(str(tmp_path / "none" / "*"), smi=str(fake_smi)) == ["NVIDIA H100 80GB HBM3"]
    assert this_machine_profile(str(tmp_path / "none" / "*"), smi=str(tmp_path / "missing-smi")) == "cpu"
    for i, model in enumerate(["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]):
        (tmp_path / f"000{i}:00.0").mkdir()
        (tmp_path / f"000{i}:00.0" / "information").write_text(f"Model: \t {model}\nIRQ:  42\n")
    pattern = str(tmp_path / "*" / "information")
    assert gpu_model_names(pattern, smi=None) == ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]
    assert this_machine_profile(pattern, smi=None) == "h100"  # the first GPU's; an H200 has the H100's SMs
    assert [profile_for_gpu(n) for n in ("Tesla V100-SXM2-16GB", "NVIDIA GeForce GTX 1080", "NVIDIA L4")] == [
        "v100", "gtx1080", "h100"]


def test_optimize_and_cost_estimate_for_this_machine_by_default():
    from xrl.api import optimize
    from xrl.cost.devices import this_machine_profile

    here = this_machine_profile()
    assert get_cost_model("analytic", device="auto").device.name == here
    assert get_cost_model("analytic").device.name == "h100"  # the library's default: training and the envs
    assert get_cost_model("analytic", device="a100").device.name == "a100"
    # no device named: this machine's profile (`xrl optimize`, `xrl cost`, `xrl compare`)
    assert optimize("mlp", search="none", cost="analytic", prepass=()).cost_model == f"analytic({here})"

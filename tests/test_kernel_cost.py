"""The measured cost of the onnxruntime targets (xrl.cost.kernel_measured) and its timing cache: kernels
timed alone and summed, the cache's hits and misses, a killed or concurrent writer, corrupted and insane
entries refused and re-measured, the deadline's named fallback, the CUDA path at the session boundary."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from xrl import graphs
from xrl.cost import MeasuredKernelCostModel, TargetCostModel, get_cost_model
from xrl.cost.base import Measurement
from xrl.cost.kernel_measured import kernel_model
from xrl.cost.op_measured import CacheError, OpTimingCache
from xrl.cost.runtime_fusion import runtime_plan
from xrl.frontends.onnx_io import from_onnx

FAST = {"warmup": 1, "repeats": 3}


@pytest.fixture
def cache_path(tmp_path: Path) -> Path:
    return tmp_path / "kernel_costs.sqlite"


def mlp():
    return from_onnx(graphs.build("mlp"), name="mlp")


def test_target_cost_is_measured_by_default_and_roofline_by_name(monkeypatch, cache_path: Path) -> None:
    monkeypatch.delenv("XRL_TARGET_COST")
    monkeypatch.setenv("XRL_CACHE_DIR", str(cache_path.parent))
    assert type(get_cost_model("target", target="ort-cpu")) is MeasuredKernelCostModel
    assert type(get_cost_model("roofline", target="ort-cpu")) is TargetCostModel
    assert type(get_cost_model("target", target="ort-cpu", timing="roofline")) is TargetCostModel
    # another device's profile cannot be timed here: its estimate stays the roofline, and says so
    assert "roofline" in get_cost_model("target", device="a100").describe()


def test_graph_cost_is_overhead_plus_measured_kernels(cache_path: Path) -> None:
    g = mlp()
    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    total = m.cost(g)
    plan, kernels = runtime_plan(g)
    parts = [m.kernel_cost(k, plan) for k in kernels]
    assert total == pytest.approx(m.overhead().fixed_s + sum(parts))
    assert all(p >= 0 for p in parts) and sum(p > 0 for p in parts) >= 2
    assert m.overhead().fixed_s > 0 and m.overhead().dispatch_s >= 0
    report = m.report()
    assert report["kernels_measured"] >= 2 and report["kernel_cache_hits"] == 0 and report["measure_s"] > 0
    assert report["fallback_kernels"] == 0 and "measured kernels" in m.describe()
    # a heavier kernel costs more: a wider MatMul than the mlp's own
    assert m.cost(g) == total  # the same graph, the same number: cached, deterministic


def test_second_model_hits_the_disk_cache_and_another_process_agrees(cache_path: Path) -> None:
    g = mlp()
    first = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    cost = first.cost(g)
    again = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    assert again.cost(g) == cost
    assert again.report()["kernels_measured"] == 0 and again.report()["kernel_cache_hit_rate"] == 1.0
    code = ("import json, sys; from xrl import graphs; from xrl.frontends.onnx_io import from_onnx; "
            "from xrl.cost.kernel_measured import MeasuredKernelCostModel as M; "
            "m = M(target='ort-cpu', cache_path=sys.argv[1], warmup=1, repeats=3); "
            "print(json.dumps([m.cost(from_onnx(graphs.build('mlp'), name='mlp')), m.report()]))")
    out = subprocess.run([sys.executable, "-c", code, str(cache_path)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    other, report = json.loads(out)
    assert other == pytest.approx(cost, rel=1e-12) and report["kernels_measured"] == 0


def test_kernel_key_ignores_names_and_weight_values() -> None:
    """The same kernel in two layers (other names, other weights) is timed once."""
    g = from_onnx(graphs.build("mlp", seed=0), name="mlp")
    h = from_onnx(graphs.build("mlp", seed=1), name="other")
    (pg, kg), (ph, kh) = runtime_plan(g), runtime_plan(h)
    keys_g = sorted(kernel_model(k, pg).key for k in kg if k.nodes)
    keys_h = sorted(kernel_model(k, ph).key for k in kh if k.nodes)
    assert keys_g == keys_h


def test_concurrent_writers_agree_on_one_value(cache_path: Path) -> None:
    code = ("import sys; from xrl.cost.op_measured import OpTimingCache; from xrl.cost.base import Measurement\n"
            "c = OpTimingCache(sys.argv[1]); v = float(sys.argv[2])\n"
            "print(','.join(repr(c.put(f'k{i}', 'dev', '{}', Measurement(v, 3, 0.1, v, v)).median_s) "
            "for i in range(200)))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(cache_path), value], stdout=subprocess.PIPE, text=True)
             for value in ("1e-3", "2e-3")]
    outs = [p.communicate(timeout=120)[0].strip().split(",") for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]  # whoever wrote a key first, both read the same value back
    cache = OpTimingCache(cache_path)
    assert len(cache) == 200


@pytest.mark.parametrize("tamper", ["bitflip", "negative", "zero", "huge", "string", "min_above_median"])
def test_a_corrupted_or_insane_entry_is_refused_and_remeasured(cache_path: Path, tamper: str) -> None:
    g = mlp()
    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    honest = m.cost(g)
    sql = {"bitflip": "UPDATE op_timings_v2 SET median_s = median_s / 16",  # the checksum no longer matches
           "negative": "UPDATE op_timings_v2 SET median_s = -median_s",
           "zero": "UPDATE op_timings_v2 SET median_s = 0",
           "huge": "UPDATE op_timings_v2 SET median_s = 1e30, max_s = 1e30",
           "string": "UPDATE op_timings_v2 SET median_s = 'fast'",
           "min_above_median": "UPDATE op_timings_v2 SET min_s = median_s * 2"}[tamper]
    with sqlite3.connect(cache_path) as conn:
        n = conn.execute("SELECT COUNT(*) FROM op_timings_v2").fetchone()[0]
        conn.execute(sql)
    fresh = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    again = fresh.cost(g)
    assert fresh.report()["kernel_cache_hits"] == 0 and fresh.report()["kernels_measured"] >= 2  # re-measured
    assert fresh.cache.refused >= 1
    assert 0.1 < again / honest < 10  # a real timing of the same work (on a loaded machine), not the tampered one
    assert len(OpTimingCache(cache_path)) == n  # every refused row was measured and stored again


def test_a_cache_that_is_not_xrls_is_one_clear_error(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.sqlite"
    OpTimingCache(truncated).put("k", "d", "{}", Measurement(1e-3, 3, 0.1, 1e-3, 1e-3))
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 3] + b"\0" * 100)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE op_timings_v2 (key TEXT, device TEXT)")
    text = tmp_path / "text.sqlite"
    text.write_text("not a database " * 100)
    for path in (other, text):
        with pytest.raises(CacheError, match="cannot use .* as xrl's timing cache"):
            OpTimingCache(path).get("k", "d")
    try:  # a truncated file: sqlite may read what is left, or refuse it; never an internal error
        OpTimingCache(truncated).get("k", "d")
    except CacheError:
        pass


def test_an_insane_timing_is_not_stored(cache_path: Path) -> None:
    cache = OpTimingCache(cache_path)
    for bad in (Measurement(-1.0, 3, 0.1, -1.0, -1.0), Measurement(float("nan"), 3, 0.1, 1.0, 1.0),
                Measurement(1e30, 3, 0.1, 1e30, 1e30), Measurement(1e-3, 3, 0.1, 0.0, 1e-3)):
        cache.put("k", "d", "{}", bad)
        assert cache.get("k", "d") is None


def test_past_the_deadline_new_kernels_fall_back_to_the_scaled_roofline(cache_path: Path) -> None:
    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    m.cost(mlp())  # some kernels timed: the fallback's scale comes from them
    m.deadline = 0.0  # long past
    g = from_onnx(graphs.build("tiny_cnn"), name="tiny_cnn")
    c = m.cost(g)
    assert c > 0 and m.report()["fallback_kernels"] > 0
    assert "costed by the scaled roofline" in m.describe()


def test_cuda_path_times_with_the_cuda_provider_at_the_session_boundary(monkeypatch, cache_path: Path) -> None:
    """A dry run of the CUDA path on a machine without a GPU (the real test is below): the model asks
    onnxruntime for the CUDA provider and binds its buffers on the device; the session is mocked."""
    import onnxruntime as ort

    import xrl.cost.devices as devices
    import xrl.cost.ort as ort_cost

    asked: list[tuple] = []
    real_session = ort.InferenceSession

    def session(model, so, providers):
        asked.append(tuple(providers))
        return real_session(model, so, providers=["CPUExecutionProvider"])

    def runner(sess, feeds, *, cuda):
        assert cuda  # the device path: inputs and outputs bound on the GPU
        return lambda: sess.run(None, feeds)

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(ort_cost, "session_runner", runner)
    monkeypatch.setattr(devices, "gpu_model_names", lambda *a, **k: ["NVIDIA H100 80GB HBM3"])
    m = MeasuredKernelCostModel(target="ort-cuda", cache_path=cache_path, **FAST)
    assert m.cost(mlp()) > 0
    assert asked and all(p[0] == "CUDAExecutionProvider" for p in asked)
    assert m.device_id.startswith("ort=") and "|cuda|" in m.device_id and "H100" in m.device_id


@pytest.mark.skipif("CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers()
                    or not __import__("xrl.cost.devices", fromlist=["x"]).gpu_model_names(),
                    reason="needs onnxruntime-gpu and an NVIDIA GPU")
def test_cuda_kernels_are_timed_on_the_gpu(cache_path: Path) -> None:
    m = MeasuredKernelCostModel(target="ort-cuda", cache_path=cache_path, **FAST)
    c = m.cost(from_onnx(graphs.build("tiny_cnn"), name="tiny_cnn"))
    assert c > 0 and m.report()["kernels_measured"] > 0 and m.report()["fallback_kernels"] == 0


def test_reorder_conversions_are_taken_off_a_lone_convolution(cache_path: Path) -> None:
    """A CPU convolution alone pays two NCHWc layout conversions that the whole graph does not: they are
    found in the kernel's optimised model and each is timed on its own, to be taken off the kernel."""
    g = from_onnx(graphs.build("tiny_cnn"), name="tiny_cnn")
    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    plan, kernels = runtime_plan(g)
    # a convolution of 16 channels or more (the first one, of 3 channels, reads NCHW directly: no ReorderInput)
    conv = next(k for k in kernels if k.anchor.op == "Conv" and k.nodes
                and plan.type_of(k.anchor.inputs[0]).shape[1] >= 16)
    prepared = m._prepare(kernel_model(conv, plan).graph)
    assert prepared is not None and len(prepared.reorders) == 2  # one in, one out
    assert all(len(shape) == 4 for shape in prepared.reorders)
    # each conversion pair is timed alone; its cost is net of the run's fixed overhead, which for tiny_cnn's small
    # tensors can round it to 0 on a loaded machine (a fresh clone's suite once saw that)
    assert all(m._reorder_s(shape) >= 0 for shape in prepared.reorders)
    assert m._timing and all(t.median_s > 0 for t in m._timing.values())
    # a kernel onnxruntime does not convert (a MatMul) has none
    mm = next(k for k in runtime_plan(mlp())[1] if k.nodes)
    assert m._prepare(kernel_model(mm, runtime_plan(mlp())[0]).graph).reorders == []


def test_env_and_cache_dir_defaults(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XRL_TARGET_COST")
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path))
    m = get_cost_model("target", target="ort-cpu")
    assert Path(m.cache.path) == tmp_path / "kernel_costs.sqlite"
    monkeypatch.setenv("XRL_TARGET_COST", "bogus")
    with pytest.raises(Exception, match="unknown kernel timing 'bogus'"):
        get_cost_model("target", target="ort-cpu")
    assert os.environ["XRL_CACHE_DIR"] == str(tmp_path)


def test_the_model_pickles_without_its_open_sessions(cache_path: Path) -> None:
    import pickle

    m = MeasuredKernelCostModel(target="ort-cpu", cache_path=cache_path, **FAST)
    c = m.cost(mlp())
    copy = pickle.loads(pickle.dumps(m))
    assert copy.cost(mlp()) == c and copy.cost(from_onnx(graphs.build("tiny_cnn"), name="tiny_cnn")) > 0

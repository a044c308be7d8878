"""The CLI contract: results on stdout, user errors as one line on stderr with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper, numpy_helper

from xrl.cli import main


def small_model(dynamic: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w2")
    x_shape = ["batch", 8] if dynamic else [4, 8]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
        helper.make_node("Relu", ["a"], ["ra"], name="relu"),
        helper.make_node("Add", ["ra", "b"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "small.onnx"
    onnx.save(small_model(), p)
    return p


def test_missing_file(capsys, tmp_path):
    code, _, err = run(capsys, "info", str(tmp_path / "nope.onnx"))
    assert_user_error(code, err, "nope.onnx", "no such file")


def test_not_onnx(capsys, tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\n")
    code, _, err = run(capsys, "info", str(p))
    assert_user_error(code, err, "not a valid ONNX model")


def test_truncated_protobuf(capsys, tmp_path, model_file):
    data = model_file.read_bytes()
    p = tmp_path / "truncated.onnx"
    p.write_bytes(data[: len(data) // 2])
    code, _, err = run(capsys, "cost", str(p))
    assert_user_error(code, err, "truncated.onnx")


def test_cycle(capsys, tmp_path):
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")]
    graph = helper.make_graph(nodes, "cyc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])])
    p = tmp_path / "cycle.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p)
    code, _, err = run(capsys, "info", str(p))
    assert_user_error(code, err, "cycle")


def test_unknown_builtin(capsys):
    code, _, err = run(capsys, "info", "bertt")
    assert_user_error(code, err, "bertt", "bert")


def test_dynamic_shape_needs_input_shape(capsys, tmp_path):
    p = tmp_path / "dyn.onnx"
    onnx.save(small_model(dynamic=True), p)
    code, _, err = run(capsys, "info", str(p))
    assert_user_error(code, err, "'x'", "--input-shape x=")
    code, out, err = run(capsys, "info", str(p), "--input-shape", "x=3,8", "--json")
    assert code == 0, err
    assert json.loads(out)["inputs"] == {"x": [3, 8]}


def test_bad_input_shape_option(capsys, model_file):
    code, _, err = run(capsys, "info", str(model_file), "--input-shape", "x=three")
    assert_user_error(code, err, "--input-shape")


def test_output_would_overwrite_input(capsys, model_file):
    before = model_file.read_bytes()
    code, _, err = run(capsys, "optimize", str(model_file), "--search", "none", "-o", str(model_file))
    assert_user_error(code, err, "input model")
    assert model_file.read_bytes() == before


def test_existing_output_needs_force(capsys, model_file, tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"precious")
    code, _, err = run(capsys, "optimize", str(model_file), "--search", "none", "-o", str(out))
    assert_user_error(code, err, "--force")
    assert out.read_bytes() == b"precious"


def test_failed_load_leaves_no_output(capsys, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    out = tmp_path / "out.onnx"
    code, _, err = run(capsys, "optimize", str(bad), "-o", str(out))
    assert code == 2
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]


def test_debug_shows_traceback(capsys, tmp_path):
    code, _, err = run(capsys, "--debug", "info", str(tmp_path / "nope.onnx"))
    assert code == 2 and "Traceback" in err


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["cost", "bert", "--cost", "magic"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "magic" in err


def test_round_trip_json(capsys, model_file, tmp_path):
    out = tmp_path / "rt.onnx"
    code, stdout, err = run(capsys, "optimize", str(model_file), "--search", "none", "-o", str(out), "--json")
    assert code == 0, err
    res = json.loads(stdout)
    for key in ("input", "search", "cost_model", "original_cost", "optimized_cost", "speedup", "rewrites", "time_s",
                "verified", "max_abs_err", "output"):
        assert key in res
    assert res["verified"] is True and res["max_abs_err"] < 1e-5 and res["rewrites"] == 0
    assert res["speedup"] == pytest.approx(1.0)
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_info_and_cost_builtin(capsys):
    code, out, err = run(capsys, "info", "mlp", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["nodes"] == sum(info["ops"].values()) and info["flops"] > 0
    code, out, err = run(capsys, "cost", "mlp", "--device", "a100", "--json")
    assert code == 0, err
    assert json.loads(out)["cost_s"] > 0


def test_graphs_export(capsys, tmp_path):
    out = tmp_path / "tiny.onnx"
    code, _, err = run(capsys, "graphs", "export", "tiny_cnn", "-o", str(out))
    assert code == 0, err
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_rl_sampling_option(capsys):
    code, out, err = run(capsys, "optimize", "mlp", "--search", "rl", "--samples", "2", "--json")
    assert code == 0, err
    res = json.loads(out)
    # >= 1 up to the estimate's resolution: the onnxslim pre-pass writes MatMul+Add as Gemm (same kernels)
    assert res["verified"] and res["details"]["rollouts"] == 3 and res["speedup"] >= 0.999
    code, _, err = run(capsys, "optimize", "mlp", "--search", "greedy", "--samples", "2")
    assert_user_error(code, err, "--search rl")


def test_device_cuda_without_a_gpu_is_a_user_error(capsys):
    from xrl.cost.devices import gpu_model_names

    if gpu_model_names():
        pytest.skip("this machine has an NVIDIA GPU")
    code, _, err = run(capsys, "cost", "mlp", "--device", "cuda")
    assert_user_error(code, err, "no NVIDIA GPU")


def test_graphs_list_redraws_its_progress_only_on_a_terminal(capsys):
    """Piped or logged, stderr gets no carriage-return counter ("1 graphs built2 graphs built..."): only the table."""
    assert main(["graphs", "list", "--suite", "small"]) == 0
    out, err = capsys.readouterr()
    assert "graphs built" not in err and "\r" not in err
    assert "tiny_cnn" in out and "mlp" in out

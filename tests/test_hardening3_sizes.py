"""Issue 34 item 2: every tensor's declared size (dims, and external data's length) is checked against
XRL_MAX_ELEMENTS before any of it is read, with the one-line error inputs get.

The 3 GiB external file is sparse (`truncate`: made at once, no disk used); onnx's reader of external data
is replaced by one that fails the test, so each refusal is shown to come before anything is read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper, numpy_helper

from xrl import api
from xrl.limits import TensorTooLargeError

GIB = 1 << 30


@pytest.fixture
def no_external_reads(monkeypatch):
    """onnx.load may not read any external data in these tests."""
    import onnx.external_data_helper as edh

    def never(*_a, **_k):  # noqa: ANN202
        raise AssertionError("external data was read before the sizes were checked")

    monkeypatch.setattr(onnx, "load_external_data_for_model", never)
    monkeypatch.setattr(edh, "load_external_data_for_model", never)
    monkeypatch.setattr(edh, "load_external_data_for_tensor", never)


def external_weight(name: str, dims: list[int], location: str, *, length: int | None, offset: int = 0
                    ) -> TensorProto:
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", None if length is None else str(length))):
        if v is not None:
            e = t.external_data.add()
            e.key, e.value = k, v
    return t


def matmul_model(tmp_path: Path, weight: TensorProto, k: int, n: int, data_bytes: int) -> Path:
    """y = x W, with W external in a sparse file of `data_bytes` bytes."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", weight.name], ["y"])], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [weight])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "big.onnx"
    path.write_bytes(model.SerializeToString())
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(data_bytes)  # sparse: nothing is written
    return path


def test_a_weight_declaring_805m_elements_in_a_sparse_3gib_file_is_refused_at_once(capsys, tmp_path: Path,
                                                                                   no_external_reads):
    k, n = 4096, 196_608  # 805M float32 elements: 3 GiB
    path = matmul_model(tmp_path, external_weight("W", [k, n], "w.bin", length=k * n * 4), k, n, 3 * GIB)
    assert os.stat(tmp_path / "w.bin").st_size == 3 * GIB
    t0 = time.perf_counter()
    code, _, err = run(capsys, "optimize", str(path), "-o", str(tmp_path / "o.onnx"))
    elapsed = time.perf_counter() - t0
    assert_user_error(code, err, "weight 'W' (shape 4096,196608) has 805,306,368 elements", "XRL_MAX_ELEMENTS")
    assert elapsed < 1.0, elapsed
    with pytest.raises(TensorTooLargeError):
        api.optimize(str(path))


def test_external_data_longer_than_the_limit_is_refused_whatever_the_dims(capsys, tmp_path: Path,
                                                                          no_external_reads):
    path = matmul_model(tmp_path, external_weight("W", [4, 4], "w.bin", length=3 * GIB), 4, 4, 3 * GIB)
    code, _, err = run(capsys, "info", str(path))
    assert_user_error(code, err, "weight 'W'", "external data 'w.bin'", "over xrl's limit")
    # no length: the rest of the file is what onnx would read
    path = matmul_model(tmp_path, external_weight("W", [4, 4], "w.bin", length=None, offset=64), 4, 4, 3 * GIB)
    code, _, err = run(capsys, "info", str(path))
    assert_user_error(code, err, "external data 'w.bin'", "over xrl's limit")


def test_inline_and_attribute_tensors_are_checked_by_their_dims(capsys, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XRL_MAX_ELEMENTS", "1000")
    big = numpy_helper.from_array(np.zeros((40, 40), np.float32), "W")  # 1600 elements, inline
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])], [big])
    path = tmp_path / "inline.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    code, _, err = run(capsys, "info", str(path))
    assert_user_error(code, err, "weight 'W' (shape 40,40) has 1,600 elements")
    # a Constant's value declaring 10^12 elements with no data at all
    value = TensorProto()
    value.name, value.data_type = "c", TensorProto.FLOAT
    value.dims.extend([10**6, 10**6])
    g = helper.make_graph([helper.make_node("Constant", [], ["c"], value=value),
                           helper.make_node("Add", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "constant.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                     .SerializeToString())
    code, _, err = run(capsys, "info", str(path))
    assert_user_error(code, err, "(shape 1000000,1000000) has 1,000,000,000,000 elements")


def test_a_model_within_the_limit_with_external_data_loads(tmp_path: Path):
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = numpy_helper.from_array(w, "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [t])
    path = tmp_path / "ok.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path,
              save_as_external_data=True, all_tensors_to_one_file=True, location="ok.bin", size_threshold=0)
    from xrl.frontends.loader import load_model

    loaded = load_model(str(path))
    assert np.array_equal(loaded.graph.initializers["W"], w)

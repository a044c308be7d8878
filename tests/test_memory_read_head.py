"""Issue 35, item 1: an .onnx file read one weight at a time (`onnx_weights.read_head`), so that loading a model and
reading its reference again never hold the file's bytes and a model with every weight beside the IR."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xrl.frontends.loader import load_model
from xrl.frontends.onnx_weights import in_memory, materialize, read_head


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    h = numpy_helper.from_array(rng.standard_normal((64,)).astype(np.float16), "h")  # 128 bytes: stays inline
    i = numpy_helper.from_array(np.arange(512, dtype=np.int64), "i")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Cast", ["h"], ["hf"], to=1),
             helper.make_node("Add", ["m", "hf"], ["y"]), helper.make_node("Shape", ["i"], ["s"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [1])], [w, h, i])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="t")
    model.metadata_props.add(key="k", value="v")  # a field after the graph's
    return model


def test_read_head_gives_the_model_byte_for_byte(tmp_path) -> None:
    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    head, weights = read_head(str(path))
    assert set(weights) == {"w", "i"} and all(in_memory(t) for t in head.graph.initializer if t.name in weights)
    assert head.ByteSize() < 2_000
    assert materialize(head, weights).SerializeToString() == model.SerializeToString()
    whole, none = read_head(str(path), whole=True)
    assert not none and whole.SerializeToString() == model.SerializeToString()
    like = {"w": numpy_helper.to_array(model.graph.initializer[0]).copy(), "i": np.zeros(512, dtype=np.int64)}
    _, again = read_head(str(path), like=like)
    assert again["w"] is like["w"] and again["i"] is not like["i"]  # equal bytes: the array given; else read


def test_loading_a_file_builds_no_model_with_its_weights(tmp_path, monkeypatch) -> None:
    """The import takes the arrays read one at a time (onnx.load is not called), and the reference read again is
    the same model; a file that is not a protobuf still fails as before, with ModelLoadError."""
    from xrl.errors import ModelLoadError
    from xrl.frontends.verify import compare_models

    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    real = onnx.load
    with monkeypatch.context() as m:
        m.setattr(onnx, "load", lambda *a, **k: pytest.fail("onnx.load read the whole file"))
        loaded = load_model(str(path))
        head, weights = loaded.reference_head()
        assert weights["w"] is loaded.graph.initializers["w"]  # the IR's own array: one copy
        again = loaded.reference
    assert again.SerializeToString() == model.SerializeToString()
    assert compare_models(model, materialize(head, weights), trials=1).ok
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 64)
    monkeypatch.setattr(onnx, "load", real)
    with pytest.raises(ModelLoadError):
        load_model(str(bad))


def test_a_file_with_external_data_is_read_by_onnx(tmp_path, monkeypatch) -> None:
    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=1024)
    calls = []
    real = onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    loaded = load_model(str(path))
    assert calls and len(loaded.graph.initializers) >= 2  # the reader saw external tensors: onnx.load read it
    head, weights = loaded.reference_head()
    assert set(weights) == {"w", "i"} and head.ByteSize() < 2_000

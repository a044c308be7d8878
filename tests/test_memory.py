"""Peak memory of `xrl optimize` (issue 26 item 9): the stages that used to copy every weight no longer do.

The whole-run figures are a benchmark (experiments/bench_memory.py); these are the unit-level facts it
rests on, fast and independent of how loaded the machine is.
"""

from __future__ import annotations

import weakref

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xrl.frontends import verify
from xrl.frontends.onnx_io import from_onnx, shared_weight, to_onnx


def _mlp(hidden: int = 256, layers: int = 3, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((hidden, hidden)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, hidden])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_reimported_export_shares_the_weights_it_did_not_change():
    # the file a search writes is exported and imported again to cost and time it: no second copy
    g = from_onnx(_mlp())
    again = from_onnx(to_onnx(g))
    assert set(again.initializers) == set(g.initializers)
    for k, arr in g.initializers.items():
        assert np.shares_memory(again.initializers[k], arr), k
        assert not again.initializers[k].flags.writeable


def test_shared_weights_are_equal_bytes_not_equal_values():
    a = np.zeros((128, 128), np.float32)
    kept = shared_weight(a)
    assert shared_weight(a.copy()) is kept
    b = a.copy()
    b[5, 7] = -0.0  # equal as a value, not as bytes: the written model must keep its sign
    assert shared_weight(b) is not kept
    small = np.zeros(4, np.float32)  # below the threshold: not worth a lookup
    assert shared_weight(small) is small


def test_an_export_builds_the_model_once():
    # helper.make_model copied the whole GraphProto, weights included; the export fills the model in place
    m = to_onnx(from_onnx(_mlp()))
    rebuilt = helper.make_model(m.graph, opset_imports=list(m.opset_import), producer_name="xrl",
                                ir_version=m.ir_version)
    assert m.SerializeToString() == rebuilt.SerializeToString()


def test_verification_holds_one_session_at_a_time(monkeypatch):
    # each session holds a copy of its model's weights: the reference's is dropped before the candidate's opens
    made: list[weakref.ref] = []
    open_session = verify._session

    def tracked(model, providers, role="model", external=None):  # noqa: ANN001
        assert all(r() is None for r in made), f"a session was still alive when the {role}'s opened"
        session = open_session(model, providers, role, external)
        made.append(weakref.ref(session))
        return session

    monkeypatch.setattr(verify, "_session", tracked)
    ref = _mlp()
    result = verify.compare_models(ref, to_onnx(from_onnx(ref)), trials=2)
    assert result.ok, result.detail
    assert len(made) == 2


def test_verification_still_catches_a_wrong_candidate():
    ref = _mlp()
    wrong = _mlp(seed=1)
    result = verify.compare_models(ref, wrong, trials=2)
    assert not result.ok
    assert "output 0" in result.detail


def test_external_data_save_neither_changes_nor_copies_the_callers_model(tmp_path, monkeypatch):
    # a model loaded with onnx.load has data_location set to DEFAULT explicitly: it is still moved out, and
    # the caller's model is not rewritten (protobuf keeps a cleared field's memory: moving the bytes out and
    # back grew the model by its weights on every save)
    from xrl.frontends import onnx_io

    src = tmp_path / "src.onnx"
    onnx.save(_mlp(), str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="src.data")
    model = onnx.load(str(src))
    assert all(t.HasField("data_location") for t in model.graph.initializer)
    before = model.SerializeToString()
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_THRESHOLD", 1)
    out = onnx_io.save_onnx(model, tmp_path / "out.onnx")
    assert model.SerializeToString() == before
    head = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in head.graph.initializer)
    again = onnx.load(str(out))
    for a, b in zip(model.graph.initializer, again.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))

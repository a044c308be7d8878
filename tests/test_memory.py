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
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.frontends.onnx_weights import shared_weight


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
    from xrl.frontends import onnx_write

    src = tmp_path / "src.onnx"
    onnx.save(_mlp(), str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="src.data")
    model = onnx.load(str(src))
    assert all(t.HasField("data_location") for t in model.graph.initializer)
    before = model.SerializeToString()
    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 1)
    out = onnx_write.save_onnx(model, tmp_path / "out.onnx")
    assert model.SerializeToString() == before
    head = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in head.graph.initializer)
    again = onnx.load(str(out))
    for a, b in zip(model.graph.initializer, again.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


# ----- one copy of each weight: heads, sessions, the reference, the pre-pass child ---------------
def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def test_an_export_head_holds_no_weight_bytes_and_round_trips_without_copies(tmp_path):
    from xrl.frontends.onnx_weights import materialize
    from xrl.frontends.onnx_write import save_onnx

    g = from_onnx(_mlp())
    full = to_onnx(g)
    weights: dict = {}
    head = to_onnx(g, external=weights)
    assert head.ByteSize() < _weight_bytes(full) / 100
    assert set(weights) == set(g.initializers)
    assert all(np.shares_memory(weights[k], g.initializers[k]) for k in weights)  # the graph's own arrays
    assert materialize(head, weights).SerializeToString() == full.SerializeToString()
    again = from_onnx(head, external=weights)
    assert again.canonical_hash == from_onnx(full).canonical_hash
    assert all(again.initializers[k] is weights[k] or np.shares_memory(again.initializers[k], weights[k])
               for k in weights)
    out = save_onnx(head, tmp_path / "m.onnx", weights)  # written from the arrays, read back as the model
    assert onnx.load(str(out)).SerializeToString() == full.SerializeToString()


def test_sessions_are_given_the_weights_apart_not_inside_the_serialised_model(monkeypatch):
    # onnxruntime copies each array once; the model it parses is the head (serialising the whole model held
    # its bytes three times while the session opened: the bytes, onnxruntime's protobuf, its tensors)
    import onnxruntime as ort

    from xrl.cost.ort import OrtCostModel

    parsed: list[int] = []
    real = ort.InferenceSession

    def spy(model, *a, **k):  # noqa: ANN001
        parsed.append(len(model) if isinstance(model, bytes) else -1)
        return real(model, *a, **k)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    ref = _mlp()
    weights = _weight_bytes(ref)
    g = from_onnx(ref)
    OrtCostModel(device="cpu", warmup=1, repeats=1, threads=1, cache=False).measure(g)
    assert verify.compare_models(ref, to_onnx(g), trials=1).ok
    assert len(parsed) == 3 and all(0 < n < weights / 100 for n in parsed), parsed


def test_verifying_against_stored_reference_outputs_matches_verifying_against_the_model():
    ref, cand, wrong = _mlp(), to_onnx(from_onnx(_mlp())), _mlp(seed=1)
    stored = verify.reference_run(ref, like=from_onnx(ref), seed=3, trials=2)
    for c in (cand, wrong):
        a, b = verify.compare_models(stored, c), verify.compare_models(ref, c, seed=3, trials=2)
        assert (a.ok, a.max_abs_err, a.trials) == (b.ok, b.max_abs_err, b.trials)
    weights: dict = {}
    head = to_onnx(from_onnx(ref), external=weights)
    assert verify.compare_models(stored, head, external=weights).ok
    assert verify.compare_models(stored, from_onnx(ref)).ok  # an IR graph, exported on the way


def test_loaded_model_lets_go_of_the_reference_it_can_make_again(tmp_path):
    from xrl.frontends.loader import load_model

    built = load_model("mlp")
    first = built.take_reference()
    assert not built.holds_reference  # the builder makes it again when asked
    assert built.reference.SerializeToString() == first.SerializeToString()
    path = tmp_path / "m.onnx"
    onnx.save(_mlp(), str(path))
    loaded = load_model(str(path))
    assert not loaded.holds_reference  # a file is read again when wanted, not kept beside the IR
    assert loaded.reference.SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_optimize_holds_no_copy_of_the_original_model_while_it_searches(monkeypatch):
    # the original's outputs are taken once; its model (a second copy of every weight) is gone by the search
    import gc

    import xrl.api as api
    from xrl.frontends.loader import load_model

    gc.collect()
    # models other tests left alive in this process (module caches) are not this run's copies
    earlier = {id(o) for o in gc.get_objects() if type(o) is onnx.ModelProto}
    loaded = load_model("mlp")
    weights = _weight_bytes(loaded.reference)
    seen: list[int] = []
    real = api.run_search

    def spy(*a, **k):  # noqa: ANN002, ANN003
        gc.collect()
        seen.append(max((sum(len(t.raw_data) for t in o.graph.initializer) for o in gc.get_objects()
                         if type(o) is onnx.ModelProto and id(o) not in earlier), default=0))
        return real(*a, **k)

    monkeypatch.setattr("xrl.deploy.search.run_search", spy)  # the search stage's
    res = api.optimize(loaded, search="greedy", cost="analytic", guard=False, time_limit=5, prepass=())
    assert res.verified and seen
    assert max(seen) < weights / 2, (max(seen), weights)
    assert res.model is not None and verify.compare_models(load_model("mlp").reference, res.model, trials=1).ok


def test_the_onnxslim_child_changes_its_own_forked_model_instead_of_a_copy(monkeypatch):
    from xrl.frontends import prepass

    real = prepass.copy.deepcopy

    def no_copies(x, *a):  # noqa: ANN001, ANN002
        if isinstance(x, onnx.ModelProto):
            raise AssertionError("deepcopy of the model in the pre-pass child")
        return real(x, *a)

    monkeypatch.setattr(prepass.copy, "deepcopy", no_copies)
    out, reports = prepass.run_prepasses(_mlp(), ["onnxslim"], time_limit=60)
    assert not any("deepcopy" in r.detail for r in reports), reports


def test_when_the_guard_keeps_the_original_it_is_written_from_the_irs_arrays(tmp_path, monkeypatch):
    # the original is read again to be written, checked against its stored outputs, and written from the
    # IR's byte-equal arrays: no model with the weights is held while the file is written
    import gc

    import xrl.api as api
    import xrl.cost.guard as guard
    from xrl.frontends import onnx_write

    src = tmp_path / "in.onnx"
    onnx.save(_mlp(), str(src))
    monkeypatch.setattr(guard, "measure_guard", lambda *a, **k: guard.GuardResult(guard.ORIGINAL, "forced", {}, 0, 0.0))
    held: list[int] = []
    real = onnx_write.save_onnx

    def spy(model, path, external=None):  # noqa: ANN001
        gc.collect()
        held.append(max((sum(len(t.raw_data) for t in o.graph.initializer) for o in gc.get_objects()
                         if type(o) is onnx.ModelProto), default=0))
        return real(model, path) if external is None else real(model, path, external)

    monkeypatch.setattr(onnx_write, "save_onnx", spy)
    out = tmp_path / "out.onnx"
    res = api.optimize(str(src), output=out, search="greedy", cost="analytic", target="ort-cpu", guard=True,
                       time_limit=5, prepass=())
    assert res.guard.chosen == "original" and res.verified
    assert held and held[0] < _weight_bytes(_mlp()) / 2, held
    assert onnx.load(str(out)).SerializeToString() == onnx.load(str(src)).SerializeToString()


def test_a_head_past_the_external_data_threshold_is_written_from_its_arrays(tmp_path, monkeypatch):
    from xrl.frontends import onnx_write

    g = from_onnx(_mlp())
    full = to_onnx(g)
    weights: dict = {}
    head = to_onnx(g, external=weights)
    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 1)
    out = onnx_write.save_onnx(head, tmp_path / "big.onnx", weights)
    again = onnx.load(str(out))
    for a, b in zip(full.graph.initializer, again.graph.initializer):
        assert a.name == b.name
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    try:
        onnx_write.save_onnx(head, tmp_path / "lost.onnx")  # a head without its arrays is not a model
    except Exception as e:  # noqa: BLE001
        assert "kept apart" in str(e)
    else:
        raise AssertionError("a head was written without its weights")

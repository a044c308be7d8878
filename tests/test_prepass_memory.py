"""Issue 35, item 1: pre-passes without extra copies of the model's weights.

A pre-pass child is a fork: it reads the parent's model where the parent holds it, and nothing the parent sends
it is a serialised model (spawn or forkserver would pickle the whole proto). The shape inference that types a
fused model's contrib ops runs on a weight-stripped copy (shapes, not values), and only its types come back.
"""

from __future__ import annotations

import multiprocessing.reduction
import pickle

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xrl.frontends import prepass


def _big_mlp(n: int = 512) -> onnx.ModelProto:
    """Two MatMuls over 2 x n x n float32 weights (2 MiB at n 512), with a Reshape whose target is a constant."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "w2")
    shape = numpy_helper.from_array(np.array([1, 2, n], dtype=np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "big_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_no_pre_pass_child_receives_a_serialised_copy_of_the_weights(monkeypatch) -> None:
    model = _big_mlp()
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    sent: list[int] = []
    dumps = multiprocessing.reduction.ForkingPickler.dumps

    def counted(obj, protocol=None):  # noqa: ANN001, ANN202
        data = dumps(obj, protocol)
        sent.append(len(data))
        return data

    real_pickle = pickle.dumps

    def counted_pickle(obj, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        data = real_pickle(obj, *a, **k)
        sent.append(len(data))
        return data

    monkeypatch.setattr(multiprocessing.reduction.ForkingPickler, "dumps", classmethod(
        lambda cls, obj, protocol=None: counted(obj, protocol)))
    monkeypatch.setattr(pickle, "dumps", counted_pickle)

    def reads_weights(m: onnx.ModelProto):  # the child sees the parent's object itself, weights and all
        assert m is model_in_parent
        return m, f"{sum(len(t.raw_data) for t in m.graph.initializer)} weight bytes"

    model_in_parent = model
    monkeypatch.setitem(prepass.PASSES, "reader", prepass.Prepass(reads_weights))
    out, detail = prepass._run_bounded("reader", model, 60.0)
    assert out is model and detail == f"{weights} weight bytes"
    assert max(sent, default=0) < weights // 100, sent  # the parent serialised nothing model-sized
    out, _ = prepass._run_bounded("onnxslim", model, 60.0)  # a real pass, its result back by file
    assert max(sent, default=0) < weights // 100, sent


def test_shape_inference_runs_on_a_weight_stripped_copy() -> None:
    model = _big_mlp()
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    lite = prepass.weight_stripped(model)
    assert lite.ByteSize() < weights // 100
    assert {t.name for t in lite.graph.initializer} == {"shape"}  # small shape-like values stay
    assert {"w1", "w2"} <= {v.name for v in lite.graph.input}
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    prepass._infer_shapes_without_weights(typed)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in typed.graph.value_info}
    assert shapes["h"] == [2, 512] and shapes["m"] == [2, 512]
    assert [d.dim_value for d in typed.graph.output[0].type.tensor_type.shape.dim] == [1, 2, 512]
    assert [t.raw_data for t in typed.graph.initializer] == [t.raw_data for t in model.graph.initializer]


def test_passes_on_weights_moved_to_disk_give_what_they_give_in_memory() -> None:
    """In a child, onnxruntime's transformers optimizer and onnxslim read the weights from a file in the scratch
    folder (`_weights_to_disk`): the result must hold the same nodes and compute the same as the in-process
    run on the model in memory."""
    from xrl import graphs
    from xrl.frontends.verify import compare_models

    model = graphs.build("fam_attn_bert_ts")
    for name in ("ort-transformers", "onnxslim"):
        in_memory, _ = prepass._run_bounded(name, model, None)
        in_child, _ = prepass._run_bounded(name, model, 120.0)
        assert prepass.histogram(in_child) == prepass.histogram(in_memory), name
        assert all(t.data_location != TensorProto.EXTERNAL for t in in_child.graph.initializer)
        assert compare_models(model, in_child, trials=1).ok, name


def test_onnxslim_runs_on_the_weights_stripped_and_restores_them(monkeypatch) -> None:
    """onnxslim's graph-surgeon import materialises every constant for folding and again for export, on each of
    its rounds: it gets no initialiser over `_SHAPES_ONLY_ELEMENTS` elements (the weights are graph inputs while
    it runs), and its result has every weight back by name, byte for byte, in the child as in process."""
    import onnxslim

    from xrl.frontends.verify import compare_models

    model = _big_mlp()
    model.graph.input.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, [512, 512]))  # overridable
    seen: list[int] = []
    real = onnxslim.slim

    def recording(m: onnx.ModelProto, *a, **k):  # noqa: ANN002, ANN003, ANN202
        seen.append(max((prepass._elements(t) for t in m.graph.initializer), default=0))
        return real(m, *a, **k)

    monkeypatch.setattr(onnxslim, "slim", recording)
    out, _ = prepass._onnxslim(model)  # in process: the same stripping as in the child
    assert seen and max(seen) <= prepass._SHAPES_ONLY_ELEMENTS, seen
    monkeypatch.setattr(onnxslim, "slim", real)
    for result in (out, prepass._run_bounded("onnxslim", model, 60.0)[0]):  # in process, and from a child
        weights = {t.name: t for t in result.graph.initializer}
        assert weights["w1"].raw_data == model.graph.initializer[0].raw_data
        assert weights["w2"].raw_data == model.graph.initializer[1].raw_data
        assert [v.name for v in result.graph.input] == ["x", "w2"]  # w1 is no input again; w2 stays declared
        assert all(t.data_location != TensorProto.EXTERNAL for t in result.graph.initializer)
        assert compare_models(model, result, trials=1).ok


def _renames_w2(m: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """A pass that writes a weight again under a new name (its bytes in the result's own file), keeps w1 and
    removes the Identity."""
    import os

    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(m, os.getcwd())  # in the child: its weights from the child's own file
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for t in out.graph.initializer:
        if t.name == "w2":
            t.name = "w2_again"
    kept = [n for n in out.graph.node if n.op_type != "Identity"]  # and changes a node, so that it counts
    for n in kept:
        n.input[:] = [{"w2": "w2_again", "r2": "r"}.get(v, v) for v in n.input]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out, "renamed"


def test_pre_passes_on_a_head_hold_the_unchanged_weights_once(monkeypatch) -> None:
    """`run_prepasses_on_head`: the child writes the weights from the parent's arrays, and its result comes back as
    a head whose unchanged weights are those arrays themselves (a weight where the child wrote it: no byte read
    back; one the pass wrote again: read alone and interned), with no model holding the weights loaded in the
    parent; the result computes what the model computes."""
    from xrl.frontends.onnx_io import from_onnx
    from xrl.frontends.onnx_weights import in_memory, materialize, split_model
    from xrl.frontends.verify import compare_models

    model = _big_mlp()
    ident = helper.make_node("Identity", ["r"], ["r2"])  # for onnxslim to remove
    model.graph.node.insert(2, ident)
    model.graph.node[3].input[0] = "r2"
    graph = from_onnx(model)
    head, weights = split_model(model, like=graph.initializers)
    assert weights["w1"] is graph.initializers["w1"]
    monkeypatch.setitem(prepass.PASSES, "renames", prepass.Prepass(_renames_w2))
    checked = []
    for chain, w2 in ((["onnxslim"], "w2"), (["renames"], "w2_again")):
        with monkeypatch.context() as m:
            m.setattr(onnx, "load_external_data_for_model", None)  # the parent reads no model's weights whole
            out, arrays, reports = prepass.run_prepasses_on_head(
                head, weights, chain, time_limit=60, check=lambda h, e: checked.append(from_onnx(h, external=e)))
        assert reports[0].applied, reports
        assert all(in_memory(t) for t in out.graph.initializer if t.name in arrays)
        assert arrays["w1"] is weights["w1"] and arrays[w2] is weights["w2"]
        assert compare_models(model, materialize(out, arrays), trials=1).ok
    assert len(checked) == 2


def test_onnxscript_on_a_head_maps_the_weights_and_gives_what_it_gives_in_memory() -> None:
    """onnxscript's child on a head: its IR maps the weights from the child's file and writes its result's to a
    file (no model holding them in the child); the result has the nodes the in-memory run gives and verifies."""
    from xrl.graphs import families as F

    from xrl.frontends.onnx_io import from_onnx
    from xrl.frontends.onnx_weights import materialize, split_model
    from xrl.frontends.verify import compare_models

    model = F.build_onnx("attn_bert", "full", "ts")
    assert max(len(t.raw_data) for t in model.graph.initializer) >= prepass._TO_DISK_BYTES  # some go to the file
    in_memory, _ = prepass._run_bounded("onnxscript", model, None)
    head, weights = split_model(model, like=from_onnx(model).initializers)
    out, arrays, reports = prepass.run_prepasses_on_head(head, weights, ["onnxscript"], time_limit=120)
    assert reports[0].applied, reports
    assert prepass.histogram(out) == prepass.histogram(in_memory)
    assert compare_models(model, materialize(out, arrays), trials=1).ok


def test_a_head_over_the_protobuf_limit_still_gets_its_pre_passes(monkeypatch) -> None:
    """A full model past protobuf's 2 GiB cannot be serialised for a library and is skipped; a head's weights go
    to the child's file, so a model that large as a head is not (a 1e9-parameter decoder had every pass skipped)."""
    from xrl.frontends.onnx_weights import split_model

    monkeypatch.setattr(prepass, "_over_protobuf_limit", lambda m: True)  # as if the weights were 4 GB
    model = _big_mlp()
    _, full_reports = prepass.run_prepasses(model, ["onnxslim"], time_limit=60.0)
    assert full_reports[0].detail.startswith("skipped") and not full_reports[0].applied
    head, weights = split_model(model)
    _, _, reports = prepass.run_prepasses_on_head(head, weights, ["onnxslim"], time_limit=60.0)
    assert not reports[0].detail.startswith("skipped"), reports[0]
    assert reports[0].seconds > 0  # each pass's wall time is reported

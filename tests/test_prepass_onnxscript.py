"""onnxscript's `optimize_for_ort` as a pre-pass named `onnxscript` (issue 23, item 3): available by name, not
a default of any target; skipped with a reason where onnxscript is not installed; an output onnxruntime
rejects or that computes something else is a dropped pass, never an error."""

from __future__ import annotations

import sys

import onnx
import pytest

from xrl.api import load_model, optimize
from xrl.cost.targets import TARGETS
from xrl.frontends import prepass


def test_onnxscript_is_named_but_no_default():
    assert "onnxscript" in prepass.PREPASSES
    assert all("onnxscript" not in t.prepasses for t in TARGETS.values())


def test_missing_onnxscript_is_a_skipped_pass(monkeypatch):
    model = load_model("mlp").reference
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # `import onnxscript...` raises ImportError
    out, reports = prepass.run_prepasses(model, ["onnxscript"])
    assert out is model and not reports[0].applied and "not installed" in reports[0].detail
    # in the bounded child process too (it inherits the patched modules)
    _, reports = prepass.run_prepasses(model, ["onnxscript"], time_limit=30)
    assert not reports[0].applied and "not installed" in reports[0].detail


def test_a_rejected_output_is_a_dropped_pass(monkeypatch, tmp_path):
    """optimize_for_ort writes a contrib node onnxruntime will not run: the pass is dropped, xrl goes on."""
    pytest.importorskip("onnxscript")
    import onnxscript.ir as ir
    import onnxscript.rewriter.ort_fusions as fusions

    def rejected(model, *args, **kwargs):
        proto = ir.to_proto(model)
        node = proto.graph.node[0]
        node.op_type, node.domain = "MultiHeadAttention", prepass.CONTRIB_DOMAIN
        proto.opset_import.append(onnx.helper.make_opsetid(prepass.CONTRIB_DOMAIN, 1))
        return ir.from_proto(proto), {"mha": 1}

    monkeypatch.setattr(fusions, "optimize_for_ort", rejected)
    model = load_model("mlp").reference
    out, reports = prepass.run_prepasses(model, ["onnxscript"])
    assert out is model and not reports[0].applied and "cannot load" in reports[0].detail
    res = optimize("mlp", prepass=["onnxslim", "onnxscript"], output=str(tmp_path / "out.onnx"), time_limit=20)
    assert res.verified
    report = {r.name: r for r in res.prepasses}["onnxscript"]
    assert not report.applied and report.detail.startswith("dropped: ")


def test_onnxscript_prepass_fuses_a_bert_layer_and_verifies(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("torch")
    from xrl.graphs import families as F

    src = tmp_path / "bert.onnx"
    onnx.save(F.build_onnx("attn_bert", "small", "ts"), str(src))
    res = optimize(str(src), prepass=["onnxslim", "onnxscript"], output=str(tmp_path / "out.onnx"), force=True,
                   time_limit=30)
    assert res.verified and res.max_abs_err < 1e-3
    report = {r.name: r for r in res.prepasses}["onnxscript"]
    assert report.applied, report
    assert "skip_layer_normalization" in report.detail and report.nodes_after < report.nodes_before

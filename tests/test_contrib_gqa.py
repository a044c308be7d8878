"""onnxruntime's contrib GroupQueryAttention (com.microsoft) in xrl: the IR's numpy semantics of the op are
onnxruntime's CPU kernel's (a prompt without past: empty or zero-length past inputs, seqlens_k = sequence - 1,
total_sequence_length = sequence), it round-trips through import and export in its domain, only onnxruntime
targets run it, the rules of rewrite_rules/contrib_gqa.rules verify at 20 trials, and they fuse the llama
family's grouped-query causal attention (SDPA and eager, both exporters) into it, onnxruntime computing what the
original computes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from xrl.cost.targets import get_target
from xrl.errors import XrlError
from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir.execute import execute

ort = pytest.importorskip("onnxruntime")

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
RULES = Path(__file__).resolve().parents[1] / "rewrite_rules" / "contrib_gqa.rules"


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _gqa_model(b: int, s: int, heads: int, kv_heads: int, size: int, past: str, attrs: dict,
               lens: list[int] | None = None) -> onnx.ModelProto:
    """One GroupQueryAttention node; past "" (empty inputs) or "zero" ((b, kv_heads, 0, size) initializers)."""
    empty = np.zeros((b, kv_heads, 0, size), np.float32)
    inits = [nh.from_array(np.array(lens if lens is not None else [s - 1] * b, np.int32), "seqlens_k"),
             nh.from_array(np.array(s, np.int32), "total")]
    if past == "zero":
        inits += [nh.from_array(empty, "past_k"), nh.from_array(empty, "past_v")]
    names = ["q", "k", "v", *(["past_k", "past_v"] if past == "zero" else ["", ""]), "seqlens_k", "total"]
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads, **attrs)
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, s, heads * size])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, s, kv_heads * size]) for n in "kv"]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "present_k", "present_v")]
    return helper.make_model(helper.make_graph([node], "gqa", inputs, outputs, initializer=inits), opset_imports=OPSETS)


@pytest.mark.parametrize("b,s,heads,kv_heads,size,attrs", [
    (1, 5, 4, 4, 8, {}), (2, 7, 4, 2, 16, {}), (2, 16, 8, 2, 8, {"scale": 0.3}), (3, 1, 4, 1, 8, {}),
], ids=["group1", "group2", "group4-scale", "group4-one-token"])
@pytest.mark.parametrize("past", ["", "zero"], ids=["empty-past", "zero-length-past"])
def test_numpy_semantics_of_group_query_attention_match_onnxruntime(b, s, heads, kv_heads, size, attrs, past) -> None:
    model = _gqa_model(b, s, heads, kv_heads, size, past, attrs)
    graph = from_onnx(model)  # the contrib outputs are untyped in the file: the IR types them
    assert graph.type_of("y").shape == (b, s, heads * size)
    assert graph.type_of("present_k").shape == (b, kv_heads, s, size)
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((b, s, heads * size)).astype(np.float32) * 2,
             "k": rng.standard_normal((b, s, kv_heads * size)).astype(np.float32),
             "v": rng.standard_normal((b, s, kv_heads * size)).astype(np.float32)}
    want = _run(model, feeds)
    for got, w in zip(execute(graph, feeds), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    written = to_onnx(graph)
    assert [(n.op_type, n.domain) for n in written.graph.node] == [("GroupQueryAttention", "com.microsoft")]
    for got, w in zip(_run(written, feeds), want, strict=True):
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("change", [{"lens": [4, 2]}, {"attrs": {"do_rotary": 1}}, {"attrs": {"softcap": 5.0}},
                                    {"attrs": {"local_window_size": 3}}, {"size": 4}],
                         ids=["padded-seqlens", "rotary", "softcap", "window", "head-size-4"])
def test_forms_the_ir_does_not_support_are_refused(change: dict) -> None:
    size = change.get("size", 16)
    model = _gqa_model(2, 5, 4, 2, size, "", change.get("attrs", {}), change.get("lens"))
    with pytest.raises(XrlError):
        from_onnx(model)


def test_only_onnxruntime_targets_run_group_query_attention() -> None:
    assert get_target("ort-cpu").runs("GroupQueryAttention")
    assert get_target("ort-cuda").runs("GroupQueryAttention")
    assert not get_target("paper").runs("GroupQueryAttention")


def test_the_gqa_rules_verify_at_20_trials() -> None:
    from xrl.rewrite import parse_rules, verify_rule

    rules = parse_rules(RULES.read_text(), str(RULES))
    assert {r.name for r in rules} == {"fuse_gqa_sdpa", "fuse_gqa_sdpa_k3", "fuse_gqa_eager", "fuse_gqa_eager_cast"}
    for rule in rules:
        check = verify_rule(rule, seed=3, trials=20)
        assert check.ok and check.trials == 20 and check.max_err <= 1e-9, (rule.name, check.detail)


@pytest.mark.parametrize("member,exporter,rule", [
    ("llama", "ts", "fuse_gqa_sdpa"), ("llama", "dynamo", "fuse_gqa_sdpa_k3"),
    ("llama_eager", "ts", "fuse_gqa_eager_cast"), ("llama_eager", "dynamo", "fuse_gqa_eager"),
])
def test_llama_attention_fuses_into_group_query_attention(member: str, exporter: str, rule: str) -> None:
    """Each layer's attention (4 query heads on 2 kv heads, 16 tokens: the causal mask is checked for real
    here, the verifier's examples being one token long) fuses into one GroupQueryAttention; onnxruntime computes
    what the original computes; under paper (no contrib ops) the fused candidate costs more than its parent."""
    from xrl.graphs import families as fam

    from xrl.cost import get_cost_model
    from xrl.rewrite import RewriteEngine

    model = fam.build_onnx(member, "small", exporter)
    g = parent = from_onnx(model)
    engine = RewriteEngine.default()
    first = None
    for _ in range(2):  # one fusion per layer
        cands = [c for c in engine.candidates(g) if str(c.step).startswith("fuse_gqa")]
        assert {str(c.step).split("@")[0] for c in cands} == {rule}
        first = first or cands[0]
        g = cands[0].graph
    assert not [c for c in engine.candidates(g) if str(c.step).startswith("fuse_gqa")]
    written = to_onnx(g)
    ops = Counter(n.op_type for n in written.graph.node)
    assert ops["GroupQueryAttention"] == 2 and ops["Softmax"] == 0 and ops["Expand"] == 0
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    np.testing.assert_allclose(_run(written, feeds)[0], _run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    paper = get_cost_model("target", target="paper")
    assert paper.cost(first.graph) > paper.cost(parent)

"""Issue 35, item 5: PEFT's DoRA (use_dora=True) merged into one weight per adapted Linear, in both exporters' forms.

The family member lora_dora is PEFT's DoraLinearLayer forward on a BERT-style encoder (graphs/families/lora.py);
its limit is PEFT's merge. Without rewrite_rules/dora.rules nothing merges it (40 MatMuls against the limit's 16).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from xrl.graphs import families as F

from xrl.rewrite import RewriteEngine
from xrl.rewrite.lang import parse_rules

pytest.importorskip("torch")
RULES = Path(__file__).resolve().parents[1] / "rewrite_rules" / "dora.rules"


def _products(model: onnx.ModelProto) -> int:
    return sum(n.op_type in ("MatMul", "Gemm", "FusedMatMul") for n in model.graph.node)


def test_dora_rules_are_composite_and_verified() -> None:
    from xrl.rewrite.verify import verify_rule

    rules = parse_rules(RULES.read_text(), str(RULES))
    merges = {r.name for r in rules if r.kind == "composite"}
    assert merges == {"merge_dora_linear", "merge_dora_matmul", "merge_dora_linear_folded", "merge_dora_matmul_folded"}
    # the elementary steps that reach them (tests/test_elementary_routes.py), in the elementary set only
    assert {r.name for r in rules if r.kind == "elementary"} == {"cancel_add_sub_bias", "scale_matmul_weight_columns"}
    assert all(not r.in_all for r in rules if r.kind == "elementary")
    for rule in rules:
        assert verify_rule(rule, seed=0, trials=2).ok, rule.name
    assert merges <= {r.name for r in RewriteEngine.default().rules}


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_optimize_merges_every_dora_adapter(exporter: str, tmp_path: Path) -> None:
    from xrl.api import optimize

    model = F.build_onnx("lora_dora", "small", exporter)
    limit = F.build_onnx("lora_dora", "small", exporter, limit=True)
    assert _products(model) > 2 * _products(limit)  # 24 adapter products (+ the eye's, unfolded in ts) to merge
    src = tmp_path / "dora.onnx"
    onnx.save(model, src)
    result = optimize(str(src), output=tmp_path / "out.onnx", guard=False, force=True)
    assert result.verified
    out = onnx.load(tmp_path / "out.onnx")
    assert _products(out) <= _products(limit), Counter(n.op_type for n in out.graph.node)
    feeds = F.input_feeds("lora_dora", "small", seed=3)
    want, got = F.run(limit, feeds)[0], F.run(out, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)

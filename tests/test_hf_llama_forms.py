"""Hugging Face LLaMA exports with PEFT LoRA, as the libraries write them (issue 35, item 5): xrl's rules fuse
their RMSNorm, rotary and attention forms in both exporters' files, and the result computes what the export
computes under onnxruntime, for unpadded, left-padded and arbitrary attention masks.

The fixtures (tests/fixtures/hf_llama_lora{,_eager}_tiny_{ts,dynamo}.onnx: transformers' LlamaForCausalLM with
SDPA (its default) or eager attention, hidden 64, one layer, 4 heads over 2 key/value heads, PEFT LoRA r 8 on
every projection, unmerged; inputs input_ids and attention_mask) were written by
experiments/make_hf_llama_fixtures.py, so these tests need neither transformers nor peft. The attention's mask is
computed from the attention_mask input, so the grouped-query attention fuses into MultiHeadAttention with the
mask as attention_bias (rewrite_rules/contrib_gqa_masked.rules).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir.graph import Graph
from xrl.rewrite.engine import RewriteEngine
from xrl.rewrite.rules import load_rules

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# the clean-ups first (a Reshape to its own shape), then the merges and the fusions
RULE_FILES = ["reshape", "lora", "contrib_rmsnorm", "contrib_rotary", "contrib_gqa_masked"]
# what each form is written with before the rules, and what it must become
UNFUSED = ("Pow", "ReduceMean", "Sqrt", "Neg", "Softmax")
# transformers' attention implementations: SDPA (its default) and eager
STEMS = ["hf_llama_lora", "hf_llama_lora_eager"]


@pytest.fixture(scope="module")
def engine() -> RewriteEngine:
    rules = load_rules([ROOT / "rewrite_rules" / f"{f}.rules" for f in RULE_FILES])
    # of the reshape rules only the no-op's removal (TorchScript reshapes the attention's product to its own
    # shape): the others move the attention's scale before its Reshape and would take the pattern apart
    moves = {r.name for r in load_rules([ROOT / "rewrite_rules" / "reshape.rules"])} - {"reshape_noop"}
    return RewriteEngine([r for r in rules if r.name not in moves])


def _rewrite(graph: Graph, engine: RewriteEngine, limit: int = 60) -> tuple[Graph, list[str]]:
    """Greedy by node count: apply the candidate that removes the most nodes (the first of a tie) until none is
    left (each rule here removes its match, so this ends)."""
    applied: list[str] = []
    for _ in range(limit):
        cands = engine.candidates(graph)
        if not cands:
            return graph, applied
        best = max(cands, key=lambda c: len(c.removed) - len(c.added))
        graph = best.graph
        applied.append(best.rule)
    raise AssertionError(f"still rewriting after {limit} steps: {Counter(applied)}")


def _masks(seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    left = np.ones((1, seq), np.int64)
    left[:, :5] = 0  # left padding: the first rows see no key at all (NaN rows the export zeroes)
    right = np.ones((1, seq), np.int64)
    right[:, seq - 4:] = 0
    return [np.ones((1, seq), np.int64), left, right, (rng.random((1, seq)) > 0.4).astype(np.int64)]


@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_rmsnorm_rotary_and_attention_of_hf_llama_fuse_and_verify(stem: str, exporter: str,
                                                                  engine: RewriteEngine) -> None:
    model = onnx.load(str(FIXTURES / f"{stem}_tiny_{exporter}.onnx"))
    before = Counter(n.op_type for n in model.graph.node)
    assert before["Softmax"] == 1 and before["Pow"] == 3 and before["Neg"] == 2  # the forms are there to fuse
    fused, applied = _rewrite(from_onnx(model), engine)
    written = to_onnx(fused)
    after = Counter(n.op_type for n in written.graph.node)
    rules = Counter(applied)
    assert sum(n for r, n in rules.items() if r.startswith("fuse_rmsnorm")) == 3, rules
    assert sum(n for r, n in rules.items() if r.startswith("fuse_rotary")) == 2, rules
    assert sum(n for r, n in rules.items() if r.startswith("fuse_gqa_masked")) == 1, rules
    assert sum(n for r, n in rules.items() if r.startswith("merge_lowrank")) == 7, rules  # every adapter merged
    assert after["SimplifiedLayerNormalization"] + after["SkipSimplifiedLayerNormalization"] == 3, after
    assert after["RotaryEmbedding"] == 2 and after["MultiHeadAttention"] == 1, after
    assert not any(after[op] for op in UNFUSED), after
    assert after["Mul"] <= 2, after  # SiLU's two: no norm scale left beside its fused norm

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    want = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(written.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    seq = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(0)
    for mask in _masks(seq):
        feeds = {"input_ids": rng.integers(0, 128, (1, seq), dtype=np.int64), "attention_mask": mask}
        w, g = want.run(None, feeds)[0], got.run(None, feeds)[0]
        assert np.isfinite(w).all()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_xrl_optimize_writes_a_verified_model_with_the_norms_and_rotary_fused(stem: str, exporter: str,
                                                                              tmp_path: Path) -> None:
    from xrl.api import optimize

    out = tmp_path / "out.onnx"
    result = optimize(str(FIXTURES / f"{stem}_tiny_{exporter}.onnx"), output=str(out), prepass=(),
                      guard=False)
    assert result.verified
    ops = Counter(n.op_type for n in onnx.load(str(out)).graph.node)
    assert ops["SimplifiedLayerNormalization"] + ops["SkipSimplifiedLayerNormalization"] == 3, ops
    assert ops["RotaryEmbedding"] == 2 and not ops["Pow"] and not ops["Neg"], ops


def test_the_masked_gqa_rules_verify_at_20_trials() -> None:
    from xrl.rewrite import parse_rules, verify_rule

    path = ROOT / "rewrite_rules" / "contrib_gqa_masked.rules"
    rules = parse_rules(path.read_text(), str(path))
    assert {r.name for r in rules} == {"fuse_gqa_masked_sdpa", "fuse_gqa_masked_sdpa_k3", "fuse_gqa_masked_eager",
                                       "fuse_gqa_masked_eager_cast"}
    for rule in rules:
        check = verify_rule(rule, seed=3, trials=20)
        assert check.ok and check.trials == 20 and check.max_err <= 1e-9, (rule.name, check.detail)

"""Issue 35, item 4: the large LoRA decoder's builder (graphs/families/llama_xl.py), at its tiny size, with
unmerged adapters on every projection: xrl's default optimize merges every adapter and verifies."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import onnx  # noqa: E402


def _matmuls(model) -> int:  # noqa: ANN001
    return sum(n.op_type in ("MatMul", "Gemm") for n in model.graph.node)


def test_tiny_lora_decoder_merged_by_default_optimize(tmp_path) -> None:  # noqa: ANN001
    from xrl.graphs.families import llama_xl
    from xrl.graphs.families.export import export

    from xrl.api import optimize

    model = llama_xl.build("tiny", seed=0)
    assert 1000 < llama_xl.parameters(model) < 20000
    rms = model.layers[0].input_layernorm.weight
    assert (rms - 1).abs().max() > 0.01  # RMSNorm scales look trained
    adapters = [m for m in model.modules() if type(m).__name__ == "LoraLinear"]
    assert len(adapters) == len(llama_xl.TARGETS) and all(a.lora_B.weight.abs().max() > 0 for a in adapters)
    spec = llama_xl.inputs("tiny")
    original = export(model, spec, ["last_hidden_state"], "ts")
    limit = export(llama_xl.build("tiny", seed=0, merged=True), spec, ["last_hidden_state"], "ts")
    # each adapter adds two MatMuls (x A^T, then B^T) beside its base projection
    assert _matmuls(original) == _matmuls(limit) + 2 * len(adapters)
    written = tmp_path / "decoder.onnx"
    res = optimize(original, output=written)  # the defaults: pre-passes, search, verify, guard
    assert res.verified
    merges = res.prepasses[0]
    assert merges.name == "exact merges" and merges.detail.startswith(f"{len(adapters)} low-rank adapters")
    # whichever candidate the guard wrote, no adapter is left unmerged in it
    assert _matmuls(onnx.load(str(written))) <= _matmuls(limit)

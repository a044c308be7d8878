"""The headroom suite: valid ONNX that onnxruntime runs, the right shapes, sane magnitudes, deterministic."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from xrl import graphs
from xrl.frontends.onnx_io import from_onnx

# Output shape of each graph at batch 1.
EXPECTED_OUTPUT = {
    "lora_mlp": (1, 64, 128),
    "lora_tiny": (1, 16, 64),
    "lora_decode": (1, 256),
    "multi_lora": (1, 32, 96),
    "lora_qkv": (1, 16, 64),
    "lora_ffn": (1, 16, 64),
    "lora_attention": (1, 32, 64),
    "lora_attention_all": (1, 32, 96),
    "fire_small": (1, 64, 8, 8),
    "inception_a_small": (1, 32, 8, 8),
}


def _run(model: onnx.ModelProto, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32)
             for i in model.graph.input}
    (out,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return out


def test_suite_is_registered_and_in_all() -> None:
    assert graphs.names("headroom") == list(EXPECTED_OUTPUT)
    assert set(EXPECTED_OUTPUT) <= set(graphs.names())
    for name in EXPECTED_OUTPUT:
        g = graphs.BUILTIN_GRAPHS[name]
        assert g.suite == "headroom" and g.family in ("transformer", "cnn")
        assert "et al." in g.description  # each says where in the literature it comes from


@pytest.mark.parametrize("name", list(EXPECTED_OUTPUT))
def test_builds_runs_and_imports(name: str) -> None:
    model = graphs.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.graph.name == name and model.doc_string == graphs.BUILTIN_GRAPHS[name].description
    out = _run(model)
    assert out.shape == EXPECTED_OUTPUT[name] and np.isfinite(out).all()
    # rewrites are verified with a relative tolerance: outputs must be neither blown up nor vanishing
    assert 0.05 < float(out.std()) < 10.0 and float(np.abs(out).max()) < 100.0
    assert from_onnx(model, name=name).validate()
    assert graphs.build(name) == model  # same seed, same model
    two = graphs.build(name, batch=2, seed=1)
    assert _run(two).shape == (2, *EXPECTED_OUTPUT[name][1:])

"""The built-in benchmark graphs: valid ONNX that onnxruntime runs, with sane magnitudes, deterministic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from xrl import graphs
from xrl.errors import ConfigError, UnknownGraphError

# The deployment families (torch exports, seconds each, exporters' opsets) are tested in tests/test_families.py.
ALL = [n for n in graphs.names() if not graphs.BUILTIN_GRAPHS[n].suite.startswith("families")]
# 63M-144M weights each: rebuilding them costs seconds, so their rebuild tests are marked slow.
HEAVY = ("bert", "vit", "dalle", "vgg19")
ALL_HEAVY_SLOW = [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in ALL]

# Output shape of each graph at batch 1.
EXPECTED_OUTPUT = {
    "bert": (1, 64, 1024),
    "vit": (1, 1000),
    "dalle": (1, 16, 8192),
    "tt": (1, 80, 16, 128),
    "inception_v3": (1, 1000),
    "resnext50": (1, 1000),
    "squeezenet": (1, 1000),
    "nasrnn": (1, 512),
    "nasnet_a": (1, 1000),
    "resnet50": (1, 1000),
    "vgg19": (1, 1000),
    "mlp": (1, 10),
    "tiny_cnn": (1, 10),
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


@dataclass(frozen=True)
class Built:
    model: onnx.ModelProto
    data: bytes  # serialised once: BERT and VGG-19 are 400-600 MB


@pytest.fixture(scope="module")
def built() -> dict[str, Built]:
    """Models built once per module at batch 1, seed 0."""
    return {}


def _built(cache: dict[str, Built], name: str) -> Built:
    if name not in cache:
        model = graphs.build(name)
        cache[name] = Built(model, model.SerializeToString())
    return cache[name]


def _model(cache: dict[str, Built], name: str) -> onnx.ModelProto:
    return _built(cache, name).model


def _dims(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal(_dims(i), dtype=np.float32) for i in model.graph.input}


def _run(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    data = model if isinstance(model, bytes) else model.SerializeToString()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")  # one run: repacking weights is waste
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_registry_is_complete_and_consistent() -> None:
    assert set(ALL) == set(EXPECTED_OUTPUT)
    assert graphs.names("xrlflow") == ["bert", "vit", "dalle", "tt", "inception_v3", "resnext50", "squeezenet"]
    assert graphs.names("taso") == ["nasrnn", "nasnet_a", "resnet50", "vgg19"]
    assert graphs.names("small") == ["mlp", "tiny_cnn"]
    assert graphs.names("headroom") == ["lora_mlp", "lora_tiny", "lora_decode", "multi_lora", "lora_qkv", "lora_ffn",
                                        "lora_attention", "lora_attention_all", "fire_small", "inception_a_small"]
    for name, g in graphs.BUILTIN_GRAPHS.items():
        assert g.name == name and g.family in ("transformer", "cnn", "rnn", "small") and g.description
        assert (g.suite == "small") == (g.family == "small")
        if g.family == "small":
            assert "fast tests and demos" in g.description


@pytest.mark.parametrize("name", ALL)
def test_builds_a_valid_opset17_float32_model(name: str, built: dict[str, Built]) -> None:
    model, data = _built(built, name).model, _built(built, name).data
    onnx.checker.check_model(data, full_check=True)  # also checks the recorded shapes against ONNX's
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.graph.name == name and model.doc_string == graphs.BUILTIN_GRAPHS[name].description
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    assert set(dtypes.values()) <= {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
    assert sum(d == onnx.TensorProto.FLOAT for d in dtypes.values()) >= 2
    assert len({n.name for n in model.graph.node}) == len(model.graph.node)


@pytest.mark.parametrize("name", ALL)
def test_runs_with_finite_outputs_of_sane_magnitude(name: str, built: dict[str, Built]) -> None:
    model = _model(built, name)
    (out,) = _run(_built(built, name).data, _feeds(model))
    assert out.shape == EXPECTED_OUTPUT[name]
    assert np.isfinite(out).all()
    # Rewrites are checked with a relative tolerance: blown-up or vanishing outputs would make that moot.
    assert 0.05 < float(out.std()) < 10.0, f"output std {out.std():.3g}"
    assert float(np.abs(out).max()) < 100.0


@pytest.mark.parametrize("name", ALL_HEAVY_SLOW)
def test_same_seed_gives_identical_model(name: str, built: dict[str, Built]) -> None:
    again = graphs.build(name, seed=0)
    assert again == _model(built, name)  # field by field, weights included: cheap even for 600 MB
    if graphs.BUILTIN_GRAPHS[name].suite == "small":
        assert again.SerializeToString() == _built(built, name).data


@pytest.mark.parametrize("name", ALL_HEAVY_SLOW)
def test_other_seed_and_batch(name: str, built: dict[str, Built]) -> None:
    base = _model(built, name)
    model = graphs.build(name, batch=2, seed=1)
    for old, new in zip([*base.graph.input, *base.graph.output], [*model.graph.input, *model.graph.output],
                        strict=True):
        assert _dims(new) == (2, *_dims(old)[1:])
    old_w, new_w = _weights(base), _weights(model)
    # Every weight is redrawn; only constants (shape vectors, scalars, the causal mask) stay.
    drawn = [k for k in old_w if not k.startswith(("const", "causal_mask"))]
    assert drawn and all(not np.array_equal(old_w[k], new_w[k]) for k in drawn)


@pytest.mark.parametrize("name", ["mlp", "tiny_cnn", "nasrnn", "squeezenet", "tt",
                                  pytest.param("vit", marks=pytest.mark.slow)])
def test_batch_rows_compute_what_batch_one_computes(name: str, built: dict[str, Built]) -> None:
    """Weights do not depend on the batch size, and no reshape mixes samples: row 0 of a batch of two
    equals the batch-1 output for that sample."""
    one, two = _model(built, name), graphs.build(name, batch=2)
    feeds = _feeds(one, seed=3)
    other = _feeds(one, seed=4)
    (y1,) = _run(one, feeds)
    (y2,) = _run(two, {k: np.concatenate([v, other[k]]) for k, v in feeds.items()})
    np.testing.assert_allclose(y2[:1], y1, rtol=1e-4, atol=1e-4)
    assert not np.allclose(y2[1], y1[0])


def test_batchnorm_statistics_are_calibrated(built: dict[str, Built]) -> None:
    """Running mean/var are the statistics of the activations reaching each BatchNormalization."""
    model = _model(built, "tiny_cnn")
    weights = _weights(model)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None)
                              for n in bns)
    _, *acts = _run(probe, _feeds(model, seed=5))
    for n, act in zip(bns, acts, strict=True):
        mean, var = weights[n.input[3]], weights[n.input[4]]
        assert not np.allclose(mean, 0) and not np.allclose(var, 1)
        # Calibrated on one other sample: per-channel estimates are noisy, their scale is not.
        ratio = act.var(axis=(0, 2, 3)) / var
        assert 0.7 < np.median(ratio) < 1.4 and ratio.min() > 0.2 and ratio.max() < 5
        z = np.abs(act.mean(axis=(0, 2, 3)) - mean) / np.sqrt(var)
        assert np.median(z) < 0.3 and z.max() < 1.5


def test_transformer_attention_is_exported_unmerged(built: dict[str, Built]) -> None:
    """Q, K and V are separate MatMuls reading one LayerNorm output: what the rewrite rules merge."""
    model = _model(built, "vit")
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    ln_outs = [n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert sum(readers.get(o, []).count("MatMul") == 3 for o in ln_outs) == 12  # one per layer
    ops = {n.op_type for n in model.graph.node}
    assert {"Erf", "Softmax", "Transpose", "Reshape", "Conv", "Concat", "Slice", "Gemm"} <= ops


def test_cnns_keep_conv_bn_relu_unfused(built: dict[str, Built]) -> None:
    model = _model(built, "resnet50")
    producer = {o: n for n in model.graph.node for o in n.output}
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 53 and all(producer[n.input[0]].op_type == "Conv" for n in bns)
    groups = {a.i for n in _model(built, "resnext50").graph.node for a in n.attribute if a.name == "group"}
    assert groups == {1, 32}


@pytest.mark.parametrize("name", ["bret", "Bert", "resnet"])
def test_unknown_name_lists_valid_names_and_a_close_match(name: str) -> None:
    with pytest.raises(UnknownGraphError) as err:
        graphs.build(name)
    msg = str(err.value)
    assert name in msg and "squeezenet" in msg and "did you mean" in msg and "\n" not in msg


def test_unknown_name_without_close_match() -> None:
    with pytest.raises(UnknownGraphError, match="valid names: bert, vit") as err:
        graphs.build("zzzz")
    assert "did you mean" not in str(err.value)


def test_bad_suite_and_batch_are_user_errors() -> None:
    with pytest.raises(UnknownGraphError, match="xrlflow"):
        graphs.names("tensat")
    for batch in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="batch"):
            graphs.build("mlp", batch=batch)


@pytest.mark.parametrize("name", ALL)
def test_imports_into_the_ir(name: str, built: dict[str, Built]) -> None:
    from xrl.frontends.onnx_io import from_onnx

    model = _model(built, name)
    graph = from_onnx(model)
    graph.validate()
    assert [graph.types[o].shape for o in graph.outputs] == [_dims(o) for o in model.graph.output]

"""The deployment models (the family `deploy`, graphs/families/deploy.py, under their old names in
graphs/deploy_models.py), tiny size. Their benchmark is tested in tests/test_bench_harness.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from xrl.graphs import deploy_models as dm


def _ort_outputs(path: Path, name: str) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, dm.input_feeds(name, "tiny"))


@pytest.mark.parametrize("name", dm.MODELS)
def test_tiny_torchscript_export_matches_torch(name: str, tmp_path: Path) -> None:
    path = dm.export(name, "tiny", "torchscript", tmp_path / f"{name}.onnx")
    model = onnx.load(str(path))
    assert all(d.HasField("dim_value") for i in model.graph.input for d in i.type.tensor_type.shape.dim)  # static
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # batch 1
    out, ref = _ort_outputs(path, name)[0], dm.torch_outputs(name, "tiny")[0]
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)


def test_tiny_dynamo_export_matches_torch(tmp_path: Path) -> None:
    path = dm.export("gpt", "tiny", "dynamo", tmp_path / "gpt.onnx")
    np.testing.assert_allclose(_ort_outputs(path, "gpt")[0], dm.torch_outputs("gpt", "tiny")[0], rtol=1e-3, atol=1e-4)


def test_models_are_seeded_and_realistic() -> None:
    a, b = dm.build("resnet", "tiny", seed=3), dm.build("resnet", "tiny", seed=3)
    assert all(torch_equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    bn = a.stem[1]
    assert float(bn.running_mean.abs().sum()) > 0 and not bool((bn.running_var == 1).all())
    feeds = dm.input_feeds("bert", "tiny")
    assert feeds["input_ids"].max() < dm.DIMS["tiny"].vocab and 0 < feeds["attention_mask"].sum() < dm.DIMS["tiny"].seq
    pads = [m for m in dm.build("effnet", "tiny").modules() if m.__class__.__name__ == "ZeroPad2d"]
    assert pads, "EfficientNet must pad explicitly (TF 'same'), as its ports do"


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


def test_cached_export_is_keyed_and_reused(tmp_path: Path) -> None:
    path = dm.cached_export("effnet", "tiny", "torchscript", tmp_path)
    assert path.exists() and "effnet-tiny-ts" in path.name and "torch" in path.name  # one name per exporter
    mtime = path.stat().st_mtime_ns
    assert dm.cached_export("effnet", "tiny", "torchscript", tmp_path).stat().st_mtime_ns == mtime

"""Deployment models (graphs/deploy_models.py) and their benchmark (experiments/bench_deploy.py), tiny size."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from xrl.graphs import deploy_models as dm

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "experiments" / "bench_deploy.py"


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
    assert path.exists() and "effnet-tiny-torchscript" in path.name and "torch" in path.name
    mtime = path.stat().st_mtime_ns
    assert dm.cached_export("effnet", "tiny", "torchscript", tmp_path).stat().st_mtime_ns == mtime


def test_bench_end_to_end_tiny_bert(tmp_path: Path) -> None:
    out = tmp_path / "deploy.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--size", "tiny", "--models", "bert", "--exporters", "torchscript",
         "--threads", "1", "--rounds", "2", "--runs", "1", "--cache", str(tmp_path / "cache"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| A/A |" in proc.stdout and "| bert | torchscript | 1 |" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert out.read_text() == proc.stdout
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    assert {r["variant"] for r in rows} == set(_bench().VARIANTS)
    original = next(r for r in rows if r["variant"] == "original")
    assert int(original["nodes"]) > 0 and "MatMul:" in original["ops"]


def _bench():
    sys.path.insert(0, str(BENCH.parent))
    import bench_deploy

    return bench_deploy


def test_xrl_failure_is_a_row_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    fake = tmp_path / "xrl"
    fake.write_text("#!/bin/sh\necho 'error: cannot import this model' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(bench, "xrl_binary", lambda: str(fake))
    args = bench.parse_args(["--size", "tiny", "--models", "effnet", "--exporters", "torchscript",
                             "--cache", str(tmp_path / "cache"), "--threads", "1", "--rounds", "2", "--runs", "1"])

    class Bar:
        def update(self, n: int) -> None: ...
        def set_description(self, text: str) -> None: ...

    res = bench.prepare("effnet", "torchscript", args, tmp_path, Bar())
    assert res.variants["xrl"].error == "xrl optimize exit 2: error: cannot import this model"
    assert res.variants["onnxslim"].error is None and res.variants["ort-transformers"].error == "n/a"
    res.timings["1"] = bench.time_result(res, "1", args, Bar())
    text = bench.markdown([res], args, ["1"], 1.0)
    assert "FAILED" in text and "effnet/torchscript: xrl FAILED: xrl optimize exit 2: error: cannot import" in text


def test_bench_user_error_is_one_line_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert _bench().main(["--models", "alexnet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown model alexnet")

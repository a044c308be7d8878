"""A pre-pass runs in a scratch directory: what its library writes into the working directory
(onnxruntime's symbolic shape inference writes `sym_shape_infer_temp.onnx` and `.data` files there on
large models) never lands in the user's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from xrl import graphs
from xrl.frontends import prepass


@pytest.mark.parametrize("timeout", [float("inf"), 60.0])  # in process, and in the bounded child
def test_what_a_pass_writes_into_the_working_directory_is_removed(monkeypatch, tmp_path: Path, timeout) -> None:
    def litters(model):  # noqa: ANN001, ANN202
        Path("sym_shape_infer_temp.onnx").write_bytes(b"x")
        Path("weights.data").write_bytes(b"x" * 100)
        return model, "littered"

    monkeypatch.setitem(prepass._RUNNERS, "litter", litters)
    monkeypatch.chdir(tmp_path)
    out, detail = prepass._run_bounded("litter", graphs.build("mlp"), timeout)
    assert detail == "littered" and len(out.graph.node) > 0
    assert list(tmp_path.iterdir()) == [] and Path.cwd() == tmp_path

"""The Python API takes a model in memory and gives the optimised one back without a file; options are
checked before any model is loaded (issue 26, item 10)."""

from __future__ import annotations

import onnx
import pytest
from cli_helpers import assert_user_error, run

from xrl import api, graphs
from xrl.errors import ConfigError
from xrl.frontends.onnx_io import from_onnx
from xrl.frontends.verify import compare_models


@pytest.mark.parametrize("form", ["proto", "graph", "name"])
def test_optimize_takes_a_model_in_memory_and_returns_the_optimised_model(form: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    proto = graphs.build("tiny_cnn")
    given = {"proto": proto, "graph": from_onnx(proto, name="tiny_cnn"), "name": "tiny_cnn"}[form]
    res = api.optimize(given, target="paper", search="greedy")
    assert isinstance(res.model, onnx.ModelProto) and res.output is None and list(tmp_path.iterdir()) == []
    assert res.rewrites > 0 and len(res.model.graph.node) == res.optimized_nodes
    assert compare_models(proto, res.model, trials=1).ok
    assert "model" not in res.to_json()


def test_optimize_refuses_what_it_cannot_take() -> None:
    with pytest.raises(Exception, match="onnx.ModelProto or an xrl Graph"):
        api.optimize(42)


def test_bad_options_are_refused_before_the_model_is_loaded(monkeypatch, capsys) -> None:
    import xrl.frontends.loader as loader

    def never(*_a, **_k):  # noqa: ANN202
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(loader, "load_model", never)
    monkeypatch.setattr(api, "load_model", never)
    code, _, err = run(capsys, "optimize", "vgg19", "--search", "nosuch")
    assert_user_error(code, err, "unknown search method 'nosuch'")
    code, _, err = run(capsys, "optimize", "vgg19", "--prepass", "onnxslim,bogus")
    assert_user_error(code, err, "unknown pre-pass 'bogus'")
    with pytest.raises(ConfigError, match="unknown search method"):
        api.optimize("vgg19", search="nosuch")
    with pytest.raises(ConfigError, match="unknown cost model"):
        api.optimize("vgg19", cost="nosuch")

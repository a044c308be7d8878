"""The pre-passes are one table (xrl.frontends.prepass.PASSES): their names, the runner lookup and the guard's peer
passes all read it, so a pass added there is in all three."""

from __future__ import annotations

import onnx
import pytest

from xrl.deploy import starts
from xrl.errors import ConfigError
from xrl.frontends import prepass


def test_names_runners_and_guard_peers_come_from_the_one_table() -> None:
    assert not hasattr(prepass, "_RUNNERS")
    assert tuple(prepass.PREPASSES) == tuple(prepass.PASSES) == ("onnxslim", "ort-transformers", "onnxscript")
    assert starts.GUARD_PEER_PASSES == prepass.guard_peer_passes() == ("onnxslim", "ort-transformers", "onnxscript")


def test_a_pass_added_to_the_table_is_in_all_three(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    with pytest.raises(ConfigError, match="unknown pre-pass 'tidy'"):
        prepass.run_prepasses(empty, ["tidy"])
    ran = []

    def tidy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
        ran.append(model)
        return model, "tidied"

    monkeypatch.setitem(prepass.PASSES, "tidy", prepass.Prepass(tidy, guard_peer=True))
    assert "tidy" in prepass.PREPASSES  # the names (what --prepass and the options check accept)
    assert prepass.guard_peer_passes()[-1] == "tidy"  # the guard's peers
    _, reports = prepass.run_prepasses(empty, ["tidy"])  # the runner lookup (in this process: no time limit)
    assert ran and reports[0].name == "tidy" and reports[0].detail == "tidied"
    monkeypatch.setitem(prepass.PASSES, "tidy", prepass.Prepass(tidy))  # not a guard peer unless marked
    assert "tidy" in prepass.PREPASSES and "tidy" not in prepass.guard_peer_passes()

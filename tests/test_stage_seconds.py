"""Each stage of the deployment path records its wall seconds (issue 33 item 1, issue 35.2): the result's
`stage_seconds`, --json's `stage_seconds`, and one `stages:` line in the text report."""

from __future__ import annotations

import json
import time

from cli_helpers import run

from xrl import api, graphs


def test_optimize_times_each_stage(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    res = api.optimize(graphs.build("tiny_cnn"), target="paper", search="greedy")
    wall = time.perf_counter() - t0
    # in the order they ran; the guard is off for the research target, so no candidates or guard stage
    assert list(res.stage_seconds) == ["deployment", "starts", "search", "write"]
    assert all(s >= 0 for s in res.stage_seconds.values()) and sum(res.stage_seconds.values()) <= wall
    assert res.to_json()["stage_seconds"] == res.stage_seconds


def test_the_cli_reports_the_stages(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "optimize", "tiny_cnn", "--target", "paper", "--search", "greedy",
                       "-o", str(tmp_path / "o.onnx"))
    assert code == 0 and any(line.startswith("stages: deployment ") for line in out.splitlines())
    code, out, _ = run(capsys, "optimize", "tiny_cnn", "--target", "paper", "--search", "greedy", "--json",
                       "-o", str(tmp_path / "j.onnx"))
    js = json.loads(out)
    assert set(js["stage_seconds"]) >= {"deployment", "starts", "search", "write"}

"""`xrl compare`: every method on every graph, recomputed and verified, failures isolated, files written."""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest

from xrl.cli import main
from xrl.search import compare, registry
from xrl.search.compare import CSV_COLUMNS, CompareConfig, run_compare, write_results


def _read_csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_compare_writes_every_file_with_a_geomean_row(tmp_path):
    config = CompareConfig(graphs=("mlp", "tiny_cnn"), methods=("greedy", "random", "taso", "tensat"),
                           time_limit=20, steps={"random": 5})
    seen = []
    records = run_compare(config, progress=lambda rec, done, total: seen.append((done, total)))
    assert seen[-1] == (8, 8)
    for r in records:
        assert r.status == "ok", (r.graph, r.method, r.error)
        assert r.verified and r.speedup >= 1 - 1e-9
        assert r.speedup == pytest.approx(r.original_cost / r.optimized_cost)
    paths = write_results(records, tmp_path)
    rows = _read_csv(paths["csv"])
    assert list(rows[0]) == CSV_COLUMNS
    assert [(r["graph"], r["method"]) for r in rows[:8]] == [(g, m) for g in config.graphs for m in config.methods]
    geo = {r["method"]: float(r["speedup"]) for r in rows if r["graph"] == "geomean"}
    assert set(geo) == set(config.methods)
    mine = [r.speedup for r in records if r.method == "taso"]
    assert geo["taso"] == pytest.approx(math.sqrt(mine[0] * mine[1]))
    md = paths["md"].read_text()
    assert "| **geomean** | **tensat** |" in md and md.count("\n| tiny_cnn |") == 4
    for key in ("speedup_plot", "time_plot"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_method_is_reported_and_the_others_finish(monkeypatch, tmp_path):
    real = compare.run_search

    def flaky(method, *args, **kwargs):
        if method == "random":
            raise RuntimeError("boom")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(compare, "run_search", flaky)
    rl = registry.get_search("rl")
    monkeypatch.setitem(registry.searches(), "rl", replace(rl, requires=("xrl.no_such_module",)))
    config = CompareConfig(graphs=("mlp", "no_such_graph"), methods=("rl", "random", "greedy"))
    records = run_compare(config)
    status = {(r.graph, r.method): r.status for r in records}
    assert status[("mlp", "random")] == "failed"
    assert status[("mlp", "greedy")] == "ok"
    assert status[("mlp", "rl")] == "unavailable"
    assert status[("no_such_graph", "greedy")] == "failed"
    boom = next(r for r in records if r.method == "random" and r.graph == "mlp")
    assert "RuntimeError" in boom.error and "boom" in boom.error
    write_results(records, tmp_path)  # failed and unavailable rows still make a table and plots
    summary = {s.method: s for s in compare.summarize(records)}
    assert summary["greedy"].runs_ok == 1 and summary["greedy"].runs == 2
    assert math.isnan(summary["random"].geomean_speedup)


def test_cli_compare(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--graphs", "mlp", "--methods", "greedy,taso", "--time-limit", "10",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "geomean" in printed.out and "[2/2] mlp / taso: ok" in printed.err
    assert {p.name for p in out.iterdir()} == {"results.csv", "results.md", "speedup.png", "speedup_vs_time.png"}
    assert main(["compare", "--graphs", "mlp", "--methods", "greedy,annealing", "--out", str(out)]) == 2
    assert "unknown method 'annealing'" in capsys.readouterr().err


def test_graph_and_method_lists():
    from xrl import graphs

    assert compare.resolve_graphs("small") == tuple(graphs.names("small"))
    assert compare.resolve_graphs("mlp,small") == ("mlp", "tiny_cnn")
    assert compare.resolve_methods("taso, greedy,taso") == ("taso", "greedy")

"""`xrl sweep summarize`: final and best speed-up per graph across a multirun's runs, mean and spread over seeds."""

from __future__ import annotations

import json

import pytest

from xrl.sweeps import load_runs, summarize, write_summary


def _run(root, name, overrides, speedups):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    lines = [json.dumps({"update": i, "speedup/mlp": s, "loss": 0.1}) for i, s in enumerate(speedups)]
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n{\"update\": 9, \"speedup/ml")  # a cut last line


@pytest.fixture()
def sweep(tmp_path):
    _run(tmp_path, "0", ["model=gat", "seed=0"], [1.0, 1.5, 1.4])
    _run(tmp_path, "1", ["model=gat", "seed=1"], [1.0, 1.2, 1.2])
    _run(tmp_path, "2", ["model=gin", "seed=0"], [1.0, 1.1])
    return tmp_path


def test_runs_group_by_config_over_seeds(sweep):
    runs = load_runs(sweep)
    assert len(runs) == 3 and {r.config for r in runs} == {"model=gat", "model=gin"}
    headers, rows = summarize(runs)
    gat = next(r for r in rows if r[0] == "model=gat")
    assert gat[1:] == ["mlp", "2", "1.300 ± 0.141", "1.350 ± 0.212"]


def test_cli_writes_table_and_plot(sweep, capsys):
    from xrl.cli.main import main

    assert main(["sweep", "summarize", str(sweep)]) == 0
    assert "model=gin" in capsys.readouterr().out
    assert (sweep / "summary.md").read_text().count("| model=") == 2
    assert (sweep / "summary.png").stat().st_size > 0 and (sweep / "summary.csv").exists()
    assert main(["sweep", "summarize", str(sweep / "nothing")]) == 2


def test_write_summary_returns_its_files(sweep):
    assert set(write_summary(sweep)) >= {"markdown", "csv"}

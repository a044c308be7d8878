"""experiments/rl_vs_search.py --arms (issue 24): beside its own rows, the prior arms of experiments/rl_ablation.py at
equal budget (the same code, experiments/prior_arms.py) and the learning gain, on one tiny graph with a tiny budget.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _experiment(name: str):
    sys.path.insert(0, str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_rl_vs_search_reports_the_ablation_arms_and_the_learning_gain(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")
    script = _experiment("rl_vs_search")
    ablation = _experiment("rl_ablation")
    assert script.prior_arms.run_graph is ablation.run_graph  # one copy of the arm code, shared
    assert script.prior_arms.summarise is ablation.summarise
    baselines = tmp_path / "baselines.csv"
    with baselines.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["graph", "method", "status", "speedup"])
        w.writeheader()
        w.writerows({"graph": "lora_tiny", "method": m, "status": "ok", "speedup": "1.2"} for m in script.SEARCHES)
    out = tmp_path / "out"
    argv = ["--baselines", str(baselines), "--variants", "shipped", "--seeds", "0", "--graphs", "lora_tiny",
            "--modes", "argmax", "--arms", "--arms-budgets", "0.5", "--arms-searches", "greedy,taso",
            "--untrained-seeds", "0", "--out", str(out)]
    assert script.main(argv) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "rl argmax (shipped)" in text  # its own rows are still there
    at = next(i for i, line in enumerate(lines) if line.startswith("| graph | split | trained |"))
    assert _cells(lines[at])[2:] == ["trained", "untrained-0", "uniform", "cost", "argmax", "greedy", "taso"]
    row = _cells(lines[at + 2])
    assert row[:2] == ["lora_tiny", "val"]
    assert all(float(x) >= 1.0 for x in row[2:])  # every arm ran, a speed-up recomputed
    gain_header = next(line for line in lines if "| learning gain |" in line)
    col = _cells(gain_header).index("learning gain")
    gain = _cells(next(line for line in lines if line.startswith("| val | 0.5 |")))
    assert float(gain[col]) > 0 and gain[_cells(gain_header).index("best non-learned")] in ("uniform", "cost",
                                                                                            "untrained")
    written = (out / "rl_vs_search.md").read_text()
    assert "Prior arms at equal budget, variant `shipped`" in written and "learning gain" in written
    with (out / "arms_runs.csv").open() as f:
        arms = list(csv.DictReader(f))
    assert {r["arm"] for r in arms} == {"trained", "untrained-0", "uniform", "cost", "argmax", "greedy", "taso"}
    assert {r["variant"] for r in arms} == {"shipped"} and {r["seeds"] for r in arms} == {"0"}
    # --report-only rewrites the same tables from the CSV files, running nothing
    assert script.main([*argv, "--report-only"]) == 0
    assert capsys.readouterr().out.strip() == text.strip()

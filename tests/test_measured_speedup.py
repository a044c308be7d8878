"""Measured speed-ups: alternating rounds, the paired verdict, greedy search under noisy timings,
and `xrl optimize --measure`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xrl import graphs
from xrl.cli import main
from xrl.cost import AnalyticCostModel
from xrl.cost.base import Measurement, WholeGraphCostModel
from xrl.cost.speedup import VERDICTS, MeasuredSpeedup, measure_speedup
from xrl.frontends.onnx_io import from_onnx
from xrl.ir import Graph
from xrl.search.greedy import greedy_search


class ScriptedTimer(WholeGraphCostModel):
    """A whole-graph 'timer' whose run time is a function of the graph, times seeded noise: the
    true cost is known, and what the search sees is as noisy as `noise` (relative std) makes it."""

    name = "scripted"

    def __init__(self, true_cost, noise: float, seed: int = 0) -> None:
        super().__init__()
        self.true_cost, self.noise = true_cost, noise
        self.rng = np.random.default_rng(seed)
        self.calls: list[str] = []

    def _time(self, graph: Graph) -> Measurement:
        self.calls.append(graph.canonical_hash)
        runs = self.true_cost(graph) * (1 + self.noise * self.rng.standard_normal(10))
        return Measurement(float(np.median(runs)), 10, float(runs.std() / runs.mean()), float(runs.min()),
                           float(runs.max()))


@pytest.fixture(scope="module")
def mlp() -> Graph:
    return from_onnx(graphs.build("mlp"), name="mlp")


def _m(median: float, cv: float = 0.01) -> Measurement:
    return Measurement(median, 10, cv, median, median)


def test_rounds_alternate_the_order_and_never_reuse_a_cached_timing(mlp):
    other = greedy_search(mlp, AnalyticCostModel(device="cpu")).graph
    timer = ScriptedTimer(lambda g: 1.0, noise=0.0)
    timer.measure(mlp)  # cached: remeasure must time it again
    measure_speedup(timer, mlp, other, rounds=4)
    a, b = mlp.canonical_hash, other.canonical_hash
    assert timer.calls == [a, a, b, b, a, a, b, b, a]  # the cached one, then before/after, after/before, ...


def test_verdicts_come_from_the_spread_of_the_rounds():
    consistent = MeasuredSpeedup("t", _m(1.0), _m(0.8), (1.24, 1.26, 1.25, 1.25, 1.24))
    assert consistent.verdict == "faster" and consistent.faster
    assert consistent.speedup == pytest.approx(1.248, abs=1e-3)
    lo, hi = consistent.interval
    assert 1 < lo < consistent.speedup < hi < 1.27
    assert MeasuredSpeedup("t", _m(1.0), _m(1.25), (0.8, 0.79, 0.81)).verdict == "slower"
    # a large mean gain with rounds that disagree is not a measured gain
    assert MeasuredSpeedup("t", _m(1.0), _m(0.8), (1.6, 0.95, 1.3, 0.97, 1.5)).verdict == "within noise"
    # one round: the runs' own noise decides
    assert MeasuredSpeedup("t", _m(1.0, 0.001), _m(0.9, 0.001), (1.11,)).verdict == "faster"
    assert MeasuredSpeedup("t", _m(1.0, 0.2), _m(0.99, 0.2), (1.01,)).verdict == "within noise"
    j = consistent.to_json()
    assert j["verdict"] in VERDICTS and len(j["interval95"]) == 2 and len(j["round_speedups"]) == 5


def test_a_deterministic_model_is_judged_exactly(mlp):
    analytic = AnalyticCostModel(device="cpu")
    res = greedy_search(mlp, analytic)
    m = measure_speedup(analytic, mlp, res.graph, rounds=3)
    assert m.speedup == pytest.approx(res.speedup, rel=1e-12)
    assert m.interval[0] == pytest.approx(m.interval[1], rel=1e-12)
    assert m.verdict == "faster"
    assert measure_speedup(analytic, mlp, mlp).verdict == "within noise"


def test_identical_graphs_under_noise_are_within_noise(mlp):
    timer = ScriptedTimer(lambda g: 1e-3, noise=0.05, seed=3)
    assert measure_speedup(timer, mlp, mlp, rounds=5).verdict == "within noise"


def test_greedy_under_noise_takes_no_step_that_is_not_real(mlp):
    """Every graph truly costs the same: the cheapest of many noisy timings looks like a gain, and
    greedy without confirmation would take it. With confirmation it stops at once."""
    timer = ScriptedTimer(lambda g: 1e-3, noise=0.05, seed=1)
    res = greedy_search(mlp, timer)
    assert res.steps == []
    assert res.details["confirmations"] >= 1


def test_greedy_under_mild_noise_still_finds_the_real_gains(mlp):
    analytic = AnalyticCostModel(device="cpu")
    timer = ScriptedTimer(analytic.cost, noise=0.005, seed=2)
    res = greedy_search(mlp, timer)
    exact = greedy_search(mlp, analytic)
    assert len(res.steps) >= 3
    assert analytic.cost(res.graph) < analytic.cost(mlp)
    assert analytic.cost(res.graph) <= analytic.cost(mlp) - 0.5 * (analytic.cost(mlp) - exact.cost)


def test_optimize_measure_reports_a_measured_speedup(capsys, tmp_path):
    out = tmp_path / "mlp.onnx"
    code = main(["optimize", "mlp", "--device", "cpu", "--measure", "--measure-repeats", "2", "-o", str(out),
                 "--json"])
    res = json.loads(capsys.readouterr().out)
    m = res["measured"]
    assert m["verdict"] in VERDICTS and out.exists()
    # two repeats a round on a shared machine: any verdict can come out, and the exit code must follow it
    assert code == (1 if m["verdict"] == "slower" else 0)
    assert m["cost_model"].startswith("e2e(ort, cpu")
    rounds = len(m["round_speedups"])
    assert 6 <= rounds <= 20 and m["repeats"] == 2 * rounds  # 6 rounds and more while the interval is wide
    assert m["interval95"][0] <= m["speedup"] <= m["interval95"][1]
    assert len(m["control_speedups"]) == rounds and m["control_interval95"] is not None  # the A/A control


def test_optimize_measure_text_and_bad_repeats(capsys):
    code = main(["optimize", "tiny_cnn", "--device", "cpu", "--measure", "torch", "--measure-repeats", "2"])
    out, _ = capsys.readouterr()
    assert code == (1 if ": slower" in out else 0)  # two repeats a round: the verdict is noise's to give
    assert "measured under e2e(torch, cpu" in out and "95%" in out
    code = main(["optimize", "mlp", "--measure", "--measure-repeats", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "--measure-repeats" in err and len(err.strip().splitlines()) == 1


def test_optimize_warns_when_the_optimised_model_measures_slower(capsys, tmp_path, monkeypatch):
    import xrl.cost.speedup as speedup

    def slower(model, before, after, *, rounds, **_):
        return MeasuredSpeedup("e2e(ort, cpu)", _m(1.0), _m(1.25), (0.8, 0.79, 0.81, 0.8, 0.8)[:rounds])

    monkeypatch.setattr(speedup, "measure_speedup", slower)
    out = tmp_path / "mlp.onnx"
    code = main(["optimize", "mlp", "--measure", "-o", str(out)])
    stdout, err = capsys.readouterr()
    # with --no-guard (the test suite's default) a verified model is still written, and the exit code says slower
    assert code == 1 and out.exists()
    assert ": slower" in stdout
    assert "warning" in err and "--cost e2e" in err and len(err.strip().splitlines()) == 1


def test_the_warning_names_a_foreign_device_profile(capsys, monkeypatch):
    import xrl.cost.speedup as speedup
    from xrl.cost.devices import this_machine_profile

    if this_machine_profile() == "a100":
        pytest.skip("this machine is an A100")
    monkeypatch.setattr(speedup, "measure_speedup", lambda model, before, after, *, rounds, **_: MeasuredSpeedup(
        "e2e(ort, cpu)", _m(1.0), _m(1.25), (0.8, 0.79, 0.81, 0.8, 0.8)))
    code = main(["optimize", "mlp", "--device", "a100", "--measure"])
    _, err = capsys.readouterr()
    assert code == 1 and "optimised for the a100 profile" in err and "leave out --device" in err


def test_the_same_graph_is_never_called_faster():
    lucky = MeasuredSpeedup("t", _m(1.02), _m(1.0), (1.02, 1.021, 1.019, 1.02, 1.02), identical=True)
    assert lucky.verdict == "within noise" and lucky.to_json()["identical"] is True
    assert MeasuredSpeedup("t", _m(1.02), _m(1.0), (1.02, 1.021, 1.019, 1.02, 1.02)).verdict == "faster"


def test_measure_speedup_knows_identical_graphs(mlp):
    timer = ScriptedTimer(lambda g: 1e-3, noise=0.01)
    assert measure_speedup(timer, mlp, mlp, rounds=2).identical
    other = greedy_search(mlp, AnalyticCostModel(device="cpu")).graph
    assert not measure_speedup(timer, mlp, other, rounds=2).identical


def test_a_screen_limits_what_greedy_times_but_keeps_the_gains(mlp):
    analytic = AnalyticCostModel(device="cpu")
    timer = ScriptedTimer(analytic.cost, noise=0.002, seed=4)
    res = greedy_search(mlp, timer, screen=analytic, screen_top=2)
    exact = greedy_search(mlp, analytic)
    steps = len(res.steps)
    assert res.explored <= 2 * (steps + 1)  # at most screen_top timed per step, the last one included
    assert res.details["screen"] == "analytic(cpu)" and res.details["screen_top"] == 2
    assert analytic.cost(res.graph) <= analytic.cost(mlp) - 0.5 * (analytic.cost(mlp) - exact.cost)
    with pytest.raises(ValueError):
        greedy_search(mlp, timer, screen=timer)


def test_the_control_decides_what_the_machine_can_tell():
    """A/A control: an effect within the control's deviation is not called faster; a noisy control says so."""
    quiet = (1.001, 0.999, 1.0, 1.002, 0.998, 1.0)
    assert MeasuredSpeedup("t", _m(1.1), _m(1.0), (1.1, 1.1, 1.1, 1.1, 1.1, 1.1), control_speedups=quiet).verdict \
        == "faster"
    assert MeasuredSpeedup("t", _m(1.0), _m(1.0), (1.0, 1.002, 0.999, 1.001, 1.0, 1.0),
                           control_speedups=quiet).verdict == "within noise"
    noisy = (1.2, 0.8, 1.15, 0.85, 1.1, 0.9)
    m = MeasuredSpeedup("t", _m(1.05), _m(1.0), (1.05, 1.04, 1.06, 1.05, 1.05, 1.05), control_speedups=noisy)
    assert m.noise > 0.03 and m.verdict == "too noisy to tell"


def test_measure_speedup_times_a_control_and_adds_rounds(mlp):
    timer = ScriptedTimer(lambda g: 1e-3, noise=0.2)
    m = measure_speedup(timer, mlp, mlp, rounds=3, control=True, max_rounds=8, budget_s=60)
    assert len(m.control_speedups) == len(m.round_speedups) == 8  # too wide after 3: rounds were added
    assert m.to_json()["control_interval95"] is not None

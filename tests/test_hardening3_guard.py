"""Issue 34 item 5 and issue 35 item 6: the guard under noise, and its rule "only what is measurably faster".

Every timing here comes from an injected timer (no onnxruntime session): a noisy A/A control must give
"too noisy to tell" and the original; a candidate within noise above 1 is not written; a clearly faster one
is; the common case, nothing measurably faster, is decided in few rounds; and --json's verdict agrees with
the written file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import run
from graph_helpers import chain

from xrl.cost.base import CostModel, Measurement
from xrl.cost.guard import ORIGINAL, GuardCandidate, measure_guard
from xrl.ir import Graph, Node


class InjectedTimer(CostModel):
    """Each graph (by name) takes `seconds[name]` times a per-call factor. The original's graph is timed
    twice a round (the original and its A/A copy); with `aa_skew`, every second call on it runs that much
    slower, as one session of a file can run several percent slower than another for its whole life."""

    name = "injected"
    per_op = False
    measured = True

    def __init__(self, seconds: dict[str, float], *, noise: float = 0.0, aa_skew: float = 0.0, seed: int = 0):
        super().__init__()
        self.seconds, self.noise, self.aa_skew = seconds, noise, aa_skew
        self.rng = np.random.default_rng(seed)
        self.original_calls = 0
        self.calls = 0

    def _op_cost(self, node, graph):  # noqa: ANN001
        raise NotImplementedError

    def remeasure(self, graph: Graph) -> Measurement:
        self.calls += 1
        t = self.seconds[graph.name] * float(np.exp(self.rng.normal(0, self.noise))) if self.noise \
            else self.seconds[graph.name]
        if graph.name == "original":
            t *= 1 + self.aa_skew * (self.original_calls % 2)
            self.original_calls += 1
        return Measurement(t, 10, 0.01, t * 0.99, t * 1.01)


def test_a_noisy_aa_control_gives_too_noisy_to_tell_more_rounds_and_the_original() -> None:
    """A/A 6% apart; the candidate 1.03x faster, its own interval well above 1: a guard that ignored its A/A
    control would write it."""
    timer = InjectedTimer({"original": 1.0, "search": 0.97}, aa_skew=0.06)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("search", chain("search", 2))],
                        rounds=6, max_rounds=12)
    m = res.measured["search"]
    assert m.interval[0] > 1.0  # the candidate alone looks faster ...
    assert m.verdict == "too noisy to tell"  # ... but not beyond the noise of identical work
    assert res.chosen == ORIGINAL and "too noisy to tell" in res.reason and "original is written" in res.reason
    assert res.rounds == 12  # rounds added up to the limit before giving up
    doc = res.to_json()
    original = doc["original"]
    assert original["verdict"] == "too noisy to tell" and original["speedup"] == 1.0
    assert original["interval95"] == doc["control_interval95"] and original["interval95"] != [1.0, 1.0]
    json.dumps(doc)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_candidate_within_noise_above_one_is_not_written(seed: int) -> None:
    timer = InjectedTimer({"original": 1.0, "search": 1 / 1.004}, noise=0.004, seed=seed)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("search", chain("search", 2))])
    assert res.chosen == ORIGINAL, res.reason
    assert res.measured["search"].verdict != "faster"
    assert "original is written" in res.reason


def test_a_clearly_faster_candidate_is_written_and_decided_early() -> None:
    timer = InjectedTimer({"original": 1.0, "pre-pass": 0.95, "search": 0.8}, noise=0.005)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("pre-pass", chain("pre-pass", 2)),
                                                       GuardCandidate("search", chain("search", 1))])
    assert res.chosen == "search" and res.measured["search"].verdict == "faster"
    low, _ = res.measured["search"].interval
    assert low > 1 and low > res.control[1]
    assert res.rounds == 3 and "faster than the original and every other candidate" in res.settled


def test_nothing_measurably_faster_is_decided_in_few_rounds() -> None:
    """The common case: the candidates are the original's speed or slower. The old guard took its 6 rounds
    (and more while the leader's interval was wide); this one stops as soon as nothing can be shown faster."""
    timer = InjectedTimer({"original": 1.0, "a": 1.0, "b": 1.04}, noise=0.003)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("a", chain("a", 2)),
                                                       GuardCandidate("b", chain("b", 1))], rounds=6, max_rounds=20)
    assert res.chosen == ORIGINAL
    assert res.rounds <= 4, (res.rounds, res.settled)
    assert res.settled


def test_a_slower_candidate_on_a_noisy_machine_stops_early() -> None:
    timer = InjectedTimer({"original": 1.0, "search": 1.5}, aa_skew=0.06)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("search", chain("search", 2))],
                        rounds=6, max_rounds=20)
    assert res.chosen == ORIGINAL and res.rounds == 3 and "below the original" in res.settled


# ----- through the API: --json's verdict and the written file agree -----------------------------------
def plus_zero(graph: Graph, cost, **_options):  # noqa: ANN001 - a search runner
    """A "search" whose result computes what `graph` computes with one more node (its output plus zero)."""
    from xrl.search.result import SearchResult

    out = graph.outputs[0]
    to = graph.type_of(out)
    types, weights = dict(graph.types), dict(graph.initializers)
    weights["plus_zero_w"] = np.zeros(to.shape, np.float32)
    types["plus_zero_w"] = to
    types["plus_zero_y"] = to
    nodes = [*graph.nodes.values(), Node("plus_zero", "Add", (out, "plus_zero_w"), ("plus_zero_y",))]
    changed = Graph(nodes, graph.inputs, ("plus_zero_y", *graph.outputs[1:]), types, weights, name=graph.name,
                    output_names=graph.output_names, domain_opsets=graph.domain_opsets)
    return SearchResult(graph=changed, steps=["plus_zero@out"])


def by_nodes(speedup: float, noise: float) -> InjectedTimer:
    """A timer for the API's graphs: the changed model (its node plus_zero) runs `speedup` times faster."""
    class ByNodes(InjectedTimer):
        def remeasure(self, graph: Graph) -> Measurement:
            self.calls += 1
            t = 1.0 / speedup if any(k.startswith("plus_zero") for k in graph.nodes) else 1.0
            t *= float(np.exp(self.rng.normal(0, self.noise)))
            return Measurement(t, 10, 0.01, t * 0.99, t * 1.01)

    return ByNodes({}, noise=noise)


@pytest.mark.parametrize("speedup,written_changed", [(1.004, False), (1.3, True)])
def test_json_verdict_and_the_written_file_agree(monkeypatch, capsys, tmp_path: Path, speedup: float,
                                                 written_changed: bool) -> None:
    from dataclasses import replace

    import xrl.cost.guard as guard
    from xrl import graphs
    from xrl.search import registry

    monkeypatch.setenv("XRL_GUARD", "1")
    src = tmp_path / "mlp.onnx"
    onnx.save(graphs.build("mlp"), src)
    n = len(onnx.load(src).graph.node)
    monkeypatch.setitem(registry.searches(), "greedy", replace(registry.get_search("greedy"), runner=plus_zero))
    real = guard.measure_guard
    timer = by_nodes(speedup, 0.004)
    monkeypatch.setattr(guard, "measure_guard",
                        lambda _timer, original, cands, **kw: real(timer, original, cands, **kw))
    out = tmp_path / "out.onnx"
    code, stdout, err = run(capsys, "optimize", str(src), "-o", str(out), "--json", "--prepass", "none",
                            "--cost", "roofline", "--target", "ort-cpu")
    assert code == 0, err
    doc = json.loads(stdout)
    written = len(onnx.load(out).graph.node)
    assert (written != n) == written_changed
    assert (doc["verdict"] == "faster") == written_changed, doc["guard"]["reason"]
    assert doc["guard"]["chosen"] == ("search" if written_changed else "original")
    assert timer.calls > 0
    if not written_changed:
        assert doc["measured_speedup"] == 1.0 and doc["measured_interval"] == doc["guard"]["control_interval95"]

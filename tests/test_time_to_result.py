"""Issue 35 item 2, time to a result: what `xrl optimize` no longer does twice.

- the guard's peer pass that the target's chain already ran on the same input is not run again (its result is
  the chain's own run of it; `xrl.deploy.starts._alone_in_chain`);
- the parsed rule files are kept in the user's cache folder, keyed on their bytes (and the parser's): a warm
  process does not parse them, a changed rule file is parsed afresh (`xrl.rewrite.rules._parsed_cached`);
- the guard stops timing a candidate that cannot become writable from min_rounds on (`xrl.cost.guard.hopeless`),
  and its time budget counts from min_rounds on (a loaded machine's round of seven bert graphs took 75 s).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from graph_helpers import chain
from onnx import TensorProto, helper

from xrl.cost.base import CostModel, Measurement
from xrl.cost.guard import ORIGINAL, GuardCandidate, hopeless, measure_guard
from xrl.cost.speedup import MeasuredSpeedup
from xrl.deploy import starts
from xrl.frontends import prepass
from xrl.frontends.onnx_io import from_onnx
from xrl.ir import Graph
from xrl.rewrite import rules


# ----- the chain's own run of a pass is its result alone ------------------------------------------------------
def _model() -> onnx.ModelProto:
    """x -> Identity -> Relu -> Relu -> y: one pass removes the Identity, another the repeated Relu."""
    nodes = [helper.make_node("Identity", ["x"], ["i"], name="id"),
             helper.make_node("Relu", ["i"], ["r1"], name="r1"),
             helper.make_node("Relu", ["r1"], ["y"], name="r2")]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _drop(op: str, model: onnx.ModelProto, only_after: str | None = None) -> onnx.ModelProto:
    """`model` without its first `op` node (after a node of `only_after`, if given): exact for an Identity, and
    for a Relu after a Relu."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    producers = {o: n for n in out.graph.node for o in n.output}
    for n in out.graph.node:
        if n.op_type == op and (only_after is None or (n.input[0] in producers
                                                       and producers[n.input[0]].op_type == only_after)):
            src, dst = n.input[0], n.output[0]
            out.graph.node.remove(n)
            keep = dst in {o.name for o in out.graph.output}
            for m in out.graph.node:  # the consumers read the input instead (or the producer writes the output)
                m.input[:] = [src if i == dst else i for i in m.input]
                if keep:
                    m.output[:] = [dst if o == src else o for o in m.output]
            return out
    return model


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []

    def runner(name: str, fn):  # noqa: ANN001, ANN202
        def run(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
            ran.append(name)
            return fn(model), ""
        return run

    monkeypatch.setitem(prepass.PASSES, "noidentity", prepass.Prepass(runner("noidentity", lambda m: _drop(
        "Identity", m)), guard_peer=True))
    monkeypatch.setitem(prepass.PASSES, "norelurelu", prepass.Prepass(runner("norelurelu", lambda m: _drop(
        "Relu", m, only_after="Relu")), guard_peer=True))
    monkeypatch.setitem(prepass.PASSES, "nothing", prepass.Prepass(runner("nothing", lambda m: m), guard_peer=True))
    return ran


def test_the_chains_first_pass_is_not_run_again_alone(counted: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    base = from_onnx(model).validate()
    monkeypatch.setattr(starts, "GUARD_PEER_PASSES", ("noidentity", "norelurelu"))
    # budget None: the passes run in this process (no child), so the counter sees every run
    _, _, start, reports, peers = starts._starts_of(base, model, ("noidentity", "norelurelu"), True, None, None)
    # the chain ran each once; of the peers alone, only norelurelu (the chain ran it on noidentity's result)
    assert counted == ["noidentity", "norelurelu", "norelurelu"]
    alone = dict(peers)
    assert set(alone) == {"pre-pass noidentity", "pre-pass norelurelu"}
    # the reused result is what the pass gives alone
    expected = from_onnx(_drop("Identity", model)).validate()
    assert alone["pre-pass noidentity"].canonical_hash == expected.canonical_hash
    assert len(start) == 1 and len(alone["pre-pass norelurelu"]) == 2
    assert sum("the chain's own run" in r.detail for r in reports) == 1


def test_a_pass_that_changed_nothing_before_the_first_change_is_known_too(counted: list[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    base = from_onnx(model).validate()
    monkeypatch.setattr(starts, "GUARD_PEER_PASSES", ("nothing", "noidentity", "norelurelu"))
    _, _, _, _, peers = starts._starts_of(base, model, ("nothing", "noidentity"), True, None, None)
    # "nothing" and "noidentity" ran on the model itself in the chain: alone they would give the same
    assert counted == ["nothing", "noidentity", "norelurelu"]
    # (noidentity, the chain's only change, is the chain's result: no peer of its own, as before)
    assert [label for label, _ in peers] == ["pre-pass norelurelu"]


def test_alone_in_chain_stops_at_a_later_pass_that_ran_out_of_the_chains_budget() -> None:
    base = chain("base", 2)
    step = chain("step", 1)
    out = starts._alone_in_chain([prepass.PassReport("a", False, 2, 2, "no change"),
                                  prepass.PassReport("b", False, 2, 2, "dropped", timed_out=True)], [], base)
    assert set(out) == {"a"} and out["a"][0] is base  # b alone would have a budget of its own
    out = starts._alone_in_chain([prepass.PassReport("a", False, 2, 2, "dropped", timed_out=True),
                                  prepass.PassReport("b", True, 2, 1, "")], [step], base)
    # the first pass had the whole budget, as alone; b ran on base to its end: deterministic, so known too
    assert set(out) == {"a", "b"} and out["a"][0] is base and out["b"][0] is step
    out = starts._alone_in_chain([prepass.PassReport("a", True, 2, 1, ""),
                                  prepass.PassReport("a", True, 1, 1, "")], [step], base)
    assert out["a"][0] is step and len(out) == 1


# ----- the parsed rules, cached ----------------------------------------------------------------------------------
RULE = """\
# One Relu after another is one Relu.
rule twice_relu family=algebraic kind=elementary
  y = Relu(Relu(x))
  =>
  y = Relu(x)
  example x=[2, 3]
"""


def _rules_dir(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    (d / "t.rules").write_text(body)
    return d


def test_parsed_rules_come_from_the_cache_and_a_changed_file_is_parsed_again(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XRL_NO_RULE_CACHE", raising=False)
    files = rules.rule_files()  # the built-in files: the cached copy must compute what a fresh parse does
    fresh = rules._parsed_cached(files)  # parsed, and written
    assert list((tmp_path / "cache" / rules.PARSED_DIR).glob("*.pickle"))
    parses = []
    real = rules.parse_rule_files
    monkeypatch.setattr(rules, "parse_rule_files", lambda fs: parses.append(fs) or real(fs))
    cached = rules._parsed_cached(files)
    assert not parses  # read back, not parsed
    assert [(r.name, r.text, r.kind, r.in_all, r.file, r.line) for r in cached] == \
           [(r.name, r.text, r.kind, r.in_all, r.file, r.line) for r in fresh]
    # the compiled expressions (conditions, examples) run as the freshly parsed ones do
    for a, b in zip(fresh, cached):
        for (_, x), (_, y) in zip(a.example, b.example):
            assert x.source == y.source and x.names == y.names and x.where == y.where
            assert x._code.co_code == y._code.co_code
    # a changed rule file: another key, parsed afresh
    d = _rules_dir(tmp_path, RULE)
    one = rules._parsed_cached(rules.rule_files([d]))
    assert [r.name for r in one] == ["twice_relu"] and len(parses) == 1
    rules._parsed_cached(rules.rule_files([d]))
    assert len(parses) == 1  # the same file again: from the cache
    (d / "t.rules").write_text(RULE.replace("twice_relu", "relu_relu"))
    again = rules._parsed_cached(rules.rule_files([d]))
    assert [r.name for r in again] == ["relu_relu"] and len(parses) == 2


def _cached_rule_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, Path]:
    """RULE's file parsed once with the cache on in a private folder: (the rule files, the cache file written)."""
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("XRL_NO_RULE_CACHE", raising=False)
    files = rules.rule_files([_rules_dir(tmp_path, RULE)])
    rules._parsed_cached(files)
    (path,) = (tmp_path / "cache" / rules.PARSED_DIR).glob("*.pickle")
    return files, path


def test_a_damaged_cache_file_is_parsed_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files, path = _cached_rule_file(tmp_path, monkeypatch)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert [r.name for r in rules._parsed_cached(files)] == ["twice_relu"]
    monkeypatch.setenv("XRL_NO_RULE_CACHE", "1")
    path.unlink()
    rules._parsed_cached(files)
    assert not path.exists()  # turned off: nothing written


def test_a_planted_cache_file_is_never_unpickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpickling runs code: a pickle written into the cache folder by anyone without the install's secret (here one
    that would run `boom` when loaded, with the plain content key a reader can compute) is parsed afresh instead."""
    import pickle

    files, path = _cached_rule_file(tmp_path, monkeypatch)
    ran = []

    class Boom:
        def __reduce__(self):
            return (ran.append, ("unpickled",))

    key = rules.parsed_cache_key(files)
    for head in (key.encode(), path.read_bytes()[:64]):  # the content key, and a copied signature of other bytes
        path.write_bytes(head + pickle.dumps([Boom()]))
        assert [r.name for r in rules._parsed_cached(files)] == ["twice_relu"]
        assert not ran


# ----- the guard decides "nothing measurably faster" in few rounds -----------------------------------------------
class SlowTimer(CostModel):
    """Graphs (by name) take `seconds[name]` with seeded noise; each call also advances a fake clock by
    `call_s` (a bert graph in a round: 2-8 s), read through `time.perf_counter` by the guard."""

    name = "slow"
    per_op = False
    measured = True

    def __init__(self, seconds: dict[str, float], noise: float, call_s: float, seed: int = 0) -> None:
        super().__init__()
        self.seconds, self.noise, self.call_s = seconds, noise, call_s
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.calls = 0

    def _op_cost(self, node, graph):  # noqa: ANN001
        raise NotImplementedError

    def remeasure(self, graph: Graph) -> Measurement:
        self.calls += 1
        self.now += self.call_s
        t = self.seconds[graph.name] * float(np.exp(self.rng.normal(0, self.noise)))
        return Measurement(t, 10, 0.01, t, t)


def test_the_budget_counts_from_min_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six graphs a round at 8 s each (bert on a loaded machine): the old guard took its 6 rounds whatever the
    budget (288 s); now the budget of 120 s ends it after the round that passes it, from min_rounds on."""
    from xrl.cost import guard

    timer = SlowTimer({"original": 1.0, "a": 0.995, "b": 0.99, "c": 1.0, "d": 0.985}, noise=0.02, call_s=8.0)
    monkeypatch.setattr(guard.time, "perf_counter", lambda: timer.now)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate(k, chain(k, i))
                                                       for i, k in enumerate("abcd", 4)], rounds=6, max_rounds=20)
    assert res.chosen == ORIGINAL
    assert res.rounds == 3 and timer.now <= 3 * 6 * 8.0, (res.rounds, res.settled, res.dropped)


def test_a_candidate_that_cannot_clear_the_noise_in_the_rounds_left_is_dropped() -> None:
    # [0.986, 1.021] against an A/A control of [0.988, 1.012]: above the control's upper end at best by a hair
    m = MeasuredSpeedup("t", Measurement(1, 1, 0, 1, 1), Measurement(1, 1, 0, 1, 1), (1.004, 0.996, 1.01),
                        control_speedups=(1.0, 0.995, 1.005))
    assert "cannot clear the noise in 3 rounds" in hopeless(m, m.control_speedups, 3)  # no round left
    assert not hopeless(m, m.control_speedups, 6) and not hopeless(m, m.control_speedups, 400)  # more rounds might
    slower = MeasuredSpeedup("t", m.before, m.after, (0.9, 0.91, 0.9), control_speedups=(1.0, 0.99, 1.01))
    assert "below 1" in hopeless(slower, slower.control_speedups, 400)
    faster = MeasuredSpeedup("t", m.before, m.after, (1.2, 1.21, 1.19), control_speedups=(1.0, 0.99, 1.01))
    assert not hopeless(faster, faster.control_speedups, 3)
    assert not hopeless(m, m.control_speedups[:2], 3) and not hopeless(
        MeasuredSpeedup("t", m.before, m.after, (0.9, 0.9), control_speedups=(1.0, 1.0)), (1.0, 1.0), 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_real_gain_is_still_found_and_written(seed: int) -> None:
    """Dropping the hopeless never drops a clearly faster candidate: 5% faster with 1% noise is written."""
    timer = SlowTimer({"original": 1.0, "same": 1.0, "gain": 1 / 1.05, "slow": 1.1}, noise=0.01, call_s=0.0,
                      seed=seed)
    res = measure_guard(timer, chain("original", 3), [GuardCandidate("same", chain("same", 1)),
                                                       GuardCandidate("gain", chain("gain", 2)),
                                                       GuardCandidate("slow", chain("slow", 4))],
                        rounds=6, max_rounds=20)
    assert res.chosen == "gain", (res.reason, res.dropped)
    assert math.isclose(res.measured["gain"].speedup, 1.05, rel_tol=0.03)
    assert "gain" not in res.dropped


# ----- screening: the original's ops and its estimate are not timed ---------------------------------------------
def _candidate(label: str, graph: Graph):  # noqa: ANN202 - a Candidate
    from xrl.search.exported import Candidate

    return Candidate(label, graph, graph, onnx.ModelProto(), {})


def test_a_candidate_with_the_originals_ops_and_estimate_is_screened() -> None:
    from xrl.deploy.guard import screened

    original = chain("original", 3)
    same_ops = chain("same_ops", 3)  # the same ops (a real candidate would differ in a name or a constant)
    fewer = chain("fewer", 2)
    estimated = {"same_ops": 1.001, "fewer": 1.001, "same_ops_faster": 1.2}
    out = screened(original, [_candidate("same_ops", same_ops), _candidate("fewer", fewer),
                              _candidate("same_ops_faster", chain("same_ops_faster", 3))], estimated)
    assert set(out) == {"same_ops"} and "not timed" in out["same_ops"]  # fewer ops, or a real estimate: timed


# ----- the guard's own repeats unless the user asks ------------------------------------------------------------
@pytest.mark.parametrize("argv, expected", [([], None), (["--measure-repeats", "3"], {"repeats": 3})])
def test_the_guard_keeps_its_own_repeats_unless_asked(argv, expected, monkeypatch) -> None:
    """--measure-repeats' old default (10) reached the guard, whose own is 5 per round: on bert 12 runs a graph a
    round instead of 7, the guard's time nearly doubled for no resolution (the fresh session varies most)."""
    import xrl.api
    from xrl.cli import main

    seen = {}

    class Stop(Exception):
        pass

    def fake_optimize(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(xrl.api, "optimize", fake_optimize)
    main(["optimize", "mlp", *argv])  # the stand-in stops it once it has the options (an internal error, 1)
    assert seen["measure_options"] == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_quiet_machine_decides_nothing_faster_within_the_budget_and_still_writes_a_real_gain(seed: int,
                                                                                             monkeypatch) -> None:
    """bert-base on a quiet machine: seven graphs a round at 1.2 s each, 1% noise. Candidates within 1% of the
    original are not timed to a 120 s budget (14 rounds) any more: the guard ends within its 40 s; a 4% gain
    among them is still measured faster and written."""
    from xrl.cost import guard

    times = {"original": 1.0, "a": 0.995, "b": 0.99, "c": 1.0, "d": 0.995, "e": 1.0}
    timer = SlowTimer(times, noise=0.01, call_s=1.2, seed=seed)
    monkeypatch.setattr(guard.time, "perf_counter", lambda: timer.now)
    cands = [GuardCandidate(k, chain(k, i)) for i, k in enumerate("abcde", 4)]
    res = measure_guard(timer, chain("original", 3), cands, rounds=6, max_rounds=20)
    assert res.chosen == ORIGINAL and timer.now <= 40 + 7 * 1.2, (res.rounds, timer.now, res.settled)
    timer = SlowTimer({**times, "e": 1 / 1.04}, noise=0.01, call_s=1.2, seed=seed)
    monkeypatch.setattr(guard.time, "perf_counter", lambda: timer.now)
    res = measure_guard(timer, chain("original", 3), cands, rounds=6, max_rounds=20)
    assert res.chosen == "e", (res.reason, res.dropped)


def test_a_transformer_pass_is_not_run_alone_for_the_guard_on_a_model_without_transformer_ops(
        counted: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxscript's fusions are onnxruntime's transformer fusions: on a full-size DBB export (no attention or
    normalisation) its peer run took 413 s of a 600 s run and fused nothing. Its row says where it cannot apply."""
    model = _model()  # Identity and Relus: no transformer op
    base = from_onnx(model).validate()
    monkeypatch.setitem(prepass.PASSES, "norelurelu", prepass.Prepass(
        prepass.PASSES["norelurelu"].run, guard_peer=True, peer_skip=prepass.transformer_ops_missing))
    monkeypatch.setattr(starts, "GUARD_PEER_PASSES", ("noidentity", "norelurelu"))
    _, _, _, reports, peers = starts._starts_of(base, model, ("noidentity",), True, None, None)
    assert counted == ["noidentity"] and not peers  # the chain's pass ran; the transformer-only one did not
    assert any(r.name == "norelurelu" and "no attention or normalisation" in r.detail for r in reports)
    assert prepass.PASSES["onnxscript"].peer_skip is prepass.transformer_ops_missing


def test_the_guards_samples_last_long_enough_for_a_fast_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.1 ms graph timed one call a sample measured an A/A spread of 18% over 20 rounds and nothing was
    written: the guard's samples call it until each lasts about 20 ms (bert-base: one call)."""
    import xrl.cost.timing as timing
    from xrl.deploy.deployment import GUARD_TIMING, measure_model

    assert GUARD_TIMING["min_run_s"] >= 0.01
    timer = measure_model("ort", "cpu", threads=1, **GUARD_TIMING)
    calls = []
    real = timing._calls_per_sample
    monkeypatch.setattr(timing, "_calls_per_sample",
                        lambda fn, sync, min_run_s: calls.append(min_run_s) or real(fn, sync, min_run_s))
    timer.remeasure(chain("mlp", 2))
    assert calls == [GUARD_TIMING["min_run_s"]]


def test_sizing_the_samples_takes_no_call_beyond_the_warm_up() -> None:
    from xrl.cost.timing import time_callable

    calls = []
    time_callable(lambda: calls.append(1), warmup=1, repeats=3, min_run_s=1e-9)
    assert len(calls) == 1 + 3  # the warm-up call is the one timed to size each sample (one call here)
    calls.clear()
    time_callable(lambda: calls.append(1), warmup=0, repeats=3, min_run_s=1e-9)
    assert len(calls) == 1 + 3  # without a warm-up, one call sizes them

"""Issue 26, item 5 (state files) and the --graphs / --out checks of item 8: hostile state files and graph
specs are one-line user errors, never a read of /dev/zero, a hang on a FIFO, or unbounded work."""

from __future__ import annotations

import json
import os
import time

import pytest
from cli_helpers import assert_user_error, run

from xrl.env.state import MAX_STATES, EnvState, read_states, write_states


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    from xrl.cli import main

    path = tmp_path_factory.mktemp("states") / "s.json"
    assert main(["env", "play", "tiny_cnn", "--steps", "2", "-o", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("name, content, needle", [
    ("deep.json", "[" * 100_000, "nested too deeply"),
    ("scalar.json", "3", "holds a JSON int"),
    ("string.json", '"mlp"', "holds a JSON str"),
    ("items.json", "[1, 2]", "expected an object"),
    ("latin1.json", b'{"graph": "caf\xe9"}', "not UTF-8"),
    ("bignum.json", '{"graph": "mlp", "graph_hash": "x", "reward": 1' + "0" * 5000 + "}", "not JSON"),
    ("actions.json", '{"graph": "mlp", "graph_hash": "x", "actions": [[1]]}', "actions must be"),
    ("field.csv", "graph,graph_hash,reward,speedup,cost,actions\nmlp,x,0,1,a," + "r@1 " * 300_000 + "\n",
     "not CSV"),
])
def test_malformed_state_files_are_user_errors(tmp_path, capsys, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run(capsys, "env", "replay", str(path), "--validate")
    assert_user_error(code, err, needle)


def test_a_directory_or_a_fifo_is_not_a_state_file(tmp_path, capsys):
    (tmp_path / "d.json").mkdir()
    code, _, err = run(capsys, "env", "replay", str(tmp_path / "d.json"))
    assert_user_error(code, err, "not a regular file")
    os.mkfifo(tmp_path / "f.json")
    code, _, err = run(capsys, "env", "replay", str(tmp_path / "f.json"))  # nobody writes it: must not wait
    assert_user_error(code, err, "not a regular file")


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_a_state_naming_a_device_or_a_fifo_is_refused(tmp_path, capsys, played, source):
    if source == "fifo":
        os.mkfifo(tmp_path / "g.onnx")
        source = str(tmp_path / "g.onnx")
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**played, "graph": source}))
    t0 = time.monotonic()
    code, _, err = run(capsys, "env", "replay", str(path), "--validate")
    assert_user_error(code, err, "not a regular file")
    assert time.monotonic() - t0 < 30


def test_a_large_file_is_refused_before_it_is_parsed(tmp_path, capsys):
    path = tmp_path / "big.json"
    with path.open("wb") as f:
        f.truncate(17 << 20)  # sparse: costs no disk
    code, _, err = run(capsys, "env", "replay", str(path))
    assert_user_error(code, err, "over the limit")


def test_distinct_states_are_bounded_and_the_cut_is_said(tmp_path, played):
    many = [{**played, "graph_hash": f"{i:032x}"} for i in range(MAX_STATES + 50)]
    many += many[:10]  # repeats are one state
    path = tmp_path / "many.json"
    path.write_text(json.dumps(many))
    with pytest.warns(UserWarning, match=f"replaying {MAX_STATES} of its {MAX_STATES + 50} distinct states"):
        states = read_states(path)
    assert len(states) == MAX_STATES


def test_replaying_many_states_of_one_graph_loads_it_once(tmp_path, capsys, played, monkeypatch):
    """Hundreds of states (fake hashes, or claimed rewards that differ) cost one graph load and one replay
    each kind, not one per state: the 1,500 states that took 47 s and 1.3 GB."""
    from xrl.env import graph_rewrite, state

    loads = []
    real = graph_rewrite.resolve_graph
    monkeypatch.setattr(graph_rewrite, "resolve_graph", lambda g: loads.append(g) or real(g))
    monkeypatch.setattr(state, "load_source", lambda spec: loads.append(spec) or real(spec))
    validations = []
    real_validate = state.validate
    monkeypatch.setattr(state, "validate", lambda *a, **k: validations.append(1) or real_validate(*a, **k))
    rows = [{**played, "graph_hash": f"{i:032x}"} for i in range(40)]
    rows += [{**played, "reward": played["reward"] + i} for i in range(40)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(rows))
    code, out, err = run(capsys, "env", "replay", str(path), "--validate", "--json")
    assert code == 1, err  # the fake hashes and the wrong rewards are invalid
    doc = json.loads(out)
    assert doc["failed"] == 79 and doc["states"][40]["valid"], doc["states"][40]
    assert "different graph" in doc["states"][0]["errors"][0]
    assert "replay earned reward" in doc["states"][41]["errors"][0]
    assert len([g for g in loads if isinstance(g, str)]) == 1, loads
    assert len(validations) == 41  # one per fake hash (each fails at once), one for all the real ones


def test_write_then_read_round_trips(tmp_path):
    s = EnvState("mlp", "h", ("a@1", "b@2"), 1.5, "analytic(h100)", 1.2)
    for name in ("s.json", "s.csv"):
        assert read_states(write_states([s], tmp_path / name)) == [s]


# ----- xrl compare: --graphs and --out, before any work --------------------------------------------------
@pytest.mark.parametrize("graphs, needle", [
    ("nosuchgraph", "unknown built-in graph 'nosuchgraph'"),
    ("mlpp", "did you mean 'mlp'"),
    ("/dev/zero", "not a regular file"),
    ("mlp,/nonexistent/m.onnx", "No such file"),
])
def test_compare_refuses_bad_graphs_before_work(tmp_path, capsys, graphs, needle):
    code, _, err = run(capsys, "compare", "--graphs", graphs, "--methods", "greedy", "--out", str(tmp_path / "o"))
    assert_user_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_compare_refuses_an_out_under_a_file_before_work(tmp_path, capsys, monkeypatch):
    from xrl.search import compare

    monkeypatch.setattr(compare, "run_compare", lambda *a, **k: pytest.fail("worked before checking --out"))
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        code, _, err = run(capsys, "compare", "--graphs", "mlp", "--methods", "greedy", "--out", str(out))
        assert_user_error(code, err, "is a file")
    assert (tmp_path / "f").read_text() == "x"

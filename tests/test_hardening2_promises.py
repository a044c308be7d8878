"""Issue 26, item 11: tests that pin the README's promises, each one written to fail on a small bug (a mutant)
that no other test caught: optimize writing an unverified graph, the report's node counts, --measure's verdict
on identical graphs and on a wide interval, the same seed giving the same file, and --force."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper, numpy_helper

FAST = ("--prepass", "none", "--target", "paper", "--time-limit", "60")


def _optimize(capsys, *args):
    code, out, err = run(capsys, "optimize", *args, "--json")
    assert code == 0, err
    return json.loads(out)


# ----- verification: nothing unverified is written ----------------------------------------------------
def test_optimize_writes_nothing_when_verification_fails(tmp_path, capsys, monkeypatch):
    from xrl.frontends import verify

    real = verify.compare_models

    def wrong(*a, **k):  # the optimised graph computes something else
        return dataclasses.replace(real(*a, **k), ok=False, max_abs_err=1.0, detail="outputs differ (injected)")

    monkeypatch.setattr(verify, "compare_models", wrong)
    out = tmp_path / "o.onnx"
    code, stdout, err = run(capsys, "optimize", "mlp", "--search", "greedy", *FAST, "-o", str(out), "--json")
    assert_user_error(code, err, "does not compute what the original computes")
    assert not out.exists() and stdout == ""


def test_a_written_model_is_verified(tmp_path, capsys):
    doc = _optimize(capsys, "mlp", "--search", "greedy", *FAST, "-o", str(tmp_path / "o.onnx"))
    assert doc["verified"] is True and doc["max_abs_err"] <= 1e-4


# ----- the report is the file -------------------------------------------------------------------------
def _foldable_model(path):
    """x + (c1 * c2): the constant product is folded on import, so the IR has fewer nodes than the file."""
    c1 = numpy_helper.from_array(np.full([4], 2.0, np.float32), "c1")
    c2 = numpy_helper.from_array(np.full([4], 3.0, np.float32), "c2")
    nodes = [helper.make_node("Mul", ["c1", "c2"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"]),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])], [c1, c2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_node_counts_are_those_of_the_files(tmp_path, capsys):
    src = _foldable_model(tmp_path / "in.onnx")
    out = tmp_path / "o.onnx"
    doc = _optimize(capsys, str(src), "--search", "none", *FAST, "-o", str(out))
    assert doc["original_nodes"] == 3, "the input file's nodes, not the IR's after folding"
    assert doc["optimized_nodes"] == len(onnx.load(str(out)).graph.node)


def test_the_estimate_is_that_of_the_written_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XRL_NO_CALIBRATION", "1")
    out = tmp_path / "o.onnx"
    doc = _optimize(capsys, "tiny_cnn", "--search", "greedy", "--prepass", "none", "--target", "ort-cpu", "-o",
                    str(out))
    code, cost_out, err = run(capsys, "cost", str(out), "--target", "ort-cpu", "--json")
    assert code == 0, err
    cost = json.loads(cost_out)
    value = next(v for k, v in cost.items() if k in ("cost", "cost_s", "estimate", "seconds"))
    assert doc["optimized_cost"] == pytest.approx(value, rel=1e-9)


# ----- --measure's verdict ------------------------------------------------------------------------------
def _measured(rounds, control, identical=False):
    from xrl.cost.speedup import MeasuredSpeedup

    return MeasuredSpeedup("t", None, None, tuple(rounds), identical=identical, control_speedups=tuple(control))


def test_identical_graphs_are_never_called_faster_or_slower():
    quiet = [1.0, 1.001, 0.999, 1.0005, 0.9995, 1.0]
    assert _measured([1.2] * 3 + [1.21] * 3, quiet, identical=True).verdict == "within noise"
    assert _measured([0.8] * 3 + [0.81] * 3, quiet, identical=True).verdict == "within noise"
    assert _measured([1.2] * 3 + [1.21] * 3, quiet).verdict == "faster"  # the same numbers, different graphs


def test_a_wide_interval_is_too_noisy_even_with_a_quiet_control():
    quiet = [1.0, 1.001, 0.999, 1.0005, 0.9995, 1.0]
    wide = [0.8, 1.25, 0.85, 1.2, 0.9, 1.1]  # centred near 1, half-width far over 3%
    assert _measured(wide, quiet).verdict == "too noisy to tell"
    assert _measured([1.0, 1.001, 0.999, 1.0, 1.0005, 0.9995], quiet).verdict == "within noise"


# ----- the same seed gives the same file -----------------------------------------------------------------
@pytest.mark.parametrize("search", ["random", "greedy", "taso", "tensat"])
def test_the_same_seed_gives_the_same_file_end_to_end(tmp_path, capsys, search):
    from xrl.search.compare import method_available

    if method_available(search):
        pytest.skip(method_available(search))
    docs, files = [], []
    for i in range(2):
        out = tmp_path / f"{i}.onnx"
        docs.append(_optimize(capsys, "mlp", "--search", search, "--seed", "7", "--steps", "4", *FAST,
                              "-o", str(out)))
        files.append(out.read_bytes())
    assert files[0] == files[1]
    assert docs[0]["steps"] == docs[1]["steps"] and docs[0]["optimized_cost"] == docs[1]["optimized_cost"]


def test_rl_sampling_with_the_same_seed_gives_the_same_file(tmp_path, capsys):
    files = []
    for i in range(2):
        out = tmp_path / f"{i}.onnx"
        _optimize(capsys, "mlp", "--search", "rl", "--rl-mode", "argmax", "--samples", "4", "--seed", "3", *FAST,
                  "-o", str(out))
        files.append(out.read_bytes())
    assert files[0] == files[1]


# ----- --force ----------------------------------------------------------------------------------------------
def test_force_replaces_a_file_and_its_absence_keeps_it(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    out.write_bytes(b"the user's file")
    code, _, err = run(capsys, "optimize", "mlp", "--search", "none", *FAST, "-o", str(out))
    assert_user_error(code, err, "--force")
    assert out.read_bytes() == b"the user's file"
    _optimize(capsys, "mlp", "--search", "none", *FAST, "-o", str(out), "--force")
    assert len(onnx.load(str(out)).graph.node) > 0
    assert [p.name for p in tmp_path.iterdir()] == ["o.onnx"]


# ----- rule verification reads every output ---------------------------------------------------------------
SECOND_OUTPUT_WRONG = """\
# Wrong in its second output only
rule merge_second_output_wrong family=merge
  y1 = MatMul(x, w1)
  y2 = MatMul(x, w2)
  where weight(w1) and weight(w2) and rank(w1) == 2 and rank(w2) == 2
  =>
  y1, y2 = Split(MatMul(x, Concat(w1, w1, axis=1)), axis=rank(y1) - 1, split=(dim(w1, 1), dim(w1, 1)))
  example x=[B, M, K], w1=[K, N], w2=[K, N]
"""


def test_rule_verification_compares_every_output_of_a_multi_output_rule():
    """The first output of this merge is right and the second is x @ w1 where x @ w2 was: a verifier that
    compares only the first output passes it."""
    from xrl.rewrite.lang import parse_rules
    from xrl.rewrite.verify import verify_rule

    (rule,) = parse_rules(SECOND_OUTPUT_WRONG)
    check = verify_rule(rule, seed=0)
    assert not check.ok and check.detail.startswith("output out1 "), check  # the second output

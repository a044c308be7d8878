"""Issue 26, item 4: an ONNX policy file is code. Its inputs, output, metadata and op types are checked on
load; each run is bounded in memory and time; an output that is not one finite score per action is refused."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper

from xrl.policies.export import export_onnx, sample_inputs
from xrl.policies.release import PolicyFileError, ReleasePolicy
from xrl.rl.checkpoint import default_policy_path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy") / "default.onnx"
    export_onnx(default_policy_path(), path)
    return path


@pytest.fixture(scope="module")
def feed():
    return sample_inputs("tiny_cnn", 16)


def _edit(src, dst, edit):
    model = onnx.load(str(src))
    edit(model)
    onnx.save(model, str(dst))
    return dst


def _after_logits(model, nodes, inits=(), out="logits_new"):
    """Route the policy's logits through `nodes` (reading "logits_raw", writing `out`, renamed "logits")."""
    for n in model.graph.node:
        n.output[:] = ["logits_raw" if o == "logits" else o for o in n.output]
    model.graph.initializer.extend(inits)
    model.graph.node.extend(nodes)
    for n in model.graph.node:
        n.output[:] = ["logits" if o == out else o for o in n.output]


def _i64(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def test_the_exported_policy_passes_its_own_checks(exported, feed):
    logits = ReleasePolicy(exported).logits(feed, timeout=30)
    assert logits.shape == (feed["u"].shape[0],) and np.isfinite(logits).all()


def test_a_policy_with_a_loop_is_refused_on_load(exported, tmp_path):
    def add_loop(model):
        body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
                                 [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                  helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                                 [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])])
        true = helper.make_tensor("true", TensorProto.BOOL, [], [True])
        _after_logits(model, [helper.make_node("Loop", ["", "true"], [], body=body),  # while true: forever
                              helper.make_node("Identity", ["logits_raw"], ["logits_new"])], [true])

    path = _edit(exported, tmp_path / "loop.onnx", add_loop)
    with pytest.raises(PolicyFileError, match="op types an exported policy never does \\(Loop\\)"):
        ReleasePolicy(path)


def test_a_policy_that_allocates_gigabytes_is_stopped(exported, tmp_path, feed, capsys):
    def bomb(model):  # 2 GiB of zeros, summed into the logits: allowed ops, unbounded memory
        _after_logits(model, [helper.make_node("ConstantOfShape", ["bomb_shape"], ["zeros"]),
                              helper.make_node("ReduceSum", ["zeros"], ["total"], keepdims=0),
                              helper.make_node("Add", ["logits_raw", "total"], ["logits_new"])],
                      [_i64("bomb_shape", [1 << 29])])

    path = _edit(exported, tmp_path / "bomb.onnx", bomb)
    policy = ReleasePolicy(path)
    with pytest.raises(PolicyFileError, match="needed more than"):
        policy.logits(feed)
    code, _, err = run(capsys, "optimize", "mlp", "--search", "rl", "--policy", str(path), "--prepass", "none",
                       "--target", "paper", "-o", str(tmp_path / "o.onnx"))
    assert_user_error(code, err, "needed more than")


def test_a_slow_policy_is_terminated_at_its_time_limit(exported, tmp_path, feed):
    def slow(model):  # 400 products of 512x512 matrices: seconds of work, allowed ops
        nodes = [helper.make_node("ConstantOfShape", ["m_shape"], ["m0"],
                                  value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1e-3]))]
        for i in range(400):
            nodes.append(helper.make_node("MatMul", [f"m{i}", "m0"], [f"m{i + 1}"]))
        nodes += [helper.make_node("ReduceSum", ["m400"], ["total"], keepdims=0),
                  helper.make_node("Mul", ["total", "zero"], ["nothing"]),
                  helper.make_node("Add", ["logits_raw", "nothing"], ["logits_new"])]
        _after_logits(model, nodes, [_i64("m_shape", [512, 512]),
                                     helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])

    policy = ReleasePolicy(_edit(exported, tmp_path / "slow.onnx", slow), threads=1)
    t0 = time.monotonic()
    with pytest.raises(PolicyFileError, match="took longer than 0.2 s"):
        policy.logits(feed, timeout=0.2)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("extra, needle", [
    ([1e9], r"gave \(\d+,\) scores for \d+ actions"),  # the highest score is outside the candidates
    ([], None),
])
def test_scores_must_be_one_per_action(exported, tmp_path, feed, extra, needle):
    def more(model):
        if extra:
            _after_logits(model, [helper.make_node("Concat", ["logits_raw", "extra"], ["logits_new"], axis=0)],
                          [helper.make_tensor("extra", TensorProto.FLOAT, [len(extra)], extra)])

    policy = ReleasePolicy(_edit(exported, tmp_path / "more.onnx", more))
    if needle is None:
        policy.logits(feed)
        return
    with pytest.raises(PolicyFileError, match=needle):
        policy.logits(feed)


def test_a_nan_score_is_refused(exported, tmp_path, feed):
    def nan(model):
        _after_logits(model, [helper.make_node("Add", ["logits_raw", "nan"], ["logits_new"])],
                      [helper.make_tensor("nan", TensorProto.FLOAT, [], [float("nan")])])

    with pytest.raises(PolicyFileError, match="not finite"):
        ReleasePolicy(_edit(exported, tmp_path / "nan.onnx", nan)).logits(feed)


def _rename_input(model):
    for i in model.graph.input:
        if i.name == "x":
            i.name = "features"
    for n in model.graph.node:
        n.input[:] = ["features" if v == "x" else v for v in n.input]


def _rename_output(model):
    for n in model.graph.node:
        n.output[:] = ["scores" if o == "logits" else o for o in n.output]
    model.graph.output[0].name = "scores"


def _meta(key, value):
    def edit(model):
        kept = [p for p in model.metadata_props if p.key != key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        if value is not None:
            model.metadata_props.add(key=key, value=value)
    return edit


@pytest.mark.parametrize("edit, needle", [
    (_rename_input, "missing: x"),
    (_rename_output, "no output 'logits'"),
    (_meta("policy_config", None), "no 'policy_config' metadata"),
    (_meta("policy_config", "{not json"), "not JSON"),
    (_meta("policy_config", "[1, 2]"), "is a list"),
    (_meta("policy_config", "{}"), "features of size (None, None, None)"),
    (_meta("max_candidates", '"16"'), "'max_candidates' metadata is a str"),
    (_meta("format", None), "not an exported xrl policy"),
])
def test_malformed_policy_files_are_one_line_user_errors(exported, tmp_path, capsys, edit, needle):
    path = _edit(exported, tmp_path / "bad.onnx", edit)
    code, _, err = run(capsys, "optimize", "mlp", "--search", "rl", "--policy", str(path), "--prepass", "none",
                       "--target", "paper", "-o", str(tmp_path / "o.onnx"))
    assert_user_error(code, err, needle)


def test_a_policy_that_is_not_a_file_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "p.onnx")
    with pytest.raises(PolicyFileError, match="not a regular file"):
        ReleasePolicy(tmp_path / "p.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\xff" * 100)
    with pytest.raises(PolicyFileError, match="not a readable ONNX model"):
        ReleasePolicy(tmp_path / "junk.onnx")


def test_the_pipe_policy_blames_the_host_for_indices_outside_its_tensors(exported):
    from xrl.policies.release import pad_inputs, pipe_policy, pipe_specs
    from xrl.serve.pipe import PipeProtocolError

    feed = sample_inputs("tiny_cnn", 4)
    specs = pipe_specs(feed["x"].shape[0], feed["edge_index"].shape[1], feed["u"].shape[0])
    obs = pad_inputs(feed, specs)
    choose = pipe_policy(ReleasePolicy(exported), 30)
    assert 0 <= choose(obs) < feed["u"].shape[0]
    obs["edge_index"] = obs["edge_index"].copy()
    obs["edge_index"][0, 0] = 10 ** 6
    with pytest.raises(PipeProtocolError, match="points outside"):
        choose(obs)
    obs["counts"] = np.array([10 ** 6, 1, 1])
    with pytest.raises(PipeProtocolError, match="padded inputs"):
        choose(obs)

"""Issue 34 item 7: each message one clear line. A truncated checkpoint, a directory or a device given to
`resume=`; a model with control flow; `xrl sweep summarize` on garbage (nothing of matplotlib's on stderr).
(The "waiting for the timing cache lock" line is tested in test_hardening3_cache.py.)"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper

from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


@pytest.fixture()
def truncated(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(hidden=8, layers=1, heads=2)))
    path = save_checkpoint(tmp_path / "last.pt", policy, optimizer=torch.optim.Adam(policy.parameters()), update=1,
                           rng={"torch": torch.get_rng_state()}, config={"env": {}})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_truncated_checkpoint_is_one_line(truncated: Path, capsys) -> None:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(truncated)
    assert "\n" not in str(e.value) and "truncated or damaged" in str(e.value)
    code, _, err = run(capsys, "policy", "export", str(truncated), "-o", str(truncated.parent / "p.onnx"))
    assert_user_error(code, err, "is not a readable checkpoint, truncated or damaged")


@pytest.mark.parametrize("where,words", [("dir", "is a directory, not a policy checkpoint"),
                                         ("/dev/zero", "is not a regular file")])
def test_resume_from_a_directory_or_a_device_says_what_it_is(tmp_path: Path, where: str, words: str) -> None:
    path = tmp_path if where == "dir" else Path(where)
    with pytest.raises(CheckpointError, match=words) as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value) and "no such" not in str(e.value)


def loop_model(tmp_path: Path, op: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    if op == "If":
        branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "b", [],
                                   [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])])
        nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                 helper.make_node("Greater", ["s", "zero"], ["c"]),
                 helper.make_node("If", ["c"], ["y"], name="branch", then_branch=branch, else_branch=branch)]
        inits = [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])]
    else:  # Loop: y = x + 1, three times
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v", "one"], ["v2"])],
            "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v2", TensorProto.FLOAT, None)])
        nodes = [helper.make_node("Loop", ["trip", "cond", "x"], ["y"], name="loop", body=body)]
        inits = [helper.make_tensor("trip", TensorProto.INT64, [], [3]),
                 helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
                 helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    g = helper.make_graph(nodes, "cf", [x], [y], inits)
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("op", ["Loop", "If"])
def test_a_control_flow_model_is_told_so(tmp_path: Path, capsys, op: str) -> None:
    path = loop_model(tmp_path, op)
    code, _, err = run(capsys, "optimize", str(path), "-o", str(tmp_path / "o.onnx"))
    assert_user_error(code, err, f"is a {op}", "control flow (If, Loop, Scan) is not supported")
    assert "--input-shape" not in err


def test_sweep_summarize_on_garbage_writes_nothing_of_matplotlibs_to_stderr(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "r1" / ".hydra").mkdir(parents=True)
    (tmp_path / "r1" / ".hydra" / "overrides.yaml").write_bytes(b"- a=\x01\x02\n- $b$\n")
    (tmp_path / "r1" / "metrics.jsonl").write_bytes(
        b'{"speedup/\\u0000g\\u0007": 1.2, "speedup/$x^": 1.1, "speedup/_a": 0.9, "speedup/big": 1e308}\n'
        b'garbage\n\xff\xfe\n{"speedup/g\\ud800": 2}\n')
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "metrics.jsonl").write_text('{"speedup/g": 1.5}\n')
    code, out, err = run(capsys, "sweep", "summarize", str(tmp_path))
    assert code == 0 and err == "", err
    assert (tmp_path / "summary.png").exists() and "1e+308" not in out and "10000000" not in out
    assert "?g?" in (tmp_path / "summary.md").read_text()

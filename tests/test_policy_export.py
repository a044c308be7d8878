"""Release-mode policies: `xrl policy export` writes ONNX that makes the checkpoint's decisions, and
`xrl optimize --search rl --policy FILE.onnx` runs it with neither torch_geometric nor xrl.nn / xrl.rl imported."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from cli_helpers import assert_user_error, run

from xrl.cost import get_cost_model
from xrl.env import resolve_graph
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.policies.export import export_onnx
from xrl.policies.release import ReleasePolicy, release_search, state_inputs
from xrl.rl.checkpoint import default_policy_path, load_policy, save_checkpoint
from xrl.rl.evaluate import make_env, optimize_with_policy
from xrl.rl.rollout import observe

# Imports a release run must not make: a meta_path hook raises on them (and on their submodules).
BLOCKER = """
import sys
BLOCKED = ("torch_geometric", "xrl.nn", "xrl.rl")
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"blocked import: {name}")
sys.meta_path.insert(0, Blocker())
from xrl.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("release") / "default.onnx"
    export_onnx(default_policy_path(), path)
    return path


def _random_checkpoint(tmp_path, kind: str, pooling: str):
    torch.manual_seed(0)
    cfg = PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(kind=kind, hidden=8, layers=2, heads=2,
                                                                     pooling=pooling))
    policy = GraphPolicy(cfg)
    with torch.no_grad():  # larger weights than the init, so that every layer moves the logits
        for p in policy.parameters():
            p.mul_(3.0)
    return save_checkpoint(tmp_path / f"{kind}-{pooling}.pt", policy, config={"env": {"max_candidates": 16}})


def _checkpoint_logits(net, env) -> np.ndarray:
    with torch.no_grad():
        return net(observe(env, net.features()))[0].logits.numpy()


# Every encoder kind and every pooling once: PyG's layers as exported, GCN's degree, max/attention scatters.
@pytest.mark.parametrize("kind, pooling", [("gat", "mean"), ("gatv2", "max"), ("gin", "attention"), ("gcn", "sum")])
def test_the_export_computes_the_checkpoints_logits(tmp_path, kind, pooling):
    ckpt = _random_checkpoint(tmp_path, kind, pooling)
    export_onnx(ckpt, tmp_path / "p.onnx", sample_graph="mlp")  # checked on mlp inside; here on another graph
    net, _ = load_policy(ckpt)
    release = ReleasePolicy(tmp_path / "p.onnx")
    env = make_env(resolve_graph("tiny_cnn"), get_cost_model("analytic"), max_candidates=16)
    env.reset(options={"graph": "tiny_cnn"})
    env.step(1)  # a state other than the start, whose candidates differ in size
    expected, got = _checkpoint_logits(net, env), release.logits(state_inputs(env))
    assert got.shape == expected.shape and expected.std() > 1e-3, "the logits tell candidates apart"
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_exported_default_policy_makes_the_checkpoints_decisions(exported):
    """On mlp (7 decisions); experiments/check_release_policy.py checks the whole suite."""
    net, ckpt = load_policy(default_policy_path())
    release = ReleasePolicy(exported)
    cost = get_cost_model("analytic")
    g = resolve_graph("mlp")
    theirs = optimize_with_policy(net, g, cost, horizon=50, max_candidates=release.max_candidates)
    ours = release_search(g, cost, release, horizon=50, max_candidates=release.max_candidates)
    assert ours.steps == theirs.steps and ours.steps, "the same rewrites, and some"
    assert ours.cost == theirs.cost


def test_optimize_with_an_onnx_policy_runs_without_pyg_or_training_code(exported, capsys):
    args = ("optimize", "mlp", "--search", "rl", "--target", "paper", "--json")
    blocked = subprocess.run([sys.executable, "-c", BLOCKER, *args, "--policy", str(exported)],
                             capture_output=True, text=True, timeout=120)
    assert blocked.returncode == 0, blocked.stderr
    ours = json.loads(blocked.stdout)
    code, out, err = run(capsys, *args, "--rl-mode", "argmax")  # the checkpoint's argmax, in process
    assert code == 0, err
    theirs = json.loads(out)
    assert ours["rewrites"] == theirs["rewrites"] > 0
    assert ours["optimized_cost"] == pytest.approx(theirs["optimized_cost"], rel=1e-9)


def test_the_blocker_blocks(tmp_path):
    """The hook of the test above does fail a run that needs the training stack (the checkpoint path)."""
    run = subprocess.run([sys.executable, "-c", BLOCKER, "optimize", "mlp", "--search", "rl", "--rl-mode", "argmax",
                          "--target", "paper"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "blocked import" in run.stderr


def test_bad_policy_files_are_user_errors(tmp_path, capsys):
    out = str(tmp_path / "p.onnx")
    assert_user_error(*run(capsys, "policy", "export", str(tmp_path / "missing.pt"), "-o", out)[::2],
                      "no such policy checkpoint")
    assert_user_error(*run(capsys, "policy", "export", "default", "-o", str(tmp_path / "p.pt"))[::2],
                      "must be a .onnx file")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not onnx")
    args = ("optimize", "mlp", "--search", "rl", "--target", "paper", "--policy")
    assert_user_error(*run(capsys, *args, str(junk))[::2], "not a readable ONNX model")
    assert_user_error(*run(capsys, *args, str(tmp_path / "none.onnx"))[::2], "no such policy file")

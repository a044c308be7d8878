"""The C client of the policy server (clients/c/xrl_client.c): compiled with cc, it creates the pipes, starts the
server and the env side, relays a full episode, and a truncated message ends the exchange on both sides."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import xrl  # noqa: F401
from xrl.serve.pipe import hint_policy

ROOT = Path(__file__).resolve().parent.parent
SOURCE, ENV_SIDE = ROOT / "clients" / "c" / "xrl_client.c", ROOT / "clients" / "c" / "env_side.py"
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

pytestmark = [pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system"),
              pytest.mark.skipif(CC is None, reason="no C compiler (cc, gcc or clang) to build clients/c/xrl_client.c")]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    exe = tmp_path_factory.mktemp("c_client") / "xrl_client"
    build = subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-o", str(exe), str(SOURCE)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return exe


def _run(client, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(client), "--python", sys.executable, "--env-side", str(ENV_SIDE), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_an_episode_through_xrl_serve_equals_the_in_process_run(client):
    run = _run(client, "--graph", "mlp", "--max-candidates", "16", "--horizon", "6", "--timeout", "60")
    assert run.returncode == 0, run.stderr
    served = json.loads(run.stdout)["actions"]
    env = gym.make("xrl/GraphRewrite-v0", graph="mlp", max_candidates=16, horizon=6).unwrapped
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        obs, _, te, tr, _ = env.step(hint_policy(obs))
        done = te or tr
    assert served == list(env.actions) and served
    assert "decisions relayed" in run.stderr and "served" in run.stderr


@pytest.mark.parametrize("server", ["xrl", "xrl.policies.release"])  # `xrl serve`, and the onnxruntime-only server
def test_an_exported_policy_served_through_the_c_client_equals_search_rl(client, tmp_path, server):
    from xrl.cost import get_cost_model
    from xrl.env import resolve_graph
    from xrl.policies.export import export_onnx
    from xrl.rl.checkpoint import default_policy_path
    from xrl.rl.rl_search import rl_search

    policy = tmp_path / "default.onnx"
    export_onnx(default_policy_path(), policy)
    run = _run(client, "--graph", "mlp", "--observation", "release", "--max-candidates", "32",
               "--server-module", server, "--policy", str(policy), "--timeout", "60")
    assert run.returncode == 0, run.stderr
    served = json.loads(run.stdout)
    theirs = rl_search(resolve_graph("mlp"), get_cost_model("analytic"), mode="argmax")  # the checkpoint
    assert served["rewrites"] == list(theirs.steps) and served["rewrites"]
    assert served["cost"] == pytest.approx(theirs.cost, rel=1e-12)


def test_a_truncated_message_ends_the_exchange_on_both_sides(client):
    run = _run(client, "--graph", "mlp", "--max-candidates", "16", "--horizon", "6", "--timeout", "60",
               "--truncate-at", "1", timeout=150)
    assert run.returncode == 1
    err = run.stderr
    assert "xrl: error: serve: truncated feature" in err, err  # the server's side
    assert "closed the advice pipe after truncated observation 1" in err, err  # the client's
    # and the graph-holding side's: no advice (truncated advice), or its next write finds the pipe closed
    # the env side sees the advice cut short, or its observation pipe closed first: either ends the exchange
    assert any(f"env side: error: {why}" in err for why in ("truncated advice", "the client closed",
                                                               "the other side closed")), err


def test_bad_arguments_are_usage_errors_and_a_dead_server_no_hang(client, tmp_path):
    run = subprocess.run([str(client), "--graph"], capture_output=True, text=True, timeout=10)
    assert run.returncode == 2 and "usage: xrl_client" in run.stderr
    false = shutil.which("false")
    if false:  # both children exit at once: the client says so instead of waiting on its pipes
        run = subprocess.run([str(client), "--python", false], capture_output=True, text=True, timeout=30)
        assert run.returncode == 1 and "exited (status 1) before opening its pipe" in run.stderr, run.stderr

"""The policy server over two named pipes: a full episode through `xrl serve`, and broken messages end it cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest

import xrl  # noqa: F401
from xrl.serve.host import ADVICE, drive
from xrl.serve.pipe import PipeProtocolError, PolicyServer, hint_policy, read_advice, serve_pipes

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")


@pytest.fixture()
def pipes(tmp_path):
    paths = str(tmp_path / "in.pipe"), str(tmp_path / "out.pipe")
    for p in paths:
        os.mkfifo(p)  # creating (and removing) the pipes is the host's job
    return paths


@pytest.fixture(scope="module")
def engine():
    from xrl.rewrite import RewriteEngine

    return RewriteEngine.default()


def _env(engine):
    return gym.make("xrl/GraphRewrite-v0", graph="mlp", max_candidates=16, horizon=6, engine=engine).unwrapped


def _in_process(env) -> list[str]:
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        obs, _, te, tr, _ = env.step(hint_policy(obs))
        done = te or tr
    return list(env.actions)


def test_an_episode_through_the_cli_server_equals_the_in_process_run(pipes, engine):
    server = subprocess.Popen([sys.executable, "-m", "xrl", "serve", "--in", pipes[0], "--out", pipes[1]],
                              stderr=subprocess.PIPE, text=True)
    try:
        served = drive(_env(engine), *pipes)
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    assert served == _in_process(_env(engine)) and served, "the mlp has rewrites that lower the cost"
    assert "decisions" in err


def _serve_in_thread(pipes, result: dict) -> threading.Thread:
    def run():
        try:
            result["n"] = serve_pipes(*pipes, lambda obs: 0, timeout=5.0)  # a policy that reads no feature
        except PipeProtocolError as e:
            result["error"] = str(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("payload, message", [
    (b"not json\n", "malformed header"),
    (b'{"features": [{"name": "x", "shape": [4], "type": "float32"}], "advice": {"name": "a", "shape": [1], '
     b'"type": "int64"}}\n{"observation": 0}\n' + b"\0" * 7, "truncated feature 'x'"),
    (b'{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}}\n{"observation": 3}\n\n',
     "expected {\"observation\": 0}"),
])
def test_broken_messages_end_the_exchange_on_both_sides(pipes, payload, message):
    result: dict = {}
    t = _serve_in_thread(pipes, result)
    with open(pipes[0], "wb", buffering=0) as to_server, open(pipes[1], "rb", buffering=0) as from_server:
        to_server.write(payload)
        to_server.close()
        with pytest.raises(PipeProtocolError, match="truncated advice"):
            read_advice(from_server, ADVICE, timeout=10)  # the server closed its end: no hang
    t.join(10)
    assert not t.is_alive() and message in result.get("error", ""), result


def test_a_stalled_message_times_out(pipes):
    import io

    class Stalled(io.RawIOBase):
        def fileno(self):
            return self._r

    r, w = os.pipe()
    inp = Stalled()
    inp._r = r
    os.write(w, b'{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}}\n{"observ')
    with pytest.raises(PipeProtocolError, match="no data for 0.2 s"):
        PolicyServer(lambda obs: 0, timeout=0.2).serve(inp, io.BytesIO())
    os.close(r)
    os.close(w)
    assert np.int64(0).nbytes == ADVICE.nbytes

"""Issue 26, item 3: the C client's header reader is real JSON with checked arithmetic (it agrees with the
server on every header), and a client killed by a signal leaves neither its FIFO folder nor stuck children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_c_client import CC, ENV_SIDE, ROOT, SOURCE

pytestmark = [pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system"),
              pytest.mark.skipif(CC is None, reason="no C compiler")]

ADVICE = {"name": "a", "shape": [1], "type": "int64"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    exe = tmp_path_factory.mktemp("c_client2") / "xrl_client"
    build = subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-o", str(exe), str(SOURCE)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return exe


def _parse(client, line: str, env=None) -> tuple[int, str]:
    res = subprocess.run([str(client), "--parse-header"], input=line + "\n", capture_output=True, text=True,
                         timeout=10, env=env)
    return res.returncode, (res.stdout + res.stderr).strip()


def _server_sizes(line: str) -> str | None:
    """What xrl serve reads from the same header: the byte sizes, or None if it refuses it."""
    from xrl.serve.pipe import PipeProtocolError, _Reader, read_header

    r, w = os.pipe()
    os.write(w, line.encode() + b"\n")
    os.close(w)
    try:
        features, advice = read_header(_Reader(r, 1.0))
    except PipeProtocolError:
        return None
    finally:
        os.close(r)
    return " ".join([str(f.nbytes) for f in features] + ["advice", str(advice.nbytes)])


def _h(features, advice=ADVICE, **extra) -> str:
    return json.dumps({"features": features, "advice": advice, **extra})


@pytest.mark.parametrize("line", [
    _h([{"name": "x", "shape": [2, 3], "type": "float32"}]),
    _h([{"name": "advice", "shape": [4], "type": "int64"}]),  # a feature named "advice"
    _h([{"name": "x}", "shape": [5], "type": "uint8"}, {"name": "y\"]", "shape": [], "type": "bool"}]),
    _h([{"name": "x", "shape": [1], "type": "float32"}], note={"shape": [10 ** 6]}),  # a key inside another value
    _h([{"name": "x", "shape": [2 ** 62], "type": "float32"}]),  # wrapped to 0 bytes before
    _h([{"name": "x", "shape": [2 ** 64], "type": "float32"}]),
    _h([{"name": "x", "shape": [2 ** 31, 2 ** 31, 4], "type": "float32"}]),
    _h([{"name": "x", "shape": [1.5], "type": "float32"}]),
    _h([{"name": "x", "shape": [-1], "type": "float32"}]),
    _h([{"name": "x", "shape": [1], "type": "float32", "shape2": [3]}]),
    '{"features": [{"name": "x", "shape": [1], "shape": [4], "type": "float32"}], "advice": '
    '{"name": "a", "shape": [1], "type": "int64"}}',  # a duplicate "shape"
    '{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}, "features": []}',
    '{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}} trailing',
    '{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}, "x": ' + "[" * 100 + "]" * 100 + "}",
    '{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}, "x": ' + "[" * 20 + "]" * 20 + "}",
    '{"features": [{"name": "x", "shape": [1], "type": "float32"]}',
])
def test_the_client_and_the_server_read_every_header_alike(client, line):
    code, out = _parse(client, line)
    server = _server_sizes(line)
    if server is None:
        assert code == 2 and "malformed header" in out, out
    else:
        assert code == 0 and out == server, (out, server)


def test_the_client_checks_sizes_against_xrl_max_elements(client):
    line = _h([{"name": "x", "shape": [1001], "type": "float32"}])
    assert _parse(client, line, env={**os.environ, "XRL_MAX_ELEMENTS": "1000"})[0] == 2
    assert _parse(client, line)[0] == 0


def _children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _start(client, tmp_path):
    """A client whose server will never answer in time: it waits in the exchange. Returns (process, folder)."""
    before = set(Path("/tmp").glob("xrl_client.*"))
    proc = subprocess.Popen([str(client), "--python", sys.executable, "--env-side", str(ENV_SIDE), "--graph", "mlp",
                             "--timeout", "60"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = set(Path("/tmp").glob("xrl_client.*")) - before
        if new and len(_children_of(proc.pid)) >= 2:
            return proc, new.pop()
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("the client did not start its children")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_client_removes_its_fifos_and_ends_its_children(client, tmp_path, sig):
    proc, folder = _start(client, tmp_path)
    children = _children_of(proc.pid)
    proc.send_signal(sig)
    assert proc.wait(30) == 128 + sig
    assert not folder.exists(), "the FIFO folder was left behind"
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"children outlived the client: {alive}"


def test_a_killed_client_leaves_no_child_stuck(client, tmp_path):
    proc, folder = _start(client, tmp_path)
    children = _children_of(proc.pid)
    proc.kill()  # SIGKILL: nothing of the client runs; its children must not wait in open() for good
    proc.wait(30)
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"children outlived the client: {alive}"
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()

"""Issue 26, items 1 and 2: `xrl serve` honours --timeout everywhere (a host that never opens a pipe, or
never reads the answers), and trusts neither the sizes a header declares nor the paths it is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from cli_helpers import assert_user_error, run

from xrl.serve.pipe import FifoWriter, PipeProtocolError, open_fifo, serve_pipes

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")

ADVICE = {"name": "a", "shape": [1], "type": "int64"}


@pytest.fixture()
def pipes(tmp_path):
    paths = str(tmp_path / "in.pipe"), str(tmp_path / "out.pipe")
    for p in paths:
        os.mkfifo(p)
    return paths


def _server(pipes, policy=lambda obs: 0, timeout=0.5) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def go():
        t0 = time.monotonic()
        try:
            result["n"] = serve_pipes(*pipes, policy, timeout=timeout)
        except PipeProtocolError as e:
            result["error"] = str(e)
        result["s"] = time.monotonic() - t0

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, result


def _header(features=(), advice=ADVICE) -> bytes:
    return json.dumps({"features": list(features), "advice": advice}).encode() + b"\n"


def _finish(t: threading.Thread, result: dict) -> dict:
    t.join(20)
    assert not t.is_alive(), "the server hangs"
    return result


# ----- item 1: no wait without a deadline ---------------------------------------------------------------
def test_a_host_that_never_opens_a_pipe_times_out(pipes):
    result = _finish(*_server(pipes))
    assert "did not open" in result["error"] and "within 0.5 s" in result["error"]
    assert result["s"] < 10


def test_a_host_that_opens_in_but_never_writes_times_out(pipes):
    t, result = _server(pipes)
    fd = os.open(pipes[0], os.O_WRONLY)  # waits for the server to open its end, which it does at once
    try:
        reader = open_fifo(pipes[1], "r", 10)
        _finish(t, result)
        os.close(reader)
    finally:
        os.close(fd)
    assert "no data for 0.5 s while reading header" in result["error"]


def test_a_host_that_never_opens_out_times_out(pipes):
    t, result = _server(pipes)
    with FifoWriter(open_fifo(pipes[0], "w", 10), 10) as to_server:
        to_server.write(_header() + b'{"observation": 0}\n\n')
        _finish(t, result)
    assert "did not open" in result["error"] and pipes[1] in result["error"]


def test_a_host_that_never_reads_the_answers_times_out(pipes):
    """After about 8,000 answers the advice pipe is full: the server fails after --timeout, not never."""
    t, result = _server(pipes, timeout=0.5)
    stop = threading.Event()

    def host():  # writes observations and never reads an answer
        try:
            with FifoWriter(open_fifo(pipes[0], "w", 10), 2) as to_server:
                to_server.write(_header())
                for k in range(20_000):
                    if stop.is_set():
                        return
                    to_server.write(json.dumps({"observation": k}).encode() + b"\n\n")
        except PipeProtocolError:
            pass  # the server stopped reading: expected

    writer = threading.Thread(target=host, daemon=True)
    writer.start()
    fd = os.open(pipes[1], os.O_RDONLY)  # opened, never read
    try:
        _finish(t, result)
    finally:
        stop.set()
        writer.join(10)
        os.close(fd)
    assert "read nothing from the advice pipe" in result["error"], result


def test_cli_serve_refuses_the_same_pipe_twice_and_files(capsys, tmp_path, pipes):
    code, _, err = run(capsys, "serve", "--in", pipes[0], "--out", pipes[0], "--timeout", "1")
    assert_user_error(code, err, "same pipe")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    code, _, err = run(capsys, "serve", "--in", pipes[0], "--out", str(precious), "--timeout", "1")
    assert_user_error(code, err, "not a named pipe")
    assert precious.read_text() == "keep me"
    code, _, err = run(capsys, "serve", "--in", str(precious), "--out", pipes[1], "--timeout", "1")
    assert_user_error(code, err, "not a named pipe")
    code, _, err = run(capsys, "serve", "--in", str(tmp_path / "nope"), "--out", pipes[1])
    assert_user_error(code, err, "mkfifo")


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_cli_serve_refuses_a_timeout_that_is_not_positive(capsys, pipes, timeout):
    code, _, err = run(capsys, "serve", "--in", pipes[0], "--out", pipes[1], "--timeout", timeout)
    assert_user_error(code, err, "--timeout")


def test_cli_serve_over_an_unopened_pipe_ends_after_its_timeout(pipes):
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "xrl", "serve", "--in", pipes[0], "--out", pipes[1], "--timeout",
                          "0.5"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "did not open" in res.stderr
    assert time.monotonic() - t0 < 30


# ----- item 2: declared sizes and shapes ------------------------------------------------------------------
def _exchange(pipes, payload: bytes, policy=lambda obs: 0, timeout=2.0) -> dict:
    t, result = _server(pipes, policy, timeout)
    with FifoWriter(open_fifo(pipes[0], "w", 10), 10) as to_server:
        fd = open_fifo(pipes[1], "r", 10)
        try:
            try:
                to_server.write(payload)
            except PipeProtocolError:
                pass  # the server refused early and closed its end
            to_server.close()
            _finish(t, result)
        finally:
            os.close(fd)
    return result


@pytest.mark.parametrize("shape, needle", [
    ([2 ** 62], "over xrl's limit"),
    ([2 ** 64], "over xrl's limit"),
    ([2 ** 31, 2 ** 31, 2 ** 31], "over xrl's limit"),
    ([1.5], "non-negative integers"),
    ([True], "non-negative integers"),
    (["3"], "non-negative integers"),
    ([-1], "non-negative integers"),
    ([1] * 9, "at most 8"),
])
def test_a_declared_shape_is_checked_when_the_header_is_parsed(pipes, shape, needle):
    result = _exchange(pipes, _header([{"name": "x", "shape": shape, "type": "float32"}]))
    assert needle in result["error"], result


def test_the_limit_is_xrl_max_elements(pipes, monkeypatch):
    monkeypatch.setenv("XRL_MAX_ELEMENTS", "1000")
    result = _exchange(pipes, _header([{"name": "x", "shape": [1001], "type": "float32"}]))
    assert "1,001 elements" in result["error"] and "XRL_MAX_ELEMENTS" in result["error"]
    monkeypatch.setenv("XRL_MAX_ELEMENTS", "1000")
    two = [{"name": n, "shape": [1000], "type": "float64"} for n in ("a", "b")]  # each fits, together they do not
    assert "bytes per observation" in _exchange(pipes, _header(two))["error"]


@pytest.mark.parametrize("payload, needle", [
    (b"[" * 100_000 + b"\n", "nested too deeply"),
    (b'{"features": [], "advice": ' + b"[" * 100_000 + b"\n", "nested too deeply"),
    (b'{"features": [{"name": "x", "shape": [1], "type": "float32"}, {"name": "x", "shape": [1], '
     b'"type": "float32"}], "advice": {"name": "a", "shape": [1], "type": "int64"}}\n', "appears twice"),
    (b'{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64", "extra": 1}}\n', "malformed tensor"),
    (b'{"features": [], "advice": {"name": "a", "shape": [1], "type": "int64"}}\n{"observation": 1' + b"0" * 5000
     + b"}\n", "not a JSON line"),
    (b'\xff\xfe\n', "not a JSON line"),
])
def test_malformed_headers_are_protocol_errors(pipes, payload, needle):
    result = _exchange(pipes, payload)
    assert needle in result.get("error", ""), result


def test_a_feature_the_policy_reads_must_be_declared(pipes):
    from xrl.serve.pipe import hint_policy

    result = _exchange(pipes, _header([{"name": "action_mask", "shape": [3], "type": "int8"}]), hint_policy)
    assert "no feature 'cand_hints'" in result["error"]
    result = _exchange(pipes, _header([{"name": "action_mask", "shape": [3], "type": "int8"},
                                       {"name": "cand_hints", "shape": [3], "type": "float32"}]), hint_policy)
    assert "rank 2" in result["error"]


def test_a_policy_that_cannot_read_the_observation_is_a_protocol_error(pipes):
    def reads_y(obs):
        return int(obs["y"][0])

    result = _exchange(pipes, _header([{"name": "x", "shape": [1], "type": "int64"}]) + b'{"observation": 0}\n'
                       + b"\0" * 8 + b"\n", reads_y)
    assert "cannot read observation 0" in result["error"]


SERVER = """
import resource, sys
from xrl.serve.pipe import serve_pipes
serve_pipes(sys.argv[1], sys.argv[2], lambda obs: 0, timeout=20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_kib(pipes, nbytes: int) -> int:
    server = subprocess.Popen([sys.executable, "-c", SERVER, *pipes], stdout=subprocess.PIPE, text=True)
    try:
        with FifoWriter(open_fifo(pipes[0], "w", 30), 30) as to_server:
            fd = open_fifo(pipes[1], "r", 30)
            to_server.write(_header([{"name": "x", "shape": [nbytes], "type": "uint8"}]) + b'{"observation": 0}\n')
            block = b"\1" * (1 << 20)
            for _ in range(nbytes >> 20):
                to_server.write(block)
            to_server.write(b"\n")
            to_server.close()
            out, _ = server.communicate(timeout=60)
            os.close(fd)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0
    return int(out.strip())


def test_a_large_feature_is_held_once(pipes):
    """A feature of 96 MiB grows the server by about 96 MiB, not twice that (it is read in place)."""
    base = _peak_kib(pipes, 1 << 20)
    big = _peak_kib(pipes, 96 << 20)
    assert big - base < 1.4 * (96 << 10), (base, big)

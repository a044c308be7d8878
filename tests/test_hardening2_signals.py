"""Issue 26, item 7: SIGTERM unwinds like Ctrl-C (children ended, temporaries removed), a pre-pass child
dies with its parent however the parent dies, and concurrent writers never share a temporary name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals, Linux's PDEATHSIG")

# A process that runs a pre-pass which never ends, in a child, under the CLI's signal handling.
PREPASS_FOREVER = textwrap.dedent("""
    import sys, time
    import onnx
    from xrl.cli.main import Terminated, install_sigterm_handler
    from xrl.frontends import prepass

    def forever(model):
        time.sleep(600)

    prepass.PASSES["forever"] = prepass.Prepass(forever)
    install_sigterm_handler()
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    print("ready", flush=True)
    try:
        prepass._run_bounded("forever", model, 300)
    except Terminated:
        sys.exit(143)
""")


def _start_with_child(tmp_path):
    script = tmp_path / "prepass_forever.py"
    script.write_text(PREPASS_FOREVER)
    private = tmp_path / "tmp"  # a SIGKILLed parent cannot remove its pass's scratch folder: not in the real /tmp
    private.mkdir()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(private)})
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if children:
            return proc, children[0]
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("the pre-pass child never started")


def _gone(p: psutil.Process, within: float = 10.0) -> bool:
    try:
        p.wait(within)  # reaps it if it is ours; else waits for it to vanish
    except psutil.TimeoutExpired:
        return False
    return True


def test_sigterm_ends_the_prepass_child_and_exits_143(tmp_path):
    proc, child = _start_with_child(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
        assert _gone(child), "the pre-pass child outlived a SIGTERM to xrl"
    finally:
        for p in (proc,):
            if p.poll() is None:
                p.kill()
        if child.is_running():
            child.kill()


def test_a_prepass_child_dies_with_a_sigkilled_parent(tmp_path):
    proc, child = _start_with_child(tmp_path)
    try:
        proc.kill()  # nothing of the parent runs: only the kernel's parent-death signal can end the child
        proc.wait(30)
        assert _gone(child), "the pre-pass child was orphaned"
    finally:
        if child.is_running():
            child.kill()


SAVE_TERMINATED = textwrap.dedent("""
    import os, signal, sys
    import onnx
    from onnx import TensorProto, helper
    from xrl.cli.main import main
    from xrl.frontends import onnx_write

    real_fsync = os.fsync
    def fsync_then_sigterm(fd):  # SIGTERM arrives while the temporary is open, half-way through the write
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGTERM)
    onnx_write.os.fsync = fsync_then_sigterm

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    onnx.save(model, sys.argv[1])
    sys.exit(main(["optimize", sys.argv[1], "--search", "none", "--prepass", "none", "--target", "paper",
                   "-o", sys.argv[2]]))
""")


def test_sigterm_during_the_write_leaves_no_temporary(tmp_path):
    script = tmp_path / "save_terminated.py"
    script.write_text(SAVE_TERMINATED)
    src, out = tmp_path / "in.onnx", tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    res = subprocess.run([sys.executable, str(script), str(src), str(out)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 143, res.stderr
    assert "terminated" in res.stderr and "Traceback" not in res.stderr
    assert os.listdir(out.parent) == [], "a temporary (or a half-written model) was left behind"


def test_main_restores_the_previous_sigterm_handler():
    from xrl.cli.main import main

    before = signal.getsignal(signal.SIGTERM)
    main(["rules", "list", "--json"])
    assert signal.getsignal(signal.SIGTERM) == before


def test_policy_export_never_touches_another_writers_temporary(tmp_path, monkeypatch):
    """Two `xrl policy export -o same.onnx --force` at once: each has a temporary of its own."""
    from xrl.policies import export
    from xrl.rl.checkpoint import default_policy_path

    out = tmp_path / "same.onnx"
    theirs = [tmp_path / ".same.onnx.tmp", tmp_path / f".same.onnx.{os.getpid()}.tmp"]  # the old fixed names
    for p in theirs:
        p.write_text("another writer's half-written export")
    seen = []
    real_check = export._check

    def check(path, feed, expected):
        seen.append(path)
        return real_check(path, feed, expected)

    monkeypatch.setattr(export, "_check", check)
    export.export_onnx(default_policy_path(), out)
    export.export_onnx(default_policy_path(), out)
    assert out.is_file() and len(set(seen)) == 2, seen
    for p in theirs:
        assert p.read_text() == "another writer's half-written export"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name] + [p.name for p in theirs])


def test_state_files_are_written_under_a_temporary_of_their_own(tmp_path):
    from xrl.env.state import EnvState, read_states, write_states

    out = tmp_path / "s.json"
    theirs = tmp_path / "s.json.tmp"
    theirs.write_text("another writer's")
    write_states([EnvState("mlp", "abc", ("r@1",), 0.5, "analytic", 1.1)], out)
    assert theirs.read_text() == "another writer's"
    assert read_states(out)[0].actions == ("r@1",)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.json.tmp"]

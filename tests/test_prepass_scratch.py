"""A pre-pass runs in a scratch directory: what its library writes into the working directory
(onnxruntime's symbolic shape inference writes `sym_shape_infer_temp.onnx` and `.data` files there on
large models) never lands in the user's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from xrl import graphs
from xrl.frontends import prepass


@pytest.mark.parametrize("timeout", [float("inf"), 60.0])  # in process, and in the bounded child
def test_what_a_pass_writes_into_the_working_directory_is_removed(monkeypatch, tmp_path: Path, timeout) -> None:
    def litters(model):  # noqa: ANN001, ANN202
        Path("sym_shape_infer_temp.onnx").write_bytes(b"x")
        Path("weights.data").write_bytes(b"x" * 100)
        return model, "littered"

    monkeypatch.setitem(prepass.PASSES, "litter", prepass.Prepass(litters))
    monkeypatch.chdir(tmp_path)
    out, detail = prepass._run_bounded("litter", graphs.build("mlp"), timeout)
    assert detail == "littered" and len(out.graph.node) > 0
    assert list(tmp_path.iterdir()) == [] and Path.cwd() == tmp_path


def _sleeper(model):  # noqa: ANN001, ANN202 - a pass that writes scratch files, then outlasts its time limit
    import tempfile
    import time

    Path("sym_shape_infer_temp.onnx").write_bytes(b"x" * 1000)
    tempfile.mkdtemp(prefix="xrl-prepass-lib-")  # a library's own temporary folder
    time.sleep(60)
    return model, "never"


def _private_tmp(monkeypatch, tmp_path: Path) -> Path:  # noqa: ANN001
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_pass_stopped_by_its_time_limit_leaves_no_scratch_folder(monkeypatch, tmp_path: Path) -> None:
    """Issue 34, item 6: the parent made the child's folder and removes it after ending the child (the child,
    killed, runs no cleanup); issue 35, item 3: the report says the pass was stopped by its limit."""
    tmp = _private_tmp(monkeypatch, tmp_path)
    monkeypatch.setitem(prepass.PASSES, "sleeper", prepass.Prepass(_sleeper))
    monkeypatch.chdir(tmp_path)
    model = graphs.build("mlp")
    out, reports = prepass.run_prepasses(model, ["sleeper"], time_limit=1e-3)
    assert out is model and reports[0].timed_out and not reports[0].applied
    assert prepass.QUIETER in reports[0].detail and "time limit" in reports[0].detail
    assert reports[0].to_json()["timed_out"] is True
    with pytest.raises(prepass.PassTimeout):
        prepass._run_bounded("sleeper", model, 1.0)
    assert list(tmp.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]


SIGTERM_SCRIPT = """
import sys, time
sys.path[:0] = [{tests!r}]
from xrl.cli.main import install_sigterm_handler
from xrl import graphs
from xrl.frontends import prepass
import test_prepass_scratch as t
prepass.PASSES["sleeper"] = prepass.Prepass(t._sleeper)
install_sigterm_handler()
try:
    prepass._run_bounded("sleeper", graphs.build("mlp"), 60.0)
except KeyboardInterrupt:
    sys.exit(3)
"""


def test_sigterm_during_a_pass_leaves_no_scratch_folder(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    script = SIGTERM_SCRIPT.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not list(tmp.glob("xrl-prepass-*/work/xrl-prepass-lib-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the child has made its files
    assert list(tmp.glob("xrl-prepass-*")), "the pre-pass never started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 3
    assert list(tmp.iterdir()) == []

"""Issue 26, item 8: training settings are checked before any work, and `xrl sweep summarize` reads and
draws a bounded amount whatever its metrics files hold."""

from __future__ import annotations

import json
import os
import time

import pytest
from cli_helpers import assert_user_error, run


@pytest.mark.parametrize("override, needle", [
    ("model.hidden=100000000", "model.hidden=100000000 is out of range"),
    ("algo.lr=-1", "algo.lr=-1"),
    ("algo.lr=nan", "algo.lr must be a finite number"),
    ("episodes_per_worker=0", "episodes_per_worker=0"),
    ("workers=-2", "workers=-2"),
    ("workers=100000", "workers=100000"),
    ("updates=0", "updates=0"),
    ("algo.gamma=1.5", "algo.gamma=1.5"),
    ("env.horizon=0", "env.horizon=0"),
])
def test_train_refuses_bad_settings_in_one_line(tmp_path, capsys, override, needle):
    code, _, err = run(capsys, "train", override, "logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    assert_user_error(code, err, needle)
    assert not (tmp_path / "run").exists(), "a run started before the settings were checked"


def test_workers_beyond_the_cores_are_refused_by_train_itself(tmp_path):
    from test_train_smoke import _cfg

    from xrl.errors import ConfigError
    from xrl.rl.train import train

    cores = os.cpu_count() or 1
    with pytest.raises(ConfigError, match=f"this machine's {cores} cores"):
        train(_cfg(workers=cores + 1), tmp_path / "w")
    with pytest.raises(ConfigError, match="episodes_per_worker=0"):
        train(_cfg(episodes_per_worker=0, workers=0), tmp_path / "e")
    assert not (tmp_path / "e" / "best.pt").exists()


def test_workers_that_do_not_fit_the_memory_are_refused(monkeypatch):
    from xrl.errors import ConfigError
    from xrl.rl import config

    monkeypatch.setattr(config, "available_memory", lambda: 1 << 30)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    with pytest.raises(ConfigError, match="GiB available"):
        config.check_settings({"workers": 4})
    config.check_settings({"workers": 4, "collector": {"kind": "local"}})  # no processes: nothing to fit


# ----- xrl sweep summarize ----------------------------------------------------------------------------
def _run_dir(root, name, metrics: bytes, overrides=b"- seed=0\n"):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_bytes(overrides)
    (d / "metrics.jsonl").write_bytes(metrics)
    return d


def test_odd_metrics_lines_are_skipped(tmp_path, capsys):
    lines = [b"[1, 2]", b'"text"', b"3", b"null", b"[" * 50_000, b"\xff\xfe", b'{"speedup/mlp": true}',
             b'{"speedup/mlp": "1.5"}', b'{"speedup/mlp": 1e999}', b'{"speedup/mlp": 1.25}']
    _run_dir(tmp_path, "0", b"\n".join(lines) + b"\n", overrides=b"- model=\xff\n- seed=0\n")
    code, out, err = run(capsys, "sweep", "summarize", str(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["runs"][0]["final"] == {"mlp": 1.25}


def test_a_metrics_file_with_thousands_of_keys_is_bounded(tmp_path, capsys):
    from xrl.sweeps import summary

    row = {f"speedup/g{i}": 1.0 + i * 1e-6 for i in range(30_000)}
    _run_dir(tmp_path, "0", (json.dumps(row) + "\n").encode())
    _run_dir(tmp_path, "1", (json.dumps(row) + "\n").encode(), overrides=b"- seed=1\n- model=gin\n")
    t0 = time.monotonic()
    code, out, err = run(capsys, "sweep", "summarize", str(tmp_path))
    assert code == 0, err
    assert time.monotonic() - t0 < 60
    assert f"summarising {summary.MAX_GRAPHS} graphs of 30000" in err
    assert "the plot shows" in err
    from PIL import Image

    with Image.open(tmp_path / "summary.png") as im:
        assert im.width < 5000, im.size


def test_a_metrics_path_that_is_a_directory_or_a_fifo_is_skipped(tmp_path, capsys):
    (tmp_path / "a" / "metrics.jsonl").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / "metrics.jsonl")
    _run_dir(tmp_path, "c", b'{"speedup/mlp": 1.1}\n')
    code, out, err = run(capsys, "sweep", "summarize", str(tmp_path), "--json")
    assert code == 0, err
    assert len(json.loads(out)["runs"]) == 1

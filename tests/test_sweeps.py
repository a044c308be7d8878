"""Sweeps: a multirun's wandb runs share a group and carry their overrides as tags, `xrl train -m` writes the
sweep summary, and the Optuna sweeper searches hyperparameters with the training's final eval speed-up as objective."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from xrl.cli import main

# Pass ordering on the two tiny graphs: the cheapest real training there is.
TINY = ["env=pass_ordering", "graphs=small", "updates=1", "episodes_per_worker=1", "workers=1", "env.hidden=8",
        "algo.update_epochs=1", "progress=false"]


def wandb_run_records(path: Path) -> list:
    """The RunRecords of a wandb offline run file (.wandb): wandb's record log (LevelDB's format, 32 KiB
    blocks, 7-byte record headers after a 7-byte file header) of wandb_internal.Record protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, part, out = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind in (1, 4):  # full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(part + chunk)
            part = b""
            if rec.WhichOneof("record_type") == "run":
                out.append(rec.run)
        elif kind in (2, 3):
            part += chunk
    return out


def test_multirun_groups_wandb_runs_tags_their_overrides_and_writes_the_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep = tmp_path / "sweep"
    code = main(["train", "-m", *TINY, "seed=0,1", "logger=wandb", "logger.mode=offline",
                 f"hydra.sweep.dir={sweep}"])
    out = capsys.readouterr().out
    assert code == 0, out
    for job, seed in (("0", 0), ("1", 1)):
        (run_file,) = (sweep / job / "wandb").glob("offline-run-*/run-*.wandb")
        runs = wandb_run_records(run_file)
        assert runs, run_file
        assert {r.run_group for r in runs} == {str(sweep)}
        tags = set(runs[0].tags)
        assert {f"seed={seed}", "env=pass_ordering", "graphs=small", "logger=wandb"} <= tags, tags
        assert f"seed={1 - seed}" not in tags
    # the summary, written once the sweep ended: both seeds of one configuration, per graph
    assert "sweep summary: 2 runs" in out
    text = (sweep / "summary.md").read_text()
    assert "| mlp | 2 |" in text and "| tiny_cnn | 2 |" in text
    assert (sweep / "summary.png").stat().st_size > 1000


def test_optuna_sweeper_maximises_the_final_eval_speedup(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "optuna"
    code = main(["train", "-m", "hydra/sweeper=xrl_optuna", "hydra.sweeper.n_trials=2", *TINY, "logger=none",
                 "algo.lr=tag(log, interval(1e-3, 1e-1))", f"hydra.sweep.dir={sweep}"])
    out = capsys.readouterr().out
    assert code == 0, out
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    finals, lrs = [], []
    for job in ("0", "1"):
        last = json.loads((sweep / job / "metrics.jsonl").read_text().splitlines()[-1])
        finals.append(last["eval_speedup_mean"])
        overrides = yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
        lrs.append(float(next(o for o in overrides if o.startswith("algo.lr=")).split("=", 1)[1]))
    assert all(1e-3 <= lr <= 1e-1 for lr in lrs) and lrs[0] != lrs[1], lrs
    # the objective is what each training returned: Optuna's best is the larger final eval speed-up
    assert results["best_value"] == pytest.approx(max(finals))
    assert results["best_params"]["algo.lr"] == pytest.approx(lrs[finals.index(max(finals))])
    assert "sweep summary: 2 runs" in out and (sweep / "summary.md").exists()

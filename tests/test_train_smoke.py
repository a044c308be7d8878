"""Training end to end on the tiny graphs: the Hydra CLI, checkpoints, exact resume, eval, --search rl."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from xrl.cli import main
from xrl.cli.rl_commands import CONF_DIR
from xrl.cost import get_cost_model
from xrl.env import resolve_graph
from xrl.rl.checkpoint import CheckpointError, load_checkpoint, load_policy
from xrl.rl.rollout import CollectorSpec, LocalCollector, ProcessCollector
from xrl.rl.train import policy_config, train

# Small and fast: two tiny graphs, short episodes, a small network.
FAST = ["graphs=small", "env.horizon=3", "episodes_per_worker=2", "model.hidden=16", "model.layers=1",
        "model.heads=2", "algo.minibatch_size=4", "algo.update_epochs=2", "eval_every=1", "logger=none",
        "progress=false"]


def _cfg(**over):
    """conf/train.yaml composed with FAST and `over`, as train() takes it (no Hydra run)."""
    from hydra import compose, initialize_config_dir

    overrides = FAST + [f"{k}={v}" for k, v in over.items()]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)


def test_xrl_train_writes_checkpoints_metrics_and_curves(tmp_path, capsys):
    code = main(["train", *FAST, "updates=2", "workers=0", f"hydra.run.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "trained 2 updates" in out
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    for key in ("episode_return", "speedup_mean", "policy_loss", "value_loss", "entropy", "approx_kl",
                "clip_fraction", "steps_per_s", "eval_speedup/mlp", "speedup_mean"):
        assert key in lines[-1], key
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["update"] == 2 and "optimizer" in ckpt and "rng" in ckpt
    assert (tmp_path / "best.pt").exists()
    policy, _ = load_policy(tmp_path / "last.pt")
    assert policy.cfg.encoder.hidden == 16


def test_resume_continues_exactly(tmp_path):
    straight = train(_cfg(updates=2, workers=0), tmp_path / "a")
    train(_cfg(updates=1, workers=0), tmp_path / "b")
    resumed = train(_cfg(updates=2, workers=0, resume=tmp_path / "b" / "last.pt"), tmp_path / "b2")
    a, _ = load_policy(straight.last_checkpoint)
    b, _ = load_policy(resumed.last_checkpoint)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(pa, pb, atol=1e-5), name
    assert [h["update"] for h in resumed.history] == [1, 2]
    assert resumed.history[-1]["episode_return"] == pytest.approx(straight.history[-1]["episode_return"], abs=1e-6)
    with pytest.raises(Exception, match="already has 2 updates"):
        train(_cfg(updates=2, workers=0, resume=resumed.last_checkpoint), tmp_path / "c")


def test_worker_processes_play_what_the_local_collector_plays():
    cfg = _cfg()
    spec = CollectorSpec(graphs=("mlp", "tiny_cnn"), policy=policy_config(cfg["model"]), env=cfg["env"],
                         episodes_per_worker=2, seed=5)
    torch.manual_seed(0)
    from xrl.nn import GraphPolicy

    weights = GraphPolicy(spec.policy).state_dict()
    local = LocalCollector(spec, workers=2).collect(weights, update=3)
    with ProcessCollector(spec, workers=2) as procs:
        remote = procs.collect(weights, update=3)
        evals = procs.evaluate(weights, ["tiny_cnn", "mlp", "tiny_cnn"])
    assert remote.actions == local.actions and remote.rewards == pytest.approx(local.rewards)
    assert [e.graph for e in remote.episodes] == [e.graph for e in local.episodes]
    assert [e.graph for e in evals] == ["tiny_cnn", "mlp", "tiny_cnn"]


def test_eval_and_search_rl_use_a_checkpoint(tmp_path, capsys):
    s = train(_cfg(updates=1, workers=0), tmp_path)
    code = main(["eval", "--policy", str(s.last_checkpoint), "--graphs", "mlp,squeezenet", "--horizon", "4",
                 "--baselines", "--random-rollouts", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "graphs trained on" in out and "held-out graphs" in out and "greedy" in out
    from xrl.rl.rl_search import run_rl

    graph = resolve_graph("mlp")
    cost = get_cost_model("analytic")
    outcome = run_rl(graph, cost, seed=0, steps=4, time_limit=None, policy=str(s.last_checkpoint), samples=2)
    assert cost.cost(outcome.graph) <= cost.cost(graph)
    assert outcome.details["rollouts"] == 3
    outcome.graph.validate()


def test_bad_checkpoints_are_user_errors(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_policy(bad)
    code = main(["eval", "--policy", str(tmp_path / "missing.pt"), "--graphs", "mlp"])
    assert code == 2 and "no such policy checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("override, needle", [("bogus=1", "bogus"), ("model=nope", "model/nope"),
                                              ("updates=x", "updates must be a number"),
                                              ("env.horizon=0", "horizon must be at least 1"),
                                              ("algo.norm_adv=3", "true or false"),
                                              ("time_limit_min=-1", "time_limit_min must be a positive")])
def test_bad_training_settings_are_one_line_user_errors(override, needle, tmp_path, capsys):
    code = main(["train", override, "graphs=small", "workers=0", "logger=none", "progress=false",
                 f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_time_limit_stops_after_the_update_that_reaches_it(tmp_path):
    # a recipe sized in hours: the update that crosses the limit is the last, evaluated and checkpointed
    # although neither eval_every nor checkpoint_every falls on it
    run = train(_cfg(updates=50, workers=0, eval_every=7, checkpoint_every=7, time_limit_min=1e-6), tmp_path)
    assert run.updates == 1 and [h["update"] for h in run.history] == [1]
    assert any(k.startswith("eval_speedup/") for k in run.history[-1])
    assert load_checkpoint(run.last_checkpoint)["update"] == 1


def test_uphill_paid_off():
    from xrl.rl.rollout import uphill_paid_off

    assert uphill_paid_off([10.0, 11.0, 9.0])  # up, then below where it started the climb
    assert not uphill_paid_off([10.0, 11.0, 10.5])  # up and never back below 10
    assert not uphill_paid_off([10.0, 9.0, 8.0])  # never up


def test_xrl_train_with_measured_op_rewards(tmp_path, capsys, monkeypatch):
    # cost=op: rewards from per-operator CPU timings, cached in an sqlite file that the run fills.
    monkeypatch.setenv("XRL_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["train", *FAST, "cost=op", "updates=1", "workers=0", "env.horizon=3",
                 f"hydra.run.dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "trained 1 updates" in out
    assert (tmp_path / "cache" / "op_costs.sqlite").stat().st_size > 0

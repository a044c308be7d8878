"""`xrl train env=pass_ordering` (PPO with an MLP on xrl/PassOrdering-v0) and `xrl eval --env pass_ordering`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from xrl.cli import main
from xrl.cli.rl_commands import CONF_DIR
from xrl.env.pass_order import PASSES, evaluate_orders, geomean, greedy_policy
from xrl.rl.checkpoint import default_policy_path
from xrl.rl.pass_policy import FORMAT, load_pass_checkpoint, load_pass_policy
from xrl.rl.train import train

# The two tiny graphs, one process, a small network: a few seconds per run.
FAST = ["env=pass_ordering", "graphs=small", "episodes_per_worker=2", "workers=1", "eval_every=1", "logger=none",
        "progress=false", "env.hidden=16", "algo.minibatch_size=8", "algo.update_epochs=2"]
TIMING = ("time_s", "collect_s", "update_s", "steps_per_s")


def _cfg(*extra, **over):
    from hydra import compose, initialize_config_dir

    overrides = FAST + list(extra) + [f"{k}={v}" for k, v in over.items()]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)


def _untimed(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def test_xrl_train_env_pass_ordering_writes_checkpoints_metrics_and_curves(tmp_path, capsys):
    code = main(["train", *FAST, "updates=2", f"hydra.run.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "trained 2 updates, 40 env steps" in out and "vs the default pass order" in out
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    for key in ("episode_return", "speedup_mean", "policy_loss", "value_loss", "entropy", "approx_kl",
                "eval_speedup/mlp", "eval_speedup/tiny_cnn", "eval_speedup_mean"):
        assert key in lines[-1], key
    assert lines[0]["entropy"] <= math.log(len(PASSES)) + 1e-6
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000
    ckpt = load_pass_checkpoint(tmp_path / "last.pt")
    assert ckpt["format"] == FORMAT and ckpt["update"] == 2 and "optimizer" in ckpt
    policy, _ = load_pass_policy(tmp_path / "best.pt")
    assert policy.cfg.hidden == 16 and policy.cfg.passes == PASSES


def test_same_seed_same_run_other_seed_other_run_and_exact_resume(tmp_path):
    a = train(_cfg(updates=2), tmp_path / "a")
    b = train(_cfg(updates=2), tmp_path / "b")
    c = train(_cfg(updates=2, seed=1), tmp_path / "c")
    pa, pb, pc = (load_pass_policy(s.last_checkpoint)[0].state_dict() for s in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert _untimed(a.history) == _untimed(b.history)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)

    train(_cfg(updates=1), tmp_path / "r1")
    resumed = train(_cfg(updates=2, resume=tmp_path / "r1" / "last.pt"), tmp_path / "r2")
    pr = load_pass_policy(resumed.last_checkpoint)[0].state_dict()
    assert all(torch.allclose(pa[k], pr[k], atol=1e-6) for k in pa)
    for h, r in zip(_untimed(a.history), _untimed(resumed.history), strict=True):
        assert r == pytest.approx(h), h["update"]


def test_ppo_learns_the_pass_that_pays_under_a_one_pass_budget(tmp_path):
    """One pass allowed: the default order's first (cse) removes nothing here, fusion removes most. PPO must
    move its sampled choice there: the training episodes end better than the default order, entropy falls."""
    s = train(_cfg("env.horizon=1", "algo.lr=0.01", "episodes_per_worker=16", "algo.minibatch_size=16",
                   "eval_every=0", updates=12), tmp_path)
    first, last = s.history[0], s.history[-1]
    late = geomean([h["speedup_mean"] for h in s.history[-3:]])
    assert first["speedup_mean"] < 1.3 and late > 1.6, (first["speedup_mean"], late)
    assert last["entropy"] < first["entropy"] - 1.0
    assert last["eval_speedup_mean"] > 2.0  # greedy: fusion on both graphs (mlp 15 -> 6 ops, tiny_cnn 27 -> 14)


def test_eval_pass_ordering_reports_the_ratio_over_the_default_order(tmp_path, capsys):
    s = train(_cfg(updates=1), tmp_path)
    assert main(["eval", "--env", "pass_ordering", "--policy", str(s.last_checkpoint), "--suite", "small",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    labels = [r["graph"] for r in report["graphs"]]
    assert labels[:2] == ["mlp", "tiny_cnn"] and {"hlo/mlp", "hlo/convnet", "hlo/transformer_block"} <= set(labels)
    assert [r["split"] for r in report["graphs"]][:3] == ["train", "train", "hlo"]
    for r in report["graphs"]:
        assert r["ratio"] == pytest.approx(r["default_ops"] / r["agent_ops"])
        assert r["default_improvement"] == pytest.approx(r["ops"] / r["default_ops"])
        assert len(r["passes"]) == report["horizon"] == len(PASSES)
    assert report["geomean_ratio"] == pytest.approx(geomean([r["ratio"] for r in report["graphs"]]))

    # without --policy: the one-step lookahead, exactly what evaluate_orders gives it
    assert main(["eval", "--env", "pass_ordering", "--graphs", "tiny_cnn", "--horizon", "3"]) == 0
    text = capsys.readouterr().out
    (ref,) = evaluate_orders(["tiny_cnn"], greedy_policy, horizon=3)
    row = next(line for line in text.splitlines() if line.startswith("tiny_cnn"))
    assert row.split()[2:5] == [str(ref.ops0), str(ref.default_ops), str(ref.ops)], text
    assert "hlo/" not in text and "geomean" in text


@pytest.mark.parametrize("args, needle", [
    (["eval", "--env", "pass_ordering", "--policy", str(default_policy_path()), "--graphs", "mlp"],
     "not a pass-ordering policy"),
    (["eval", "--env", "pass_ordering", "--policy", "missing.pt", "--graphs", "mlp"], "no such pass-ordering"),
    (["eval", "--env", "pass_ordering", "--graphs", "mlp", "--horizon", "0"], "at least 1"),
    (["train", *FAST, "env.horizon=0"], "horizon must be at least 1"),
    (["train", *FAST, "env.reward=speed"], "unknown reward"),
    (["train", *FAST, "env.bogus=1"], "bogus"),
])
def test_bad_pass_ordering_input_is_a_one_line_user_error(args, needle, tmp_path, capsys):
    extra = [f"hydra.run.dir={tmp_path}"] if args[0] == "train" else []
    code = main(args + extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err

"""Issue 32.6: `xrl eval --baselines` shows the cost prior and the guided search beside the policy's argmax."""

from __future__ import annotations

from xrl.cli.main import main


def test_eval_baselines_show_the_cost_prior_and_the_guided_search(capsys):
    code = main(["eval", "--graphs", "lora_tiny", "--horizon", "4", "--baselines", "--random-rollouts", "1",
                 "--guided-budget", "0.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    head = next(line for line in out.splitlines() if line.startswith("graph"))
    for column in ("greedy", "cost prior", "guided", "policy argmax"):
        assert column in head, head
    row = next(line for line in out.splitlines() if line.startswith("lora_tiny"))
    assert row.count("x ") + row.endswith("x") >= 5  # random, greedy, cost prior, guided, argmax speed-ups


def test_guided_budget_is_checked(capsys):
    assert main(["eval", "--graphs", "lora_tiny", "--baselines", "--guided-budget", "0"]) == 2
    assert "--guided-budget" in capsys.readouterr().err

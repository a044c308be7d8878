"""The bring-your-own-RL-library example: sb3-contrib's MaskablePPO trains on xrl's env through xrl's extractor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("sb3_contrib", reason="sb3-contrib is not installed (pip install 'xrl[rl-ext]')")

import torch  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sb3_maskable_ppo.py"


def _example():
    spec = importlib.util.spec_from_file_location("sb3_maskable_ppo", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_maskable_ppo_trains_a_small_policy_in_seconds():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small graphs: more threads only contend on a shared machine
    try:
        r = _example().train("mlp", steps=192, horizon=6, max_candidates=16, hidden=16, layers=1, n_steps=64)
    finally:
        torch.set_num_threads(threads)
    assert r.steps == 192
    assert r.parameters < 50_000, "the policy must not grow with the action space"
    assert r.speedup > 0 and all("@" in a for a in r.rewrites)


def test_policy_size_does_not_depend_on_the_number_of_actions():
    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    from xrl.env.sb3 import XrlMaskablePolicy, num_parameters, policy_kwargs

    sizes = []
    for cap in (8, 64):
        env = gym.make("xrl/GraphRewrite-v0", graph="mlp", max_candidates=cap)
        model = MaskablePPO(XrlMaskablePolicy, env, n_steps=8, seed=0, policy_kwargs=policy_kwargs(hidden=16))
        sizes.append(num_parameters(model.policy))
    assert sizes[0] == sizes[1]


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes need a POSIX system")
def test_a_saved_maskable_ppo_served_over_pipes_decides_as_in_process(tmp_path):
    import os
    import subprocess

    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    from xrl.env.sb3 import XrlMaskablePolicy, policy_kwargs
    from xrl.rewrite import RewriteEngine
    from xrl.serve.host import drive

    engine = RewriteEngine.default()

    def make():
        return gym.make("xrl/GraphRewrite-v0", graph="mlp", max_candidates=16, horizon=6, engine=engine)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = MaskablePPO(XrlMaskablePolicy, make(), n_steps=32, batch_size=16, n_epochs=1, seed=0,
                            policy_kwargs=policy_kwargs(hidden=16, layers=1))
        model.learn(32)
    finally:
        torch.set_num_threads(threads)
    model.save(tmp_path / "policy.zip")
    pipes = str(tmp_path / "in"), str(tmp_path / "out")
    for p in pipes:
        os.mkfifo(p)
    server = subprocess.Popen([sys.executable, "-m", "xrl", "serve", "--in", pipes[0], "--out", pipes[1],
                               "--policy", str(tmp_path / "policy.zip")], stderr=subprocess.PIPE, text=True)
    try:
        served = drive(make().unwrapped, *pipes)
        _, err = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    env = make().unwrapped
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        action = int(model.predict(obs, action_masks=env.action_masks(), deterministic=True)[0])
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    assert served == env.actions

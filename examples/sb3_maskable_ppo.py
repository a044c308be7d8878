"""Bring your own RL library: train sb3-contrib's MaskablePPO on xrl's rewrite environment.

    pip install 'xrl[rl-ext]'            # sb3-contrib (and stable-baselines3); keeps the installed torch
    python examples/sb3_maskable_ppo.py --graph tiny_cnn --steps 2048

The agent sees only `obs` (padded graph tensors, candidates, mask); MaskablePPO reads the mask through
`env.action_masks()`. The policy is xrl's graph encoder (xrl.env.sb3.XrlFeaturesExtractor) with one
shared scoring head per candidate, so its size does not grow with the action space.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import gymnasium as gym
import torch

import xrl  # noqa: F401  (registers xrl/GraphRewrite-v0)


@dataclass
class Result:
    parameters: int
    train_s: float
    steps: int
    speedup: float  # of one deterministic episode with the trained policy
    rewrites: tuple[str, ...]


def train(graph: str = "tiny_cnn", steps: int = 2048, *, horizon: int = 10, max_candidates: int = 32,
          hidden: int = 32, layers: int = 2, seed: int = 0, n_steps: int = 128, verbose: int = 0) -> Result:
    from sb3_contrib import MaskablePPO

    from xrl.env.sb3 import XrlMaskablePolicy, num_parameters, policy_kwargs

    torch.manual_seed(seed)
    env = gym.make("xrl/GraphRewrite-v0", graph=graph, horizon=horizon, max_candidates=max_candidates)
    model = MaskablePPO(XrlMaskablePolicy, env, n_steps=n_steps, batch_size=min(64, n_steps), n_epochs=4,
                        learning_rate=3e-4, gamma=0.99, seed=seed, verbose=verbose,
                        policy_kwargs=policy_kwargs(hidden=hidden, layers=layers))
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    train_s = time.perf_counter() - t0

    obs, _ = env.reset(seed=seed)
    done = False
    while not done:
        action, _ = model.predict(obs, action_masks=env.unwrapped.action_masks(), deterministic=True)
        obs, _, terminated, truncated, _ = env.step(int(action))
        done = terminated or truncated
    u = env.unwrapped
    return Result(num_parameters(model.policy), train_s, steps, u.speedup, tuple(u.state.actions))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", default="tiny_cnn")
    p.add_argument("--steps", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: small graphs gain nothing from more)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    r = train(args.graph, args.steps, hidden=args.hidden, seed=args.seed, verbose=1)
    print(f"{args.graph}: policy of {r.parameters} parameters, {r.steps} steps in {r.train_s:.1f} s; "
          f"greedy episode {r.speedup:.3f}x with {len(r.rewrites)} rewrites")


if __name__ == "__main__":
    main()

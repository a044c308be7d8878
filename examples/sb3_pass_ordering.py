"""PPO (Stable-Baselines3) on xrl/PassOrdering-v0, evaluated against xrl's default pass order.

    python examples/sb3_pass_ordering.py --train resnet50,nasrnn,tiny_cnn --eval all --steps 2000

The observation is the op-type count vector (as in XLA-Gym), so a plain MLP policy fits; every pass is
valid everywhere, so no mask is needed. Passes are deterministic and the env memoises them, so after
the first visits an episode costs little.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

import xrl  # noqa: F401  (registers xrl/PassOrdering-v0)


def train(train_graphs: list[str], steps: int, *, seed: int = 0, shaping: str = "potential"):
    from stable_baselines3 import PPO

    torch.manual_seed(seed)
    env = gym.make("xrl/PassOrdering-v0", graph=train_graphs, shaping=shaping)
    model = PPO("MultiInputPolicy", env, n_steps=100, batch_size=50, n_epochs=4, learning_rate=1e-3, seed=seed,
                policy_kwargs={"net_arch": [64, 64]}, verbose=0)
    model.learn(total_timesteps=steps)
    return model


def evaluate(model, graphs: list[str]):
    from xrl.env.pass_order import evaluate_orders, geomean

    def choose(env, obs):  # noqa: ANN001, ANN202
        return int(model.predict(obs, deterministic=True)[0])

    results = evaluate_orders(graphs, choose)
    return results, geomean([r.improvement for r in results])


def main() -> None:
    from xrl.search.compare import resolve_graphs

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default="resnet50,nasrnn,tiny_cnn")
    p.add_argument("--eval", default="small")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shaping", choices=("none", "potential"), default="potential")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = train(list(resolve_graphs(args.train)), args.steps, seed=args.seed, shaping=args.shaping)
    n_params = sum(int(np.prod(q.shape)) for q in model.policy.parameters())
    print(f"trained {args.steps} steps in {time.perf_counter() - t0:.1f} s; policy of {n_params} parameters")
    results, gm = evaluate(model, list(resolve_graphs(args.eval)))
    for r in results:
        print(f"{r.graph:14s} ops {r.ops0:4d}  default {r.default_ops:4d}  ppo {r.ops:4d}  {r.improvement:.3f}  "
              f"{' '.join(r.passes)}")
    print(f"geomean improvement over the default pass order: {gm:.3f}")


if __name__ == "__main__":
    main()

"""Rollout throughput on Ray actors against the multiprocessing collector, and what Ray adds per update.

    .venv/bin/python experiments/bench_ray.py [--workers 1,2,4] [--graphs mlp,tiny_cnn,squeezenet]
        [--horizon 10] [--episodes 2] [--rounds 3] [--out experiments/results/ray_cpu.md]

For each worker count n: a ProcessCollector with n processes and a RayCollector with n actors (a local
Ray started with max(n) logical CPUs) play the same episodes (same graphs, seeds (seed, update, worker),
weights; checked: their actions are equal), interleaved round by round so machine noise hits both.
Reported per n: env steps/s of each (the median round), their ratio, and Ray's per-update overhead:
the weights broadcast (ray.put) and the rest of the call beyond the slowest actor's own playing time
(dispatch, weights fetch, gathering the rollouts), and of that the driver's own fetching and unpickling of
the rollouts after every actor is done (serial: it grows with the number of actors). Then the learner:
ppo_update seconds per env step with the default PPO and model settings of `xrl train`, which is where more
actors stop helping.

This machine has 2 cores: 4 workers on 2 cores measures the collectors' overhead, not scaling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xrl.cli.output import format_table


def train_config(graphs: list[str], horizon: int) -> dict:
    """conf/train.yaml as `xrl train` composes it (default model and PPO), on `graphs` with `horizon`."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from xrl.cli.rl_commands import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"graphs.train=[{','.join(graphs)}]", f"env.horizon={horizon}"])
    return OmegaConf.to_container(cfg, resolve=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker/actor counts")
    ap.add_argument("--graphs", default="mlp,tiny_cnn,squeezenet", help="built-in graphs to play")
    ap.add_argument("--horizon", type=int, default=10, help="steps per episode at most")
    ap.add_argument("--episodes", type=int, default=2, help="episodes per worker per update")
    ap.add_argument("--rounds", type=int, default=3, help="timed updates per collector (after one warm-up)")
    ap.add_argument("--learner-rounds", type=int, default=1, help="timed PPO updates (each is slow on a CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    args = ap.parse_args()

    import ray

    from xrl.distributed.ray_collector import RayCollector
    from xrl.nn import GraphPolicy
    from xrl.rl.config import env_kwargs, policy_config, take
    from xrl.rl.ppo import PPOConfig, ppo_update
    from xrl.rl.rollout import CollectorSpec, ProcessCollector

    counts = [int(x) for x in args.workers.split(",")]
    graphs = args.graphs.split(",")
    cfg = train_config(graphs, args.horizon)
    spec = CollectorSpec(graphs=tuple(graphs), policy=policy_config(cfg["model"]), env=env_kwargs(cfg["env"]),
                         episodes_per_worker=args.episodes, seed=args.seed)
    torch.manual_seed(args.seed)
    policy = GraphPolicy(spec.policy)
    weights = policy.state_dict()
    load0 = os.getloadavg()[0]  # a shared machine: say how busy it was
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False)
    print(f"{os.cpu_count()} cores; graphs {graphs}, horizon {args.horizon}, {args.episodes} episodes per worker, "
          f"model {cfg['model']['kind']} hidden {cfg['model']['hidden']} x{cfg['model']['layers']}", flush=True)

    rows, overhead, last = [], [], None
    for n in counts:
        procs, actors = ProcessCollector(spec, n), RayCollector(spec, actors=n)
        try:
            procs.collect(weights, 0), actors.collect(weights, 0)  # warm-up: imports, first features
            rate: dict[str, list[float]] = {"process": [], "ray": []}
            put, extra, fetch, steps = [], [], [], 0
            for r in range(1, args.rounds + 1):
                a = procs.collect(weights, r)
                b = actors.collect(weights, r)
                assert a.actions == b.actions, "the two collectors played different episodes"
                rate["process"].append(len(a) / a.collect_s)
                rate["ray"].append(len(b) / b.collect_s)
                put.append(actors.timings["put_s"])
                extra.append(actors.timings["wall_s"] - actors.timings["actor_max_s"])
                fetch.append(actors.timings["fetch_s"])
                steps, last = len(b), b
        finally:
            procs.close()
            actors.close()
        p, q = statistics.median(rate["process"]), statistics.median(rate["ray"])
        rows.append([n, steps, p, q, q / p])
        overhead.append([n, statistics.median(put) * 1e3, statistics.median(extra) * 1e3,
                         statistics.median(extra) * 1e3 / steps, statistics.median(fetch) * 1e3 / steps])
        print(f"  {n} workers: done", flush=True)
    ray.shutdown()

    # the learner: PPO on the last rollout with xrl train's default settings, seconds per env step
    ppo = take(PPOConfig, cfg["algo"], "algo", ignore=("name",))
    optimizer = torch.optim.Adam(policy.parameters(), lr=ppo.lr, eps=1e-5)
    times = []
    for _ in range(args.learner_rounds):
        t0 = time.perf_counter()
        ppo_update(policy, optimizer, last.to_batch(), ppo, np.random.default_rng(args.seed))
        times.append(time.perf_counter() - t0)
    learner = [[len(last), statistics.median(times), statistics.median(times) / len(last) * 1e3,
                len(last) / statistics.median(times)]]

    tables = [
        ("Rollout throughput (median of the rounds; the same episodes for both)",
         ["workers", "env steps/update", "process steps/s", "ray steps/s", "ray / process"], rows),
        ("Ray's per-update overhead (median)",
         ["actors", "weights put ms", "beyond slowest actor ms", "beyond slowest actor ms/step",
          "driver fetch ms/step"], overhead),
        ("The learner (ppo_update, default PPO and model)",
         ["env steps", "update s", "ms per env step", "env steps/s it can absorb"], learner),
    ]
    for title, headers, body in tables:
        print(f"\n{title}\n{format_table(headers, body)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        md = [f"`{' '.join(['.venv/bin/python', 'experiments/bench_ray.py', *sys.argv[1:]])}` on {os.cpu_count()} "
              f"cores; graphs {', '.join(graphs)}, horizon {args.horizon}, {args.episodes} episodes per worker, "
              f"{args.rounds} rounds after a warm-up; load average {load0:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end.\n"]
        for title, headers, body in tables:
            md.append(f"\n### {title}\n\n| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n")
            md += ["| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |\n" for r in body]
        args.out.write_text("".join(md))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

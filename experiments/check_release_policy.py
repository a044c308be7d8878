"""Does an exported policy (`xrl policy export`) make the checkpoint's decisions? On the built-in suite.

For each graph, one env is played by the checkpoint's argmax (xrl.rl, whole PyG stack, incremental
encoding); at every state the exported policy (onnxruntime, xrl.policies.release) chooses too, and the
two choices are compared. Then both full searches run (`rl_search --rl-mode argmax` and the release
runner) and their final cost and rewrite lists are compared.

    .venv/bin/python experiments/check_release_policy.py [--policy CKPT] [--graphs mlp,tiny_cnn,...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from xrl.cost import get_cost_model
from xrl.env import resolve_graph
from xrl.env.graph_rewrite import default_horizon
from xrl.policies.export import export_onnx
from xrl.policies.release import ReleasePolicy, release_search
from xrl.rl.checkpoint import default_policy_path, load_policy
from xrl.rl.evaluate import make_env, optimize_with_policy
from xrl.rl.rl_search import candidate_cap
from xrl.rl.rollout import observe

SUITE = ["mlp", "tiny_cnn", "squeezenet", "nasrnn", "bert", "vit", "dalle", "tt", "inception_v3", "resnext50",
         "nasnet_a", "resnet50", "vgg19"]


def lockstep(net, release: ReleasePolicy, graph, cost, horizon: int, cap: int | None) -> tuple[int, int, int, float]:
    """Along the checkpoint's argmax trajectory: (states where both chose the same action, states where
    they chose rewrites of equal effect (same rule, same cost after), states, the largest gap between
    the checkpoint's logits of the two choices where they differ: a tie broken apart by float rounding)."""
    env = make_env(graph, cost, horizon=horizon, max_candidates=cap)
    env.reset(options={"graph": graph})
    feats = net.features()
    same = equivalent = total = 0
    gap = 0.0
    done = False
    while not done:
        with torch.no_grad():
            logits = net(observe(env, feats))[0].logits
        a, b = int(logits.argmax()), release.choose(env)
        same, total = same + (a == b), total + 1
        if a != b:
            gap = max(gap, float(logits[a] - logits[b]))
            other = env.fork()
            other.step(b)
            twin = env.fork()
            twin.step(a)
            equivalent += other.rewrites[-1:] == twin.rewrites[-1:] and other.cost == twin.cost
        _, _, te, tr, _ = env.step(a)
        done = te or tr
    return same, same + equivalent, total, gap


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default=str(default_policy_path()))
    ap.add_argument("--graphs", default=",".join(SUITE))
    ap.add_argument("--cost", default="analytic")
    args = ap.parse_args()
    net, ckpt = load_policy(args.policy)
    cost = get_cost_model(args.cost)
    onnx_path = Path(tempfile.mkdtemp()) / "policy.onnx"
    export_onnx(args.policy, onnx_path)
    release = ReleasePolicy(onnx_path)
    cap = candidate_cap(ckpt, None)
    print(f"{'graph':14} {'states':>6} {'same':>6} {'equiv':>6} {'gap':>8} {'ckpt cost':>12} {'onnx cost':>12} "
          f"{'rewrites':>8} {'equal':>5} {'ckpt s':>7} {'onnx s':>7}")
    all_same = True
    for name in args.graphs.split(","):
        graph = resolve_graph(name)
        horizon = default_horizon(graph)
        same, equivalent, total, gap = lockstep(net, release, graph, cost, horizon, cap)
        t0 = time.perf_counter()
        a = optimize_with_policy(net, graph, cost, horizon=horizon, max_candidates=cap)
        t1 = time.perf_counter()
        b = release_search(graph, cost, release, horizon=horizon, max_candidates=cap)
        t2 = time.perf_counter()
        equal = list(a.steps) == list(b.steps) and a.cost == b.cost
        all_same &= equal and equivalent == total
        print(f"{name:14} {total:6d} {same:6d} {equivalent:6d} {gap:8.1e} {a.cost:12.6g} {b.cost:12.6g} "
              f"{len(b.steps):8d} {str(equal):>5} {t1 - t0:7.1f} {t2 - t1:7.1f}", flush=True)
    print("every decision equal or of equal effect, every result equal" if all_same else "DECISIONS DIFFER")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())

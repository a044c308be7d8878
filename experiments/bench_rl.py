"""Speed of the RL loop per built-in graph: env steps/s, meta-graph build and policy forward per state.

    .venv/bin/python experiments/bench_rl.py [--graphs bert,squeezenet] [--steps 20] [-o bench_rl.md]
    .venv/bin/python experiments/bench_rl.py --compare [--rounds 2] [--out FILE]

`--compare` measures the old candidate encoding (every candidate graph featurised and encoded whole,
`model.incremental=false`, and PPO's minibatch encoded in one pass, `algo.encode_chunk=0`, as before)
against the new one (each candidate from the region it changes, minibatches encoded 2 states at a
time), in one run, interleaved round by round: training environment steps/s and peak memory (`xrl
train`, each run in its own process), and `--search rl` time with the shipped policy against greedy's,
on built-in graphs and `bert_base` (a BERT-base-size encoder exported from torch here, `bert_base_graph`).

An env step is what `GraphRewriteEnv.step` does (apply a rewrite, re-cost it from its delta,
enumerate the next candidates and their hints); actions are uniformly random rewrites (seeded).
Per state the agent then builds the meta-graph (featurise current + every candidate, batch) and
runs the policy once: those columns are timed separately, on the states the env steps visited.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from xrl import graphs
from xrl.cli.output import format_table
from xrl.cost import get_cost_model
from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.features.metagraph import FeatureCache
from xrl.rewrite import RewriteEngine
from xrl.rl.checkpoint import default_policy_path, load_policy
from xrl.rl.rl_search import candidate_cap
from xrl.rl.rollout import observe


def bench_graph(name: str, engine: RewriteEngine, policy: torch.nn.Module, steps: int, horizon: int,
                max_candidates: int | None, seed: int) -> list:
    graph = resolve_graph(name)
    env = GraphRewriteEnv(graph, get_cost_model("analytic"), engine=engine, horizon=horizon,
                          max_candidates=max_candidates)
    rng = np.random.default_rng(seed)
    env.reset()
    states, cands, step_s = [], [], 0.0
    for _ in range(steps):
        states.append(env.candidates)
        cands.append(env.num_actions - 1)
        action = 1 + int(rng.integers(env.num_actions - 1)) if env.num_actions > 1 else 0
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        step_s += time.perf_counter() - t0
        if terminated or truncated:
            t0 = time.perf_counter()
            env.reset()
            step_s += time.perf_counter() - t0
    # The agent's side, on fresh states: featurise + batch, then one forward pass.
    env.reset()
    meta_s = fwd_s = 0.0
    nodes = []
    n_states = min(steps, 5)
    for _ in range(n_states):
        t0 = time.perf_counter()
        meta = observe(env, policy.features(0) if hasattr(policy, "features") else FeatureCache(0))
        t1 = time.perf_counter()
        with torch.no_grad():
            dist, _ = policy(meta)
        t2 = time.perf_counter()
        meta_s += t1 - t0
        fwd_s += t2 - t1
        nodes.append(meta.num_nodes)
        _, _, terminated, truncated, _ = env.step(int(dist.mode()) or (1 if env.num_actions > 1 else 0))
        if terminated or truncated:
            env.reset()
    return [name, len(graph), f"{np.mean(cands):.0f}", f"{steps / step_s:.1f}", f"{1e3 * meta_s / n_states:.1f}",
            f"{1e3 * fwd_s / n_states:.1f}", f"{np.mean(nodes):.0f}"]


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would report its (large) parent's peak.
_TRAIN_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from xrl.rl.train import train
def hwm():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
start_kb = hwm()
s = train(json.loads(sys.argv[1]), sys.argv[2])
busy = sum(m["collect_s"] + m["update_s"] for m in s.history)
print(json.dumps({"steps": s.env_steps, "busy_s": busy, "peak_kb": hwm(), "start_kb": start_kb}))
"""


def train_config(incremental: bool, graphs_: list[str], updates: int, episodes: int, horizon: int,
                 max_candidates: int) -> dict:
    """conf/train.yaml (default model: gat, 64 wide, 3 layers) with the comparison's overrides."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from xrl.cli.rl_commands import CONF_DIR

    overrides = [f"graphs.train=[{','.join(graphs_)}]", "graphs.eval=[]", f"updates={updates}", "workers=0",
                 f"episodes_per_worker={episodes}", f"env.horizon={horizon}", f"env.max_candidates={max_candidates}",
                 "eval_every=0", "checkpoint_every=0", "logger=none", "progress=false",
                 f"model.incremental={str(incremental).lower()}"]
    if not incremental:  # the old path whole: the minibatch's states encoded in one forward/backward pass
        overrides.append("algo.encode_chunk=0")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)


def train_once(cfg: dict) -> dict:
    """One training run in a fresh process (so that its peak memory is its own): steps, busy seconds, peak RSS."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-c", _TRAIN_CHILD, json.dumps(cfg), out], capture_output=True,
                              text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"training failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _EncoderLayer(torch.nn.Module):
    """A post-LayerNorm BERT encoder layer written out in plain ops (so that it exports as they are)."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.out = torch.nn.Linear(hidden, hidden)
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.ff1, self.ff2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (lin(x).reshape(b, s, self.heads, h // self.heads).transpose(1, 2) for lin in self.qkv)
        att = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
        x = self.ln1(x + self.out((att @ v).transpose(1, 2).reshape(b, s, h)))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


def bert_base_graph(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, seq: int = 128):
    """A BERT-base-size encoder (12 layers, hidden 768, 12 heads, FFN 3072; batch 1, 128 tokens; seeded
    weights, no embeddings), built from torch.nn modules, exported with torch.onnx.export and imported."""
    import tempfile

    from xrl.frontends.onnx_io import load_onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(_EncoderLayer(hidden, heads, ffn) for _ in range(layers))).eval()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bert_base.onnx"
        with torch.no_grad():
            torch.onnx.export(model, (torch.randn(1, seq, hidden),), str(path), input_names=["x"],
                              output_names=["y"], opset_version=17, dynamo=False)
        return load_onnx(path, name="bert_base")


_BUILT: dict[str, object] = {}


def search_graph(name: str):
    """A built-in graph, or `bert_base` (bert_base_graph, built once per process)."""
    if name == "bert_base":
        if name not in _BUILT:
            _BUILT[name] = bert_base_graph()
        return _BUILT[name]
    return resolve_graph(name)


def search_once(name: str, method: str, policy_path: Path) -> tuple[float, float]:
    """(search seconds, speedup) of greedy or the shipped policy (argmax, old or new encoding) on `name`."""
    from xrl.env.graph_rewrite import default_horizon
    from xrl.features.metagraph import FeatureCache
    from xrl.rl.evaluate import optimize_with_policy
    from xrl.search.greedy import greedy_search

    graph = search_graph(name)
    cost = get_cost_model("analytic", device="h100")
    if method == "greedy":
        res = greedy_search(graph, cost)
        return res.time_s, res.original_cost / res.cost
    policy, ckpt = load_policy(policy_path)
    featurize = policy.features() if method == "rl new" else FeatureCache()
    t0 = time.perf_counter()
    run = optimize_with_policy(policy, graph, cost, horizon=default_horizon(graph),
                               max_candidates=candidate_cap(ckpt, None), featurize=featurize)
    return time.perf_counter() - t0, run.speedup


def compare(args: argparse.Namespace) -> str:
    train_graphs = ["squeezenet", "bert"]
    search_graphs = args.search_graphs.split(",")
    runs: dict[bool, list[dict]] = {False: [], True: []}
    searches: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for incremental in ((False, True) if r % 2 == 0 else (True, False)):  # interleaved, order alternating
            cfg = train_config(incremental, train_graphs, args.updates, args.episodes, args.train_horizon, 32)
            runs[incremental].append(train_once(cfg))
            print(f"round {r + 1}: train {'new' if incremental else 'old'} {runs[incremental][-1]}", file=sys.stderr)
        for name in search_graphs:
            for method in ("greedy", "rl old", "rl new") if r % 2 == 0 else ("rl new", "rl old", "greedy"):
                searches.setdefault((name, method), []).append(search_once(name, method, default_policy_path()))
                print(f"round {r + 1}: {name} {method} {searches[name, method][-1]}", file=sys.stderr)

    def rate(rs: list[dict]) -> float:  # over all rounds' steps
        return sum(x["steps"] for x in rs) / sum(x["busy_s"] for x in rs)

    def peak(rs: list[dict], above_start: bool = False) -> float:
        return max(x["peak_kb"] - (x["start_kb"] if above_start else 0) for x in rs) / 1024

    old, new = runs[False], runs[True]
    rows = [
        ["training env steps/s (squeezenet+bert)", f"{rate(old):.2f}", f"{rate(new):.2f}",
         f"{rate(new) / rate(old):.1f}x", ">= 10x"],
        ["peak training memory, RSS (MB)", f"{peak(old):.0f}", f"{peak(new):.0f}",
         f"{peak(new) / peak(old):.2f}", "<= 0.33"],
        ["peak training memory above the process at start (MB)", f"{peak(old, True):.0f}",
         f"{peak(new, True):.0f}", f"{peak(new, True) / peak(old, True):.2f}", "<= 0.33"],
    ]
    for name in search_graphs:
        t = {m: min(x[0] for x in searches[name, m]) for m in ("greedy", "rl old", "rl new")}
        sp = {m: searches[name, m][0][1] for m in ("greedy", "rl old", "rl new")}
        rows.append([f"{name}: --search rl time (s), speedup {sp['rl old']:.3f} / {sp['rl new']:.3f}",
                     f"{t['rl old']:.2f} ({t['rl old'] / t['greedy']:.1f}x greedy)",
                     f"{t['rl new']:.2f} ({t['rl new'] / t['greedy']:.1f}x greedy)",
                     f"{t['rl new'] / t['rl old']:.2f}", f"<= 2x greedy ({t['greedy']:.2f} s, {sp['greedy']:.3f})"])
    table = format_table(["measure", "old: whole candidate graphs", "new: candidate regions", "new / old", "aim"],
                         rows)
    return (f"Old vs new candidate encoding, {args.rounds} interleaved rounds (training: steps/s over all rounds, "
            f"the largest peak; search: fastest round). Training: conf/train.yaml defaults (gat, hidden 64, "
            f"3 layers, PPO 4 epochs, minibatch 32; old: the minibatch encoded in one pass, new: 2 states at a "
            f"time) on {'+'.join(train_graphs)}, {args.updates} update(s) of {args.episodes} episodes, horizon "
            f"{args.train_horizon}, at most 32 candidates, workers=0 (one process, one torch thread); steps/s = env "
            f"steps / (collection + PPO update time). Search: the shipped policy, argmax until it stops, analytic "
            f"h100 cost; bert_base: a BERT-base-size encoder (12 layers, hidden 768, 12 heads, 128 tokens) exported "
            f"from torch.nn modules with torch.onnx.export.\n{table}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", action="store_true", help="old vs new candidate encoding (see above)")
    ap.add_argument("--rounds", type=int, default=2, help="--compare: interleaved rounds")
    ap.add_argument("--updates", type=int, default=1, help="--compare: PPO updates per training run")
    ap.add_argument("--episodes", type=int, default=2, help="--compare: episodes per update")
    ap.add_argument("--train-horizon", type=int, default=10, help="--compare: training episode length")
    ap.add_argument("--search-graphs", default="bert,vit,inception_v3,bert_base",
                    help="--compare: graphs for --search rl (bert_base: bert_base_graph)")
    ap.add_argument("--out", help="--compare: also write the table to this file")
    ap.add_argument("--graphs", help="comma-separated built-in graphs (default: all)")
    ap.add_argument("--steps", type=int, default=20, help="env steps timed per graph")
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--max-candidates", type=int,
                    help="cap on candidates per step (default: the policy's training cap; 0: none)")
    ap.add_argument("--policy", help="checkpoint (default: the shipped policy, else a fresh default network)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", help="also write the table to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.compare:
        text = compare(args)
        print(text)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
        return 0
    names = args.graphs.split(",") if args.graphs else graphs.names()
    path = Path(args.policy) if args.policy else default_policy_path()
    cap = args.max_candidates or None
    if path.exists():
        policy, ckpt = load_policy(path)
        which = str(path)
        cap = candidate_cap(ckpt, args.max_candidates)
    else:
        from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
        from xrl.nn import GraphPolicy, PolicyConfig

        policy, which = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM)).eval(), "fresh default network"
    engine = RewriteEngine.default()
    rows = []
    for name in names:
        rows.append(bench_graph(name, engine, policy, args.steps, args.horizon, cap, args.seed))
        print(f"\r{len(rows)}/{len(names)} graphs", end="", file=sys.stderr, flush=True)
    print("\r", end="", file=sys.stderr)
    table = format_table(["graph", "ops", "candidates", "env steps/s", "meta-graph ms/state", "forward ms/state",
                          "meta-graph nodes"], rows)
    text = (f"analytic cost model (h100), policy: {which}, at most {cap or 'all'} candidates per step, "
            f"torch threads {args.threads}\n{table}")
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the target's estimate rank rewrites as onnxruntime's measurements do?

For each graph, the candidates of its first states (a seeded random walk) are costed by the target's
estimate and timed with onnxruntime (ORT_ENABLE_ALL, one thread, fresh sessions) against their state,
interleaved in alternating rounds with an A/A control of the state. The table gives, per graph, the
Spearman rank correlation between estimated and measured speed-ups of the candidates, and the median
gap between them; and, under the strawman (the per-op analytic model of the unfused graph: the paper
setting on the cpu profile), the same figures, for comparison.

    .venv/bin/python experiments/check_estimates.py [--graphs nasrnn,squeezenet,resnet50,tiny_cnn]
        [--states 2] [--max-candidates 10] [--rounds 5] [--repeats 10] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_measured import spearman  # noqa: E402 - the experiments folder's shared helper

from xrl.cost import AnalyticCostModel, TargetCostModel  # noqa: E402
from xrl.cost.e2e import E2ECostModel  # noqa: E402
from xrl.cost.speedup import measure_speedup  # noqa: E402
from xrl.frontends.loader import load_model  # noqa: E402
from xrl.rewrite import RewriteEngine  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="nasrnn,squeezenet,resnet50,tiny_cnn")
    p.add_argument("--states", type=int, default=2)
    p.add_argument("--max-candidates", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    target = TargetCostModel(target="ort-cpu")
    strawman = AnalyticCostModel(device="cpu")
    timer = E2ECostModel(device="cpu", engine="ort", repeats=args.repeats, threads=1, cache=False)
    rng = random.Random(args.seed)
    rows, all_pairs = [], {"target": [], "strawman": []}
    t0 = time.perf_counter()
    for name in args.graphs.split(","):
        graph = load_model(name).graph
        pairs = {"target": [], "strawman": []}
        noise = []
        engine = RewriteEngine.default()
        for _ in range(args.states):
            cands = list(engine.candidates(graph))
            if not cands:
                break
            sample = rng.sample(cands, min(args.max_candidates, len(cands)))
            for cand in sample:
                m = measure_speedup(timer, graph, cand.graph, rounds=args.rounds, control=True)
                est_t = target.cost(graph) / cand.delta_cost(target, target.cost(graph))
                est_s = strawman.cost(graph) / cand.delta_cost(strawman, strawman.cost(graph))
                pairs["target"].append((est_t, m.speedup))
                pairs["strawman"].append((est_s, m.speedup))
                noise.append(m.noise)
                print(f"{name}: {cand.rule}: target {est_t:.3f}, strawman {est_s:.3f}, measured {m.speedup:.3f} "
                      f"[{m.interval[0]:.3f}, {m.interval[1]:.3f}] {m.verdict}", file=sys.stderr, flush=True)
            graph = rng.choice(cands).graph  # the walk goes on from a random candidate
        row = [name, str(len(pairs["target"]))]
        for model in ("target", "strawman"):
            est, meas = zip(*pairs[model]) if pairs[model] else ((), ())
            all_pairs[model] += pairs[model]
            row += [f"{spearman(est, meas):.2f}", f"{statistics.median(abs(e - m) for e, m in pairs[model]):.3f}"]
        row.append(f"{statistics.median(noise):.3f}" if noise else "-")
        rows.append(row)
    total = ["**all**", str(len(all_pairs["target"]))]
    for model in ("target", "strawman"):
        est, meas = zip(*all_pairs[model])
        total += [f"{spearman(est, meas):.2f}", f"{statistics.median(abs(e - m) for e, m in all_pairs[model]):.3f}"]
    total.append("")
    rows.append(total)
    head = ["graph", "candidates", "Spearman (target)", "median gap (target)", "Spearman (strawman)",
            "median gap (strawman)", "median A/A deviation"]
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                      ["| " + " | ".join(r) + " |" for r in rows])
    text = (f"Estimated vs measured speed-ups of rewrite candidates ({platform.machine()}, onnxruntime ORT_ENABLE_ALL, "
            f"1 thread, {args.rounds} rounds x {args.repeats} runs with an A/A control, seed {args.seed}; "
            f"{(time.perf_counter() - t0) / 60:.1f} min). target: ort-cpu ({target.profile} profile); strawman: "
            f"analytic per-op cpu profile.\n\n{table}\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Expert iteration at small scale: train on one family, then ablate the learned prior on families it never saw.

    train       xrl.rl.expert_iteration on the LoRA family's training graphs (TRAIN), selected on VAL (another
                LoRA graph), graphs-only network (model.use_hints=false, X-RLflow's setting), --iterations
                rounds of guided search -> cloning
    evaluate    experiments/rl_ablation.py with the result as the trained prior, on HELD_OUT (convolution,
                inception, reparameterised and attention families: none of them LoRA), at budgets 1 and 3 s:
                the same guided search under the learned prior, the same network untrained (3 seeds), the
                uniform and the cost prior, the learned policy's argmax alone, and greedy

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/expert_iteration.py \
        --out experiments/results/expert_iteration

Writes report.json (per iteration: experts, cloning loss, validation), best.pt/last.pt with best.json (the
training graphs, which rl_ablation reads as the split), and the ablation's runs.csv, ablation.md and
anytime.png under --out/eval.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TRAIN = ("lora_qkv", "lora_ffn", "multi_lora", "lora_tiny")
VAL = ("lora_mlp",)
HELD_OUT = ("inception_a_small", "fire_small", "fam_acnet_ts", "fam_attn_mha_ts")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--search-budget", type=float, default=2.0)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--target", default="ort-cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hints", action="store_true", help="let the network read the env's hints (default: graphs only)")
    p.add_argument("--budgets", default="1,3")
    p.add_argument("--out", default="experiments/results/expert_iteration")
    p.add_argument("--skip-train", action="store_true", help="evaluate an existing --out/best.pt")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from xrl.cost import get_cost_model
    from xrl.frontends.loader import load_model
    from xrl.rl.expert_iteration import ExpertIterationConfig, expert_iteration

    out = Path(args.out)
    command = "XRL_NO_CALIBRATION=1 .venv/bin/python experiments/expert_iteration.py " + " ".join(
        a for a in (sys.argv[1:] if argv is None else argv) if a != "--skip-train")
    if not args.skip_train:
        cost = get_cost_model("target", target=args.target)
        cfg = ExpertIterationConfig(iterations=args.iterations, search_budget=args.search_budget, epochs=args.epochs,
                                    use_hints=args.hints, seed=args.seed)
        graphs = {g: load_model(g, seed=0).graph for g in (*TRAIN, *VAL)}
        report = expert_iteration({g: graphs[g] for g in TRAIN}, {g: graphs[g] for g in VAL}, cost, cfg, out=out)
        report["command"], report["target"] = command, args.target
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (out / "best.json").write_text(json.dumps({"command": command, "train_graphs": list(TRAIN),
                                                   "val_graphs": list(VAL)}, indent=1) + "\n")
    import rl_ablation

    return rl_ablation.main(["--graphs", ",".join((*HELD_OUT, *VAL)), "--budgets", args.budgets, "--policy",
                             str(out / "best.pt"), "--target", args.target, "--searches", "greedy",
                             "--out", str(out / "eval")])


if __name__ == "__main__":
    sys.exit(main())

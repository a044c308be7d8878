"""Expert iteration at scale: train on the training families, select on validation, ablate on held-out families.

    train       xrl.rl.expert_iteration on splits.TRAIN (LoRA and reparameterised-convolution graphs),
                checkpoint selected on splits.VAL (other members of those families), graphs-only network
                (use_hints=false, X-RLflow's setting), --iterations rounds of guided search -> cloning; the
                targets are the best path of every graph and --tree-states searched states per graph and
                iteration (their best-found returns as value targets), the value head's returns costed by
                --value-cost (default: the target's measured kernel cost)
    evaluate    (unless --no-eval) experiments/rl_ablation.py with the result as the trained prior, on
                splits.HELD_OUT and splits.VAL at --budgets

    XRL_NO_CALIBRATION=1 nice -n 10 .venv/bin/python experiments/expert_iteration.py --seed 0 \\
        --out experiments/results/expert_iteration/seed0 --no-eval

Writes report.json (per iteration: experts, states, cloning loss, validation), best.pt/last.pt with best.json
(the split, which rl_ablation reads), and with evaluation the ablation's runs.csv, ablation.md and anytime.png
under --out/eval.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import splits  # noqa: E402

# The recipe of the default policy's training (experiments/train_default_policy.py --recipe expert).
RECIPE = {"iterations": 6, "search_budget": 1.0, "epochs": 4, "tree_states": 32, "tree_keep": 2, "clock": "cpu"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=RECIPE["iterations"])
    p.add_argument("--search-budget", type=float, default=RECIPE["search_budget"])
    p.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    p.add_argument("--tree-states", type=int, default=RECIPE["tree_states"],
                   help="searched states per graph and iteration kept as targets (0: best paths only)")
    p.add_argument("--tree-keep", type=int, default=RECIPE["tree_keep"])
    p.add_argument("--clock", choices=("cpu", "wall"), default=RECIPE["clock"],
                   help="the search budget's clock: this process's CPU seconds (default: the same effort whatever "
                        "the machine's load) or wall seconds")
    p.add_argument("--value-cost", choices=("measured", "roofline", "search"), default="measured",
                   help="the cost of the value head's returns: the target's measured kernel cost (default), its "
                        "roofline, or whatever the search used")
    p.add_argument("--target", default="ort-cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hints", action="store_true", help="let the network read the env's hints (default: graphs only)")
    p.add_argument("--graphs", help="training graphs (default: splits.TRAIN)")
    p.add_argument("--val", help="validation graphs (default: splits.VAL)")
    p.add_argument("--budgets", default="1,3")
    p.add_argument("--out", default="experiments/results/expert_iteration")
    p.add_argument("--skip-train", action="store_true", help="evaluate an existing --out/best.pt")
    p.add_argument("--no-eval", action="store_true", help="train only")
    return p


def train(args: argparse.Namespace, command: str) -> dict:
    import torch

    from xrl.cost import get_cost_model, target_timing
    from xrl.frontends.loader import load_model
    from xrl.rl.expert_iteration import ExpertIterationConfig, expert_iteration

    torch.set_num_threads(1)  # one core each: seeds run side by side on a 2-core machine
    out = Path(args.out)
    train_graphs = tuple(g for g in (args.graphs.split(",") if args.graphs else splits.TRAIN) if g)
    val_graphs = tuple(g for g in (args.val.split(",") if args.val is not None else splits.VAL) if g)
    cost = get_cost_model("target", target=args.target)
    search_timing = target_timing(None, args.target)
    value_cost = None
    if args.value_cost != "search" and args.value_cost != search_timing:
        value_cost = get_cost_model("target", target=args.target, timing=args.value_cost)
    cfg = ExpertIterationConfig(iterations=args.iterations, search_budget=args.search_budget, epochs=args.epochs,
                                use_hints=args.hints, seed=args.seed, tree_states=args.tree_states,
                                tree_keep=args.tree_keep, clock=args.clock)
    graphs = {g: load_model(g, seed=0).graph for g in (*train_graphs, *val_graphs)}
    report = expert_iteration({g: graphs[g] for g in train_graphs}, {g: graphs[g] for g in val_graphs}, cost, cfg,
                              out=out, value_cost=value_cost)
    report.update(command=command, target=args.target, search_timing=search_timing,
                  value_timing=args.value_cost if args.value_cost != "search" else search_timing)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "best.json").write_text(json.dumps({"command": command, "train_graphs": list(train_graphs),
                                               "val_graphs": list(val_graphs), "held_out": list(splits.HELD_OUT),
                                               "best_iteration": report.get("best_iteration"),
                                               "time_s": round(report["time_s"], 1)}, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    out = Path(args.out)
    command = "XRL_NO_CALIBRATION=1 .venv/bin/python experiments/expert_iteration.py " + " ".join(
        a for a in (sys.argv[1:] if argv is None else argv) if a != "--skip-train")
    if not args.skip_train:
        from xrl.errors import XrlError

        try:
            train(args, command)
        except XrlError as e:  # a bad graph name or setting: one line, exit 2
            print(f"expert_iteration: {str(e).splitlines()[0][:300]}", file=sys.stderr)
            return 2
    if args.no_eval:
        return 0
    import rl_ablation

    return rl_ablation.main(["--graphs", ",".join((*splits.HELD_OUT, *splits.VAL)), "--budgets", args.budgets,
                             "--policy", str(out / "best.pt"), "--target", args.target, "--searches", "greedy",
                             "--out", str(out / "eval")])


if __name__ == "__main__":
    sys.exit(main())

"""Learning against search at equal budget: the guided search under each prior, and the searches, as anytime curves.

Per graph, in one process and interleaved (so machine load hits every arm alike):

    guided search (xrl.rl.guided, `--search rl`, stop rule and greedy anchor off so it runs to its budget
    under the prior alone), one run of the largest budget per prior, its trace of (seconds, best cost) read
    at every budget:
        trained        the policy checkpoint (--policy; default the shipped xrl/policies/default.pt); with
                       several (--policy A,B,C: training seeds) one arm each, trained-0, trained-1, ...
        shipped        (--shipped) the shipped policy beside them
        untrained-S    the same network shape initialised from seed S (--untrained-seeds)
        uniform        equal over the candidates
        cost           softmax over each candidate's one-step estimated gain
    argmax             the (first) trained policy's argmax rollout alone (`--rl-mode argmax`), run per budget
    greedy, beam, taso, tensat   `xrl optimize --search M`, run per budget with that time limit

Every speed-up is the cost model's estimate (target --target) of the returned graph, recomputed by
this script (the guided arms' intermediate points are the search's own costs, checked against the
recomputed cost of its final graph). Learning gain, per budget and split = geomean(trained) /
geomean(best non-learned prior), the non-learned priors being uniform, cost and the untrained network
(the mean over its seeds), all under the same search and budget; with several trained seeds, trained
is their mean (each graph's geomean over the seeds) and the table gives each seed's gain too.

Splits: from the (first) policy's metadata, the .json beside it: `train` its train_graphs, `val` its
val_graphs (the graphs its checkpoint was selected on); every other graph is `held-out`. For policies
made by experiments/expert_iteration.py these are experiments/splits.py's TRAIN and VAL, and HELD_OUT
comes from families no training or validation graph does. The shipped policy was selected on its
training graphs (graphs.eval=[]): there is no validation split for it.

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/rl_ablation.py --out experiments/results/rl_ablation

Writes runs.csv (one row per graph, arm and budget), ablation.md (tables per budget, geomeans, learning
gain) and anytime.png (held-out geomean speed-up against budget, per arm); resumable by (graph, arm).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prior_arms import (  # noqa: E402 - the arms, shared with experiments/rl_vs_search.py
    FIELDS,
    SEARCHES,
    arms_of,
    per_arm,
    policy_arms,
    run_graph,
    summarise,
)

GRAPHS = ("mlp", "lora_attention", "lora_decode", "lora_mlp", "inception_a_small", "fire_small", "fam_acnet_ts",
          "fam_attn_mha_ts", "tiny_cnn")


def splits_of(policy: str | None) -> dict[str, str]:
    """The graphs the policy was trained and selected on, from its metadata (the .json beside the checkpoint):
    graph -> train | val; any other graph is held-out."""
    from xrl.rl.checkpoint import default_policy_path

    meta_path = Path(policy or default_policy_path()).with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return {**{g: "val" for g in meta.get("val_graphs", [])}, **{g: "train" for g in meta.get("train_graphs", [])}}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({float(r["budget"]) for r in rows})
    held = sorted({r["graph"] for r in rows if r["split"] == "held-out"})
    arms = [a for a in arms_of(rows) if not a.startswith(("untrained-", "trained-"))] + ["untrained"]
    if any(a.startswith("trained-") for a in arms_of(rows)):
        arms.insert(0, "trained")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a in arms:
        ys = [per_arm(rows, a, b, held) for b in budgets]
        ax.plot(budgets, ys, marker="o", label=a, linestyle="--" if a in (*SEARCHES, "argmax") else "-")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # only the budgets are labelled
    ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
    ax.set_xlabel("budget (s, wall clock)")
    ax.set_ylabel(f"geomean speed-up, {len(held)} held-out graphs")
    ax.set_title("guided search per prior (solid) and searches (dashed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default=",".join(GRAPHS))
    p.add_argument("--budgets", default="1,3", help="seconds, comma list (the largest is each prior's run)")
    p.add_argument("--untrained-seeds", default="0,1,2", type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--policy", help="checkpoint(s) of the trained prior, comma-separated (several: one arm per "
                                    "training seed; default: the shipped policy)")
    p.add_argument("--shipped", action="store_true", help="the shipped policy as one more arm, `shipped`")
    p.add_argument("--target", default="ort-cpu")
    p.add_argument("--searches", default=",".join(SEARCHES), help="the searches to run beside the guided arms")
    p.add_argument("--out", default="experiments/results/rl_ablation")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    from xrl.cost import get_cost_model
    from xrl.rewrite import RewriteEngine
    from xrl.rewrite.rules import load_rules

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budgets = [float(b) for b in args.budgets.split(",")]
    runs_csv = out / "runs.csv"
    rows = read_rows(runs_csv)
    done = {r["graph"] for r in rows}
    splits = splits_of(policy_arms(args)[0][1])
    trained_on = {g for g, s in splits.items() if s == "train"}
    cost = get_cost_model("target", target=args.target)
    engine = RewriteEngine(load_rules())  # parsed and verified once, outside every arm's budget
    t0 = time.perf_counter()
    for name in [] if args.report_only else [g for g in args.graphs.split(",") if g and g not in done]:
        new = run_graph(name, splits.get(name, "held-out"), args, cost, engine, budgets)
        with runs_csv.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if f.tell() == 0:
                w.writeheader()
            w.writerows(new)
        rows += [{k: str(v) for k, v in r.items()} for r in new]
        print(f"[{time.perf_counter() - t0:6.0f} s] {name} done", file=sys.stderr, flush=True)
    command = ("XRL_NO_CALIBRATION=1 .venv/bin/python experiments/rl_ablation.py "
               + " ".join(a for a in (sys.argv[1:] if argv is None else argv) if a != "--report-only"))
    header = (f"## Guided search per prior against the searches, at equal budget (target `{args.target}`)\n\n"
              f"Command: `{command}`. Budgets are wall-clock seconds on a 2-core machine shared with other "
              "jobs (loaded: the time limits bind earlier than on an idle machine); every arm of a graph ran "
              "interleaved in one process. Policy: " + (args.policy or "xrl/policies/default.pt (shipped)")
              + (" (one arm per seed: trained-0, trained-1, ...)" if "," in (args.policy or "") else "")
              + f"; its training graphs (split train): {', '.join(sorted(trained_on)) or 'unknown'}.")
    rows = [r for r in rows if float(r["budget"]) in budgets]  # a resumed run may have recorded more budgets
    text = summarise(rows, header)
    (out / "ablation.md").write_text(text + "\n")
    plot(rows, out / "anytime.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

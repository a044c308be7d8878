"""RL against search: policies trained with a warm start from search teachers, over seeds, on held-out graphs.

For each variant (`hints`: the env's per-candidate estimates as features, the default; `graphs-only`:
the X-RLflow setting, `model.use_hints=false`; `finetune`: the shipped network fine-tuned for the
default target, see FINETUNE; `shipped`: the recipe of xrl/policies/default.pt,
experiments/train_default_policy.py, whose seed 0 is the shipped file itself) and each seed:

    train   xrl train graphs=headroom cost=target imitation.teachers=[beam,greedy] seed=S ...
            (behaviour cloning from the teachers' trajectories, then PPO; best.pt chosen on the validation
            graphs of conf/graphs/headroom.yaml, never on the training graphs)
    eval    best.pt on every graph of the split, through `xrl.search.compare.run_one` (the dispatch of
            `xrl optimize --search rl`; results recomputed from the returned graph and verified under
            onnxruntime): mode guided within TASO's time limit, and mode argmax

The searches' results come from experiments/headroom.py's results.csv (`--baselines`): greedy, beam,
taso, tensat and exhaustive, same target, same verification. Per graph, "best known" is the best of all
of them and of every RL run. Goals checked (issue "RL that beats search"): guided RL reaches the best
known result on at least 80% of the graphs; its geomean is at least Tensat's; it is strictly above
greedy on every graph with headroom; on held-out graphs it is at least greedy.

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/rl_vs_search.py \
        --baselines experiments/results/headroom_ort_cpu/results.csv --seeds 0,1,2 \
        --out experiments/results/rl_vs_search

With `--arms`, each variant's trained seeds also go through the prior arms of experiments/rl_ablation.py
at equal budget (experiments/prior_arms.py, the same code): the guided search (stop rule and greedy anchor
off) under the trained policy (one arm per seed: trained-0, trained-1, ... in --seeds order), the same
network untrained (--untrained-seeds), a uniform prior and the cost prior (softmax over each candidate's
one-step estimated gain); the trained policy's argmax rollout alone; and the searches (--arms-searches), all
at each of --arms-budgets (default: TASO's limit, the guided rows' budget), with the learning gain = trained /
best non-learned prior, same search, same budget, per split. Estimates of the target, recomputed (these
arms are not verified under onnxruntime; the rows above are).

    XRL_NO_CALIBRATION=1 .venv/bin/python experiments/rl_vs_search.py \
        --baselines experiments/results/headroom_ort_cpu/results.csv --seeds 0,1,2 --variants shipped \
        --arms --out experiments/results/rl_vs_search

Runs are resumable: a seed whose best.pt exists is not retrained, an evaluated (variant, seed, graph,
mode) is not re-run, nor the arms of a (variant, graph) in arms_runs.csv. Writes rl_runs.csv (and
arms_runs.csv) and rl_vs_search.md to --out and prints the tables; `--report-only` rewrites them from the
CSV files without running anything.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from xrl.cli.rl_commands import CONF_DIR
from xrl.stats import geomean

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prior_arms  # noqa: E402 - the ablation's arms (experiments/rl_ablation.py's code)
from headroom import TIME_LIMITS  # noqa: E402 - the searches' limits: RL gets TASO's
from train_default_policy import OVERRIDES as SHIPPED_RECIPE  # noqa: E402

# The recipes (Hydra overrides of `xrl train`; `--updates` overrides their PPO updates).
# hints / graphs-only: a fresh network, warm-started from beam and greedy, then PPO (model.use_hints apart).
TRAIN = ["graphs=headroom", "cost=target", "cost.device=cpu", "imitation.teachers=[beam,greedy]",
         "imitation.epochs=40", "imitation.lr=0.003", "imitation.time_limit=15", "env.horizon=20",
         "model.hidden=32", "model.layers=2", "algo.update_epochs=2", "algo.lr=0.0002", "episodes_per_worker=2",
         "eval_every=2", "workers=2", "logger=none", "progress=false", "updates=6"]
# finetune: the shipped network fine-tuned for the default target (init_from=default): cloned from the
# best of its own guided search (one step of expert iteration), beam and exhaustive search, then PPO with
# the demonstrations rehearsed after every update (without it PPO unlearns fire_small's 20-step sequence).
FINETUNE = ["init_from=default", "model.hidden=32", "model.heads=2", "model.layers=2", "graphs=headroom",
            "graphs.eval=[]", "cost=target", "cost.device=cpu", "env.horizon=20", "env.max_candidates=32",
            "imitation.teachers=[rl,beam,exhaustive]", "imitation.time_limit=15", "imitation.epochs=10",
            "imitation.lr=0.0003", "imitation.rehearse=1", "algo.lr=0.0002", "algo.minibatch_size=16", "updates=40",
            "workers=2", "episodes_per_worker=2", "eval_every=4", "checkpoint_every=4", "logger=none",
            "progress=false"]
# shipped: the shipped policy's recipe (analytic `paper` cost, graphs=default: every headroom graph is new
# to it, best.pt chosen on its training graphs). Seed 0 is xrl/policies/default.pt itself, not retrained.
SHIPPED = [o for o in SHIPPED_RECIPE if not o.startswith("seed=")] + ["progress=false"]
VARIANTS = {"hints": [*TRAIN, "model.use_hints=true"], "graphs-only": [*TRAIN, "model.use_hints=false"],
            "finetune": FINETUNE, "shipped": SHIPPED}
SEARCHES = ("greedy", "beam", "taso", "tensat", "exhaustive")
FIELDS = ["variant", "seed", "graph", "split", "mode", "status", "speedup", "time_s", "rewrites", "verified"]
ARM_FIELDS = ["variant", "seeds", *prior_arms.FIELDS]  # seeds: of trained-0, trained-1, ... in order



def append_rows(path: Path, fields: Sequence[str], rows: Iterable[dict]) -> None:
    """Append rows to a CSV file, with its header when the file is new: a stopped run keeps what it wrote."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(rows)

def split_of() -> dict[str, str]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONF_DIR / "graphs" / "headroom.yaml")
    return {**{g: "train" for g in cfg.train}, **{g: "val" for g in cfg.val}, **{g: "held-out" for g in cfg.eval}}


def recipe(variant: str, seed: int, updates: int | None) -> list[str]:
    return [*VARIANTS[variant], f"seed={seed}", *([f"updates={updates}"] if updates is not None else [])]


def train_seed(variant: str, seed: int, updates: int | None, out: Path) -> Path:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from xrl.rl.train import train

    if variant == "shipped" and seed == 0:
        from xrl.rl.checkpoint import default_policy_path

        return default_policy_path()
    best = out / "best.pt"
    if best.exists():
        return best
    overrides = recipe(variant, seed, updates)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)
    t0 = time.perf_counter()
    summary = train(cfg, out)
    print(f"trained {variant} seed {seed} in {(time.perf_counter() - t0) / 60:.1f} min ({' '.join(overrides)})",
          file=sys.stderr, flush=True)
    return summary.best_checkpoint or summary.last_checkpoint


def evaluate(policy: Path, graph: str, mode: str, time_limit: float, target: str):  # noqa: ANN201
    from xrl.cost import get_cost_model
    from xrl.frontends.loader import load_model
    from xrl.search.compare import CompareConfig, run_one

    cost = get_cost_model("target", device="auto", target=target)
    loaded = load_model(graph, seed=0)
    config = CompareConfig(graphs=(graph,), methods=("rl",), target=target, method_time_limits={"rl": time_limit},
                           method_options={"rl": {"policy": str(policy), "mode": mode}})
    return run_one(loaded, "rl", cost, cost.cost(loaded.graph), config)


def run_arms(variant: str, seeds: Sequence[int], policies: Sequence[Path], graphs: Sequence[str],
             split: dict[str, str], args: argparse.Namespace, budgets: list[float], path: Path) -> None:
    """The ablation's arms (experiments/prior_arms.py) for one variant's trained seeds, per graph not yet in
    `path` for this variant; appended to `path` graph by graph (resumable)."""
    from xrl.cost import get_cost_model
    from xrl.rewrite import RewriteEngine
    from xrl.rewrite.rules import load_rules

    done = {r["graph"] for r in read_rows(path) if r["variant"] == variant}
    todo = [g for g in graphs if g not in done]
    if not todo:
        return
    cost = get_cost_model("target", device="auto", target=args.target)  # evaluate()'s cost model
    engine = RewriteEngine(load_rules())  # parsed and verified once, outside every arm's budget
    arm_args = argparse.Namespace(policy=",".join(str(p) for p in policies), shipped=False,
                                  untrained_seeds=args.untrained_seeds, searches=args.arms_searches)
    for g in todo:
        t0 = time.perf_counter()
        rows = prior_arms.run_graph(g, split.get(g, "held-out"), arm_args, cost, engine, budgets)
        rows = [{"variant": variant, "seeds": ",".join(map(str, seeds)), **r} for r in rows]
        append_rows(path, ARM_FIELDS, rows)
        print(f"arms {variant} {g} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


def arms_report(arm_rows: list[dict[str, str]], variants: Sequence[str], budgets: Sequence[float] | None) -> str:
    """Per variant, experiments/rl_ablation.py's tables of its arms: per budget and graph, geomeans per split,
    and the learning gain (trained / best non-learned prior, same guided search and budget)."""
    parts = []
    for v in variants:
        rows = [r for r in arm_rows if r["variant"] == v
                and (budgets is None or float(r["budget"]) in budgets)]
        if not rows:
            continue
        seeds = list(dict.fromkeys(r["seeds"] for r in rows))
        names = "; ".join(", ".join(f"trained-{i} = seed {x}" for i, x in enumerate(s.split(","))) if "," in s
                          else f"trained = seed {s}" for s in seeds)
        header = (f"## Prior arms at equal budget, variant `{v}`\n\n"
                  "experiments/rl_ablation.py's arms (experiments/prior_arms.py): the guided search run to its "
                  "budget (stop rule and greedy anchor off) under the trained policy, the same network untrained, "
                  "a uniform prior and the cost prior; argmax: the trained policy's argmax rollout alone; the "
                  "searches with that time limit. Speed-ups are the target's estimates, recomputed"
                  + f" ({names}).")
        parts.append(prior_arms.summarise(rows, header))
    return "\n\n".join(parts)


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def mean_sd(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def summarise(rows: list[dict[str, str]], baselines: list[dict[str, str]], split: dict[str, str],
              variants: Sequence[str], header: str) -> str:
    base = {(r["graph"], r["method"]): float(r["speedup"]) for r in baselines if r["status"] == "ok"}
    rl = [r for r in rows if r["status"] == "ok"]
    graphs = [g for g in split if any(r["graph"] == g for r in rl)]
    best_known = {g: max([base.get((g, m), 0.0) for m in SEARCHES] + [float(r["speedup"]) for r in rl
                                                                      if r["graph"] == g]) for g in graphs}
    tol = 1e-3

    def runs(variant: str, mode: str, g: str) -> list[float]:
        return [float(r["speedup"]) for r in rl if r["variant"] == variant and r["mode"] == mode and r["graph"] == g]

    cols = [(v, m) for v in variants for m in ("guided", "argmax")]
    lines = [header, "",
             "| graph | split | greedy | beam | taso | tensat | exhaustive | best known | "
             + " | ".join(f"rl {m} ({v})" for v, m in cols) + " |",
             "|---|---|" + "---:|" * (6 + len(cols))]
    for g in graphs:
        cells = [f"{base[(g, m)]:.3f}" if (g, m) in base else "-" for m in SEARCHES]
        rlc = []
        for v, m in cols:
            xs = runs(v, m, g)
            hit = sum(x >= best_known[g] * (1 - tol) for x in xs)
            rlc.append(f"{mean_sd(xs)} ({hit}/{len(xs)})" if xs else "-")
        lines.append(f"| {g} | {split[g]} | " + " | ".join(cells) + f" | {best_known[g]:.3f} | " + " | ".join(rlc)
                     + " |")
    lines += ["", "Per column: mean ± standard deviation over seeds, and (seeds that reached the best known result "
              f"within {tol:.1%}).", ""]
    # the goals, per variant, guided mode, per seed then averaged
    for v in variants:
        seeds = sorted({r["seed"] for r in rl if r["variant"] == v and r["mode"] == "guided"})
        if not seeds:
            continue
        reach, gm, above, held = [], [], [], []
        headroom = [g for g in graphs if g in best_known and (g, "greedy") in base
                    and best_known[g] > base[(g, "greedy")] * (1 + tol)]
        for s in seeds:
            mine = {r["graph"]: float(r["speedup"]) for r in rl if r["variant"] == v and r["mode"] == "guided"
                    and r["seed"] == s}
            reach.append(sum(mine[g] >= best_known[g] * (1 - tol) for g in mine) / len(mine))
            gm.append(geomean(list(mine.values())))
            above.append(sum(mine.get(g, 0) > base[(g, "greedy")] * (1 + tol) for g in headroom))
            hg = [g for g in mine if split[g] == "held-out" and (g, "greedy") in base]
            held.append(geomean([mine[g] for g in hg]) / geomean([base[(g, "greedy")] for g in hg]) if hg else math.nan)
        tensat = geomean([base[(g, "tensat")] for g in graphs if (g, "tensat") in base])
        greedy = geomean([base[(g, "greedy")] for g in graphs if (g, "greedy") in base])
        lines += [f"**{v}, guided** ({len(seeds)} seeds): reaches the best known result on {mean_sd(reach)} of the "
                  f"graphs (goal 0.80); geomean {mean_sd(gm)} against tensat {tensat:.3f} and greedy {greedy:.3f}; "
                  f"strictly above greedy on {mean_sd([float(a) for a in above])} of the {len(headroom)} graphs "
                  f"with headroom; held-out geomean / greedy's {mean_sd(held)} (goal >= 1).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baselines", required=True, help="experiments/headroom.py's results.csv (same target)")
    p.add_argument("--target", default="ort-cpu", choices=sorted(TIME_LIMITS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default="hints", help="comma list of: " + ", ".join(VARIANTS))
    p.add_argument("--updates", type=int, help="PPO updates after the warm start (default: the recipe's)")
    p.add_argument("--modes", default="guided,argmax")
    p.add_argument("--graphs", help="evaluate only these (comma list); default: the whole split")
    p.add_argument("--out", default="experiments/results/rl_vs_search")
    p.add_argument("--report-only", action="store_true", help="rewrite the table from rl_runs.csv, run nothing")
    p.add_argument("--train-only", action="store_true", help="train the seeds, evaluate nothing (evaluate later)")
    p.add_argument("--arms", action="store_true",
                   help="also run experiments/rl_ablation.py's arms per variant (its seeds as trained priors; the "
                        "untrained network, uniform and cost priors, argmax, the searches) and the learning gain")
    p.add_argument("--arms-budgets", help="--arms: seconds, comma list (default: TASO's limit, the guided rows')")
    p.add_argument("--arms-searches", default=",".join(prior_arms.SEARCHES),
                   help="--arms: the searches run beside the guided arms")
    p.add_argument("--untrained-seeds", type=lambda s: [int(x) for x in s.split(",") if x],
                   help="--arms: seeds of the untrained network (default: --seeds)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    split = split_of()
    graphs = args.graphs.split(",") if args.graphs else list(split)
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS):
        print(f"rl_vs_search: variants come from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    limit = TIME_LIMITS[args.target]["taso"]
    if args.untrained_seeds is None:
        args.untrained_seeds = [int(s) for s in args.seeds.split(",") if s]
    arm_budgets = [float(b) for b in args.arms_budgets.split(",")] if args.arms_budgets else [limit]
    runs_csv, arms_csv = out / "rl_runs.csv", out / "arms_runs.csv"
    rows = read_rows(runs_csv)
    done = {(r["variant"], r["seed"], r["graph"], r["mode"]) for r in rows}
    t0 = time.perf_counter()
    for variant in [] if args.report_only else variants:
        policies, seed_list = [], [int(s) for s in args.seeds.split(",")]
        for seed in seed_list:
            policy = train_seed(variant, seed, args.updates, out / variant / f"seed_{seed}")
            policies.append(policy)
            for g in [] if args.train_only else graphs:
                for mode in args.modes.split(","):
                    if (variant, str(seed), g, mode) in done:
                        continue
                    rec = evaluate(policy, g, mode, limit, args.target)
                    row = {"variant": variant, "seed": seed, "graph": g, "split": split.get(g, "?"), "mode": mode,
                           "status": rec.status, "speedup": rec.speedup, "time_s": rec.time_s,
                           "rewrites": rec.rewrites, "verified": rec.verified}
                    rows.append({k: str(v) for k, v in row.items()})
                    append_rows(runs_csv, FIELDS, [row])
                    print(f"[{time.perf_counter() - t0:6.0f} s] {variant} seed {seed} {g} {mode}: {rec.status} "
                          f"{rec.speedup:.3f}x in {rec.time_s:.1f} s {rec.error}", file=sys.stderr, flush=True)
        if args.arms and not args.train_only:
            run_arms(variant, seed_list, policies, graphs, split, args, arm_budgets, arms_csv)
    seeds = {v: ", ".join(map(str, sorted({int(r["seed"]) for r in rows if r["variant"] == v}))) for v in variants}
    recipes = {v: " ".join(recipe(v, 0, args.updates)).replace("seed=0", "seed=S") for v in variants}
    header = (f"Target `{args.target}` (generic cpu profile: XRL_NO_CALIBRATION=1). `--search rl` guided within "
              f"{limit:g} s (TASO's limit in the searches' table) and argmax, with best.pt of `xrl train` with, "
              "per variant (seeds S): "
              + "; ".join(f"{v} (S = {seeds[v]}): `{recipes[v]}`" for v in variants)
              + ". shipped seed 0 is xrl/policies/default.pt itself. Searches: experiments/headroom.py. Every "
              "result verified under onnxruntime. Command, per variant and seed: `XRL_NO_CALIBRATION=1 "
              f".venv/bin/python experiments/rl_vs_search.py --baselines {args.baselines} --seeds S --variants V"
              + (f" --updates {args.updates}" if args.updates is not None else "") + f" --out {args.out}`.")
    text = summarise(rows, read_rows(Path(args.baselines)), split, variants, header)
    arms = arms_report(read_rows(arms_csv), variants, arm_budgets if args.arms_budgets else None)
    if arms:
        text += "\n\n" + arms
    (out / "rl_vs_search.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

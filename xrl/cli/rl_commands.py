"""`xrl train` (the Hydra app over conf/) and `xrl eval` (a policy against baselines, per graph)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from xrl.cli.output import format_table, print_json
from xrl.errors import ConfigError, XrlError
from xrl.stats import geomean


def _conf_dir() -> Path:
    """The Hydra config tree: conf/ of the checkout, or conf/ where a wheel installed it (package-data)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    return package.parent / "conf"


CONF_DIR = _conf_dir()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train",
                       help="train a rewrite policy with PPO (Hydra config in conf/; overrides as key=value)",
                       description="Train a policy. Overrides are Hydra's: `xrl train model=gin updates=100`; "
                                   "sweep with -m: `xrl train -m model=gat,gatv2,gin model.layers=3,5`. "
                                   "Show the composed config with `--cfg job`.")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides (see conf/train.yaml)")
    p.add_argument("-m", "--multirun", action="store_true", help="sweep over comma-separated override values")
    p.add_argument("-c", "--cfg", choices=("job", "hydra", "all"), help="print the composed config and exit")
    p.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    p.add_argument("--info", action="store_true", help="print Hydra's search path and config sources, then exit")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="run a policy on graphs: speedup, steps and time per graph (held-out apart)")
    p.add_argument("--env", choices=("rewrite", "pass_ordering"), default="rewrite",
                   help="rewrite: a rewrite policy (X-RLflow); pass_ordering: a pass-ordering policy against xrl's "
                   "default pass order, on the built-in graphs and the HLO fixtures (default rewrite)")
    p.add_argument("--policy", help="policy checkpoint (default: the shipped policy; with --env pass_ordering, "
                   "the one-step lookahead agent)")
    p.add_argument("--graphs", help="comma-separated built-in graph names (default: every built-in graph)")
    p.add_argument("--suite", choices=("xrlflow", "taso", "small"), help="only this suite's graphs")
    p.add_argument("--cost", default="analytic", help="cost backend (default analytic)")
    p.add_argument("--device", default="h100", help="device profile of the analytic model (default h100)")
    p.add_argument("--horizon", type=int,
                   help="rewrites per rollout at most (default 50); pass ordering: passes (default: the policy's)")
    p.add_argument("--samples", type=int, default=0, help="sampled rollouts besides the greedy one (best kept)")
    p.add_argument("--max-candidates", type=int,
                   help="cap on candidates per step (default: the policy's training cap; 0: no cap)")
    p.add_argument("--baselines", action="store_true",
                   help="also run greedy search, the random policy, and the guided search (xrl.rl.guided) under the "
                        "cost prior and under the policy, beside the policy's argmax")
    p.add_argument("--guided-budget", type=float, default=2.0, metavar="S",
                   help="--baselines: seconds per graph for each guided search (default 2)")
    p.add_argument("--random-rollouts", type=int, default=3, help="random-policy rollouts per graph (mean reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", metavar="FILE", help="also write the table (markdown) to FILE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)


# ----- train --------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    if not (CONF_DIR / "train.yaml").is_file():
        raise ConfigError(f"the training configs are missing ({CONF_DIR}/train.yaml); the xrl install is incomplete, "
                          "reinstall it (the configs ship as package data)")
    import hydra

    if not (args.multirun or args.cfg or args.info):
        _check_overrides(list(args.overrides))
    errors: list[XrlError] = []

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def app(cfg: Any) -> float | None:
        try:
            return _train_job(cfg)  # the objective of a sweeper (Optuna): the final eval speed-up
        except XrlError as e:  # Hydra would print its own traceback and exit 1: keep xrl's one-line contract
            errors.append(e)
            if args.multirun:
                sys.stderr.write(f"xrl: error in this run: {e}\n")
            return None

    argv = ["xrl train"]
    if args.multirun:
        # the sweep summary is written by a Hydra callback, in the process that launched the sweep, whatever
        # the launcher (joblib, submitit) and sweeper (Optuna)
        argv += ["--multirun", f"+hydra.callbacks.xrl_sweep_summary._target_={__name__}.sweep_summary_callback"]
    if args.cfg:
        argv += ["--cfg", args.cfg]
    if args.resolve:
        argv.append("--resolve")
    if args.info:
        argv.append("--info")
    saved = sys.argv
    sys.argv = argv + list(args.overrides)
    try:
        app()
    finally:
        sys.argv = saved
    if errors:
        raise errors[0]
    return 0


def _check_overrides(overrides: list[str]) -> None:
    """Compose the config once up front, so a bad override is one line and exit code 2 (Hydra's own
    report is several lines and exit code 1). Sweeps (-m) are left to Hydra: compose cannot expand them."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from xrl.rl.train import check_settings

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if not o.startswith(("hydra.", "hydra/"))])
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"bad training override: {first} (see `xrl train --cfg job` for the settings)") from None
    if (plain.get("env") or {}).get("name") != "pass_ordering":
        check_settings(plain)  # before Hydra starts a run: no traceback, no run folder


def _train_job(cfg: Any) -> float:
    from hydra.core.hydra_config import HydraConfig

    import xrl.search.registry  # noqa: F401 - registers the runner of imitation's teacher searches
    from xrl.rl.train import train

    hc = HydraConfig.get()
    _sweep_wandb(cfg, hc)
    out_dir = Path(hc.runtime.output_dir)
    s = train(cfg, out_dir)
    last = s.history[-1] if s.history else {}
    what = "vs the default pass order" if cfg.get("env", {}).get("name") == "pass_ordering" else "speedup"
    print(f"trained {s.updates} updates, {s.env_steps} env steps in {s.time_s:.1f} s; "
          f"sampled {what} {last.get('speedup_mean', float('nan')):.3f}x, "
          f"policy argmax {last.get('eval_speedup_mean', float('nan')):.3f}x (train graphs)")
    print(f"checkpoint {s.last_checkpoint}" + (f", best {s.best_checkpoint}" if s.best_checkpoint else ""))
    if s.curves:
        print(f"learning curves {s.curves}")
    return float(last.get("eval_speedup_mean", float("nan")))


def _sweep_wandb(cfg: Any, hc: Any) -> None:
    """In a multirun, wandb runs share the sweep's folder as their group and carry their overrides as
    tags, unless logger.group / logger.tags are set."""
    from hydra.types import RunMode
    from omegaconf import open_dict

    log = cfg.get("logger")
    if hc.mode != RunMode.MULTIRUN or log is None or "group" not in log:
        return
    with open_dict(cfg):
        if log.group is None:
            log.group = str(hc.sweep.dir)[-128:]  # wandb's limit on a group's name
        if log.tags is None:
            log.tags = [o for o in hc.overrides.task if not o.startswith(("hydra.", "hydra/", "+hydra"))]


def sweep_summary_callback() -> Any:
    """The Hydra callback `xrl train -m` adds: at the end of the multirun, `xrl sweep summarize` on its
    folder (table printed; summary.md, .csv, .png written there). A factory, so that hydra is imported
    only when a sweep runs, not by every `xrl` command."""
    from hydra.experimental.callback import Callback

    class SweepSummary(Callback):
        def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
            from xrl.sweeps import load_runs, summarize, write_summary

            root = Path(str(config.hydra.sweep.dir))
            try:
                runs = load_runs(root)
            except ConfigError as e:  # every run failed before its first update
                sys.stderr.write(f"xrl: no sweep summary: {e}\n")
                return
            paths = write_summary(root, runs)
            headers, rows = summarize(runs)
            print(f"\nsweep summary: {len(runs)} runs under {root}")
            print(format_table(headers, rows))
            print("wrote " + ", ".join(str(p) for p in paths.values()))

    return SweepSummary()


# ----- eval ---------------------------------------------------------------------------------------
def _graph_names(args: argparse.Namespace) -> list[str]:
    from xrl import graphs

    if args.graphs:  # unknown names fail when built, with a did-you-mean message
        return [n.strip() for n in args.graphs.split(",") if n.strip()]
    return graphs.names(args.suite)


def cmd_eval(args: argparse.Namespace) -> int:
    from xrl.cost import get_cost_model
    from xrl.env import resolve_graph
    from xrl.rewrite import RewriteEngine
    from xrl.rl.checkpoint import default_policy_path, load_policy
    from xrl.rl.evaluate import optimize_with_policy, random_rollouts
    from xrl.rl.guided import guided_baselines
    from xrl.rl.rl_search import candidate_cap

    if args.env == "pass_ordering":
        return _eval_passes(args)
    args.horizon = 50 if args.horizon is None else args.horizon
    if args.horizon < 1 or args.samples < 0 or args.random_rollouts < 1:
        raise ConfigError("--horizon and --random-rollouts must be at least 1, --samples at least 0")
    if not args.guided_budget > 0:
        raise ConfigError(f"--guided-budget must be positive, not {args.guided_budget}")
    path = Path(args.policy) if args.policy else default_policy_path()
    policy, ckpt = load_policy(path)
    cap = candidate_cap(ckpt, args.max_candidates)
    trained_on = set(ckpt.get("metadata", {}).get("train_graphs") or ckpt.get("config", {}).get("graphs", {})
                     .get("train", []))
    cost = get_cost_model(args.cost, device=args.device or "auto")  # no --device: this machine
    engine = RewriteEngine.default()
    rows: list[dict[str, Any]] = []
    for name in _graph_names(args):
        graph = resolve_graph(name)
        run = optimize_with_policy(policy, graph, cost, engine=engine, horizon=args.horizon, samples=args.samples,
                                   seed=args.seed, max_candidates=cap)
        row: dict[str, Any] = {"graph": name, "split": "train" if name in trained_on else "held-out",
                               "ops": len(graph), "rl_speedup": run.speedup, "rl_steps": len(run.steps),
                               "rl_time_s": run.time_s, "uphill_paid_off": run.uphill_paid_off}
        if args.baselines:
            from xrl.search.greedy import greedy_search

            g = greedy_search(graph, cost, engine)
            row.update(greedy_speedup=g.original_cost / g.cost, greedy_steps=len(g.steps), greedy_time_s=g.time_s)
            # uniform over every rewrite: the cap ranks candidates by estimated cost, which random must not see
            rnd = random_rollouts(graph, cost, engine=engine, horizon=args.horizon, rollouts=args.random_rollouts,
                                  seed=args.seed)
            row["random_speedup"] = sum(rnd.rollout_speedups) / len(rnd.rollout_speedups)
            for key, found in guided_baselines(policy, graph, cost, engine=engine, horizon=args.horizon,
                                               max_candidates=cap, time_limit=args.guided_budget).items():
                row[f"{key}_speedup"] = found.speedup
        rows.append(row)
        if not args.json:
            print(f"\r{len(rows)} graphs evaluated", end="", file=sys.stderr, flush=True)
    if args.json:
        print_json({"policy": str(path), "cost_model": cost.describe(), "horizon": args.horizon,
                "max_candidates": cap, "graphs": rows})
        return 0
    print("\r", end="", file=sys.stderr)
    text = format_eval_tables(rows, baselines=args.baselines, title=f"policy {path.name}, {cost.describe()}, "
                              f"horizon {args.horizon}, at most {cap or 'all'} candidates per step")
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


def _eval_passes(args: argparse.Namespace) -> int:
    """A pass-ordering policy (or the lookahead agent) against the default order, per graph: the built-in
    graphs (--graphs/--suite) and, unless --graphs names them, the HLO fixtures."""
    from xrl.rl.train_passes import evaluate_passes, suite_graphs

    graphs = suite_graphs(_graph_names(args), hlo=not args.graphs)
    report = evaluate_passes(args.policy, graphs, horizon=args.horizon, device=args.device)
    if args.json:
        print_json(report)
        return 0
    text = format_passes_table(report)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


def format_passes_table(report: dict[str, Any]) -> str:
    rows = [[r["graph"], r["split"], r["ops"], r["default_ops"], r["agent_ops"], f"{r['default_improvement']:.3f}x",
             f"{r['agent_improvement']:.3f}x", f"{r['ratio']:.3f}", " ".join(r["passes"])] for r in report["graphs"]]
    rows.append(["geomean", "", "", "", "", f"{report['geomean_default_improvement']:.3f}x",
                 f"{report['geomean_agent_improvement']:.3f}x", f"{report['geomean_ratio']:.3f}", ""])
    head = ["graph", "split", "ops", "default ops", "agent ops", "default", "agent", "agent vs default",
            "agent's passes"]
    return (f"pass ordering, agent {report['agent']}, {report['horizon']} passes per graph; improvement = ops before / "
            f"ops after, ratio = default ops / agent ops\n" + format_table(head, rows))


BASELINE_KEYS = ("random_speedup", "greedy_speedup", "cost_prior_speedup", "guided_speedup")


def format_eval_tables(rows: list[dict[str, Any]], *, baselines: bool, title: str) -> str:
    """One table per split (graphs trained on, then held out), with a geometric-mean row each."""
    # rl: the policy's argmax rollout; cost prior / guided: the guided search under the cost prior / the policy
    head = (["graph", "ops"] + (["random", "greedy", "cost prior", "guided"] if baselines else [])
            + ["policy argmax", "rl steps", "rl time", "uphill"])
    out = [title]
    for split in ("train", "held-out"):
        part = [r for r in rows if r["split"] == split]
        if not part:
            continue
        table = []
        for r in part:
            base = [f"{r[k]:.3f}x" for k in BASELINE_KEYS] if baselines else []
            table.append([r["graph"], r["ops"], *base, f"{r['rl_speedup']:.3f}x", r["rl_steps"],
                          f"{r['rl_time_s']:.1f} s", "yes" if r["uphill_paid_off"] else ""])
        keys = BASELINE_KEYS if baselines else ()
        gm = [f"{geomean([r[k] for r in part]):.3f}x" for k in keys]
        table.append(["geomean", "", *gm, f"{geomean([r['rl_speedup'] for r in part]):.3f}x", "", "", ""])
        out.append(f"\n{'graphs trained on' if split == 'train' else 'held-out graphs'}:")
        out.append(format_table(head, table))
    return "\n".join(out)

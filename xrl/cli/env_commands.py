"""`xrl env`: play the rewrite environment and write its states (CompilerGym style), replay and validate them.

    xrl env play tiny_cnn --agent greedy --steps 10 -o state.json     # or .csv
    xrl env replay state.json [--validate] [--json]
    xrl env passes --graphs all --hlo --agent greedy  # pass ordering: geomean against the default pass order
    xrl serve --in PIPE --out PIPE                    # a policy server over named pipes (xrl.serve.pipe)
    xrl sweep summarize DIR                           # one table and plot across a multirun's runs
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xrl.cli.output import format_table, print_json
from xrl.errors import ConfigError

AGENTS = ("greedy", "random")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="play the rewrite environment, write its states, replay and validate them")
    env_sub = p.add_subparsers(dest="env_command", metavar="SUBCOMMAND")
    env_sub.required = True

    play = env_sub.add_parser("play", help="run one episode and write its state (JSON, or CSV by the suffix)")
    play.add_argument("graph", metavar="MODEL", help="a built-in graph name or a model file")
    play.add_argument("--agent", choices=AGENTS, default="greedy",
                      help="greedy: the candidate with the lowest estimated cost while it lowers it; random "
                      "(default greedy)")
    play.add_argument("--steps", type=int, default=10, help="episode horizon (default 10)")
    play.add_argument("--cost", default="analytic", help="cost backend of the reward (default analytic)")
    play.add_argument("--seed", type=int, default=0)
    play.add_argument("-o", "--output", required=True, metavar="FILE", help="state file (.json or .csv)")
    play.add_argument("--force", action="store_true", help="replace an existing output")
    play.set_defaults(func=cmd_play)

    rep = env_sub.add_parser("replay", help="replay the states of a file; --validate also checks them")
    rep.add_argument("states", metavar="FILE", help="state file (.json or .csv)")
    rep.add_argument("--validate", action="store_true",
                     help="check that each reward is reproduced and the result computes what its source computes")
    rep.add_argument("--cost", default="analytic", help="cost backend (default analytic)")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_replay)

    po = env_sub.add_parser("passes", help="pass ordering (xrl/PassOrdering-v0): an agent's order against the "
                            "default pass order, op counts per graph and their geomean")
    po.add_argument("--graphs", default="small", metavar="NAMES|SUITE",
                    help="comma-separated built-in graphs or a suite (xrlflow, taso, small, all; default small)")
    po.add_argument("--hlo", action="store_true", help="also the HLO fixtures shipped with xrl (graphs/hlo/*.hlo)")
    po.add_argument("--agent", choices=("greedy", "random"), default="greedy",
                    help="greedy: the pass that removes most ops now; random (default greedy)")
    po.add_argument("--seed", type=int, default=0)
    po.add_argument("--json", action="store_true")
    po.set_defaults(func=cmd_passes)

    sv = sub.add_parser("serve", help="answer an external optimiser's decisions over two named pipes (MLGO style)")
    sv.add_argument("--in", dest="in_path", required=True, metavar="PIPE", help="observations arrive here")
    sv.add_argument("--out", dest="out_path", required=True, metavar="PIPE", help="advice is written here")
    sv.add_argument("--policy", default="hint", metavar="hint|MODEL.zip|POLICY.onnx",
                    help="hint: the lowest estimated cost change (no weights); a MaskablePPO model saved by "
                    "sb3-contrib; or a policy exported by `xrl policy export` (observations are its padded "
                    "inputs, as `--observation release` of clients/c sends them) (default hint)")
    sv.add_argument("--timeout", type=float, default=60.0,
                    help="seconds any wait may last: the host opening its pipe, a message, room for an answer, "
                    "the policy's run (default 60; inf: none)")
    sv.set_defaults(func=cmd_serve)

    sw = sub.add_parser("sweep", help="summaries across the runs of a sweep")
    sw_sub = sw.add_subparsers(dest="sweep_command", metavar="SUBCOMMAND")
    sw_sub.required = True
    sm = sw_sub.add_parser("summarize", help="one table and one plot across the runs under DIR (a Hydra multirun)")
    sm.add_argument("dir", metavar="DIR")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_sweep_summarize)


def _env(graph: str, cost: str, steps: int):
    from xrl.env import GraphRewriteEnv

    return GraphRewriteEnv(graph, cost, horizon=steps)


def cmd_play(args: argparse.Namespace) -> int:
    import numpy as np

    from xrl.env import write_states

    if args.steps < 1:
        raise ConfigError(f"--steps must be at least 1, not {args.steps}")
    out = Path(args.output)
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists; pass --force to replace it")
    env = _env(args.graph, args.cost, args.steps)
    env.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    done = False
    while not done:
        if args.agent == "random":
            action = int(rng.integers(1, env.num_actions)) if env.num_actions > 1 else 0
        else:
            hints = env.candidate_hints()[1:, 0]
            action = 1 + int(np.argmin(hints)) if len(hints) and hints.min() < 0 else 0
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    write_states([env.state], out)
    st = env.state
    print(f"{st.graph}: {len(st.actions)} rewrites, reward {st.reward:.4f}, {st.speedup:.3f}x under {st.cost}; "
          f"wrote {out}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from xrl.env import read_states

    rows, records, failed = [], [], 0
    states = read_states(args.states)  # bounded: distinct states, sources and bytes (a warning says what was cut)
    # one env per source graph (not per state or hash): the graph is loaded once, however many states name it
    horizon: dict[str, int] = {}
    for st in states:
        horizon[st.graph] = max(horizon.get(st.graph, 1), len(st.actions))
    envs: dict[str, object] = {}
    replays: dict[tuple, object] = {}  # states that differ only in their claimed reward share one replay
    for st in states:
        env = envs.get(st.graph)
        if env is None:
            env = envs[st.graph] = _env(st.graph, args.cost, horizon[st.graph])
        rec = {"graph": st.graph, "actions": len(st.actions), "reward": st.reward}
        key = (st.graph, st.graph_hash, st.actions)
        if args.validate:
            from xrl.env.state import with_reward_check

            if key not in replays:
                replays[key] = env.validate(st)
            res = with_reward_check(replays[key], st, measured=env.cost_model.measured)
            rec.update(valid=res.ok, replayed_reward=res.reward, max_abs_err=res.max_abs_err, errors=list(res.errors))
            failed += not res.ok
        else:
            if key not in replays:
                env.apply(st)
                replays[key] = (env.episode_reward, env.speedup)
            rec.update(replayed_reward=replays[key][0], speedup=replays[key][1])
        records.append(rec)
        last = "valid" if args.validate else "speedup"
        rows.append([f"{rec[k]:.4f}" if isinstance(rec.get(k), float) else str(rec.get(k, ""))
                     for k in ("graph", "actions", "reward", "replayed_reward", last)])
    if args.json:
        print_json({"states": records, "failed": failed})
    else:
        print(format_table(["graph", "actions", "reward", "replayed", "valid" if args.validate else "speedup"], rows))
        for rec in records:
            for err in rec.get("errors", ()):
                print(f"{rec['graph']}: {err}")
    return 1 if failed else 0


def cmd_passes(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from xrl.env.pass_order import evaluate_orders, geomean, greedy_policy, random_policy, suite_graphs
    from xrl.search.compare import resolve_graphs

    labelled = suite_graphs(resolve_graphs(args.graphs), hlo=args.hlo)  # HLO fixtures as hlo/NAME
    choose = greedy_policy if args.agent == "greedy" else random_policy(args.seed)
    results = [replace(r, graph=label) for r, (label, _) in
               zip(evaluate_orders([g for _, g in labelled], choose), labelled, strict=True)]
    gm = geomean([r.improvement for r in results])
    if args.json:
        from dataclasses import asdict

        print_json({"results": [asdict(r) | {"improvement": r.improvement} for r in results], "geomean": gm})
        return 0
    rows = [[r.graph, str(r.ops0), str(r.default_ops), str(r.ops), f"{r.improvement:.3f}", " ".join(r.passes)]
            for r in results]
    print(format_table(["graph", "ops", "default order", args.agent, "improvement", "passes"], rows))
    print(f"geomean improvement over the default pass order ({args.agent}): {gm:.3f}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import sys

    from xrl.serve.pipe import PipeProtocolError, check_fifos, check_timeout, hint_policy, serve_pipes

    check_timeout(args.timeout)  # before any policy is loaded: bad options cost nothing
    check_fifos(args.in_path, args.out_path)
    policy = hint_policy
    if args.policy != "hint":
        if not Path(args.policy).exists():
            raise ConfigError(f"no such policy file: {args.policy}")
    if args.policy.endswith(".onnx"):  # an exported policy: onnxruntime only (xrl.policies.release)
        from xrl.policies.release import ReleasePolicy, pipe_policy

        policy = pipe_policy(ReleasePolicy(args.policy), check_timeout(args.timeout))
    elif args.policy != "hint":
        from sb3_contrib import MaskablePPO

        model = MaskablePPO.load(args.policy, device="cpu")

        def policy(obs):  # noqa: ANN001, ANN202
            return int(model.predict(dict(obs), action_masks=obs["action_mask"].astype(bool), deterministic=True)[0])
    try:
        n = serve_pipes(args.in_path, args.out_path, policy, timeout=args.timeout)
    except PipeProtocolError as e:
        raise ConfigError(f"serve: {e}") from None
    print(f"served {n} decisions", file=sys.stderr)
    return 0


def cmd_sweep_summarize(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from xrl.sweeps import load_runs, summarize, write_summary

    runs = load_runs(args.dir)
    paths = write_summary(args.dir, runs)
    headers, rows = summarize(runs)
    if args.json:
        print_json({"runs": [asdict(r) for r in runs], "table": [dict(zip(headers, r)) for r in rows],
                    "files": {k: str(v) for k, v in paths.items()}})
        return 0
    print(format_table(headers, rows))
    print(f"{len(runs)} runs; wrote {', '.join(str(p) for p in paths.values())}")
    return 0

"""The graph-holding side of the C client's exchange (clients/c/xrl_client.c starts it).

xrl's graphs and rewrite engine are Python, so the episode (the graph, its candidates, applying the
chosen rewrite) lives here: the xrl env writes each observation in the pipe protocol (xrl.serve.pipe)
to the C client and reads the advice back, exactly as xrl.serve.host drives a server. The C client
checks and relays every message to the server and its advice back. Prints the result as one JSON line.

    --observation graph     the env's padded observation (xrl.env.observation), for `xrl serve`'s policies
                            (hint, MaskablePPO); the episode as xrl.serve.host.drive plays it
    --observation release   a release-mode policy's padded inputs (xrl.policies.release.pipe_specs), for
                            `python -m xrl.policies.release serve --policy FILE.onnx`; the episode as
                            `--search rl --rl-mode argmax` plays it (horizon, candidate cap, cheapest graph)

    python clients/c/env_side.py --in TO_CLIENT --out FROM_CLIENT --graph mlp
"""

from __future__ import annotations

import argparse
import json
import sys

import gymnasium as gym

import xrl  # noqa: F401  (registers the envs)
from xrl.errors import ConfigError
from xrl.serve.host import ADVICE, drive, host_pipes
from xrl.serve.pipe import PipeProtocolError, read_advice, write_header, write_observation


def drive_release(env, in_path: str, out_path: str, timeout: float) -> dict:
    """One argmax episode asking a release policy server; the cheapest graph's rewrites and cost."""
    from xrl.env.observation import default_maxima
    from xrl.policies.release import pad_inputs, pipe_specs, state_inputs

    graphs = int(env.action_space.n)  # candidates + the no-op: the graphs of one state
    nodes, edges = default_maxima(env.graph, getattr(env.engine, "max_growth", 2.0))
    specs = pipe_specs(graphs * nodes, graphs * edges, graphs)
    env.reset(options={"graph": env.graph})
    best = {"cost": env.cost, "rewrites": [], "actions": []}
    with host_pipes(in_path, out_path, timeout) as (to_server, from_server):
        write_header(to_server, specs, ADVICE)
        done, k = False, 0
        while not done:
            write_observation(to_server, specs, pad_inputs(state_inputs(env), specs), k)
            _, _, terminated, truncated, _ = env.step(int(read_advice(from_server, ADVICE, timeout)[0]))
            done, k = terminated or truncated, k + 1
            if env.cost < best["cost"]:
                best = {"cost": env.cost, "rewrites": list(env.rewrites), "actions": list(env.actions)}
    return {**best, "decisions": k}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in", dest="in_path", required=True, help="the pipe this side writes observations to")
    ap.add_argument("--out", dest="out_path", required=True, help="the pipe it reads advice from")
    ap.add_argument("--graph", default="mlp")
    ap.add_argument("--observation", choices=("graph", "release"), default="graph")
    ap.add_argument("--max-candidates", type=int, default=16)
    ap.add_argument("--horizon", type=int, default=0, help="default: 6 (graph), --search rl's (release)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    horizon = args.horizon or 6
    if args.observation == "release" and not args.horizon:
        from xrl.env import resolve_graph
        from xrl.env.graph_rewrite import default_horizon

        horizon = default_horizon(resolve_graph(args.graph))
    env = gym.make("xrl/GraphRewrite-v0", graph=args.graph, max_candidates=args.max_candidates,
                   horizon=horizon).unwrapped
    try:
        if args.observation == "release":
            result = drive_release(env, args.in_path, args.out_path, args.timeout)
        else:
            result = {"actions": drive(env, args.in_path, args.out_path, seed=args.seed, timeout=args.timeout),
                      "cost": env.cost}
    except (PipeProtocolError, ConfigError) as e:
        print(f"env side: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        print("env side: error: the client closed the observation pipe mid-exchange", file=sys.stderr)
        return 1
    print(json.dumps({"graph": args.graph, **result, "original_cost": env.cost0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

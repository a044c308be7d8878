"""Release-mode policies: run an exported policy (`xrl policy export`, xrl.policies.export) with onnxruntime.

Imports neither torch_geometric nor xrl's training code (xrl.nn, xrl.rl): the env supplies the
candidates and hints, `feature_arrays` the node and edge features (numpy), onnxruntime the scores.
`--search rl --policy FILE.onnx` (xrl.api) comes here: the policy's argmax at every step until it
chooses the no-op, no rewrite applies or the horizon ends; the cheapest graph on the way is the result,
as for a checkpoint's argmax rollout (xrl.rl.evaluate).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from xrl.cost.base import CostModel
from xrl.errors import ConfigError
from xrl.ir import Graph
from xrl.search.result import SearchResult

FORMAT = "xrl-release-policy/1"  # also in xrl.policies.export, which this module must not import (it needs torch)


def state_inputs(env: Any) -> dict[str, np.ndarray]:
    """The exported policy's inputs for `env`'s current state: its graph, then each candidate (action k = graph k)."""
    from xrl.env.graph_rewrite import feature_graph
    from xrl.features.featurize import feature_arrays

    parts = [feature_arrays(env.graph)] + [feature_arrays(feature_graph(c)) for c in env.candidates]
    sizes = np.array([p[0].shape[0] for p in parts])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return {
        "x": np.concatenate([p[0] for p in parts]),
        "edge_index": np.concatenate([p[1] + off for p, off in zip(parts, offsets)], axis=1),
        "edge_attr": np.concatenate([p[2] for p in parts]),
        "u": np.concatenate([p[3] for p in parts]),
        "batch": np.repeat(np.arange(len(parts), dtype=np.int64), sizes),
        "cand_attr": np.asarray(env.candidate_hints(), dtype=np.float32),
    }


class ReleasePolicy:
    """An exported policy file, ready to choose."""

    def __init__(self, path: str | Path, *, threads: int | None = None) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such policy file (write one with `xrl policy export CKPT -o FILE.onnx`)")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # the exporter's dynamic shapes draw size warnings that are not errors
        if threads:
            opts.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for unreadable models
            raise ConfigError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e})") from None
        self.meta = dict(self.session.get_modelmeta().custom_metadata_map)
        if self.meta.get("format") != FORMAT:
            raise ConfigError(f"{path} is not an exported xrl policy (expected format {FORMAT}; "
                              "export one with `xrl policy export`)")
        self.path = path
        self.config = json.loads(self.meta["policy_config"])
        self.max_candidates: int | None = json.loads(self.meta.get("max_candidates", "null"))
        self._check_dims()
        self.inputs = [i.name for i in self.session.get_inputs()]  # an unused input (gcn's edge_attr) is dropped

    def _check_dims(self) -> None:
        from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM

        dims = (self.config["node_dim"], self.config["edge_dim"], self.config["global_dim"])
        if dims != (NODE_DIM, EDGE_DIM, GLOBAL_DIM):
            raise ConfigError(f"{self.path} was trained on features of size {dims} but this xrl makes "
                              f"{(NODE_DIM, EDGE_DIM, GLOBAL_DIM)}; retrain and export the policy again")

    def logits(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """[graphs] the policy's score of each action."""
        return self.session.run(["logits"], {k: inputs[k] for k in self.inputs})[0]

    def choose(self, env: Any) -> int:
        """The greedy action in `env`'s current state (lowest index on ties, as the checkpoint's `mode()`)."""
        return int(np.argmax(self.logits(state_inputs(env))))


def release_search(graph: Graph, cost_model: CostModel, policy: ReleasePolicy, *, horizon: int,
                   max_candidates: int | None = None, engine: Any = None,
                   time_limit: float | None = None) -> SearchResult:
    """The policy's argmax rollout on `graph`; the cheapest graph it passed through."""
    from xrl.env import GraphRewriteEnv

    t0 = time.perf_counter()
    deadline = t0 + time_limit if time_limit is not None else float("inf")
    env = GraphRewriteEnv(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates,
                          observation="summary")
    env.reset(options={"graph": graph})
    best_graph, best_cost, best_steps, best_actions = graph, env.cost, [], []
    done, n = False, 0
    while not done and time.perf_counter() < deadline:
        _, _, terminated, truncated, _ = env.step(policy.choose(env))
        done, n = terminated or truncated, n + 1
        if env.cost < best_cost:
            best_graph, best_cost, best_steps, best_actions = env.graph, env.cost, list(env.rewrites), list(env.actions)
    return SearchResult(graph=best_graph, cost=best_cost, original_cost=env.cost0, steps=best_steps, explored=n,
                        time_s=time.perf_counter() - t0, method="rl", details={
                            "policy": str(policy.path), "mode": "argmax", "release": True, "env_steps": n,
                            "actions": best_actions})


def run_release(graph: Graph, cost: CostModel, *, seed: int, steps: int | None, time_limit: float | None,
                **options: Any) -> SearchResult:
    """The `xrl.api` runner of `--search rl --policy FILE.onnx`: options `policy`, `mode` (argmax only),
    `max_candidates` (default: the cap the policy was trained with; 0: none). `seed` is unused: argmax draws nothing."""
    from xrl.search.rl_search import default_horizon

    known = ("policy", "mode", "max_candidates")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"a release-mode policy (.onnx) takes no option {', '.join(map(repr, unknown))}; "
                          f"its options: {', '.join(known)}")
    if options.get("mode") not in (None, "argmax"):
        raise ConfigError(f"a release-mode policy (.onnx) plays argmax only, not --rl-mode {options['mode']}")
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be at least 1 for --search rl, not {steps}")
    policy = ReleasePolicy(options["policy"])
    cap = options.get("max_candidates")
    if cap is None:
        cap = policy.max_candidates
    elif cap < 0:
        raise ConfigError(f"max_candidates must be 0 (no cap) or more, not {cap}")
    return release_search(graph, cost, policy, horizon=steps or default_horizon(graph), max_candidates=cap or None,
                          time_limit=time_limit)


# ----- over the pipe protocol (xrl.serve.pipe) ------------------------------------------------------------
# The policy's inputs change size every step, and the protocol's header fixes each tensor's shape once
# (MLGO's convention): they travel padded to maxima, with `counts` = (nodes, edges, graphs) in use.
def pipe_specs(max_nodes: int, max_edges: int, max_graphs: int) -> list[Any]:
    """The header's tensor specs of the padded policy inputs (max_graphs: candidates + 1, the no-op)."""
    from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
    from xrl.features.metagraph import CAND_DIM
    from xrl.serve.pipe import TensorSpec

    return [TensorSpec("x", (max_nodes, NODE_DIM), "float32"), TensorSpec("edge_index", (2, max_edges), "int64"),
            TensorSpec("edge_attr", (max_edges, EDGE_DIM), "float32"),
            TensorSpec("u", (max_graphs, GLOBAL_DIM), "float32"), TensorSpec("batch", (max_nodes,), "int64"),
            TensorSpec("cand_attr", (max_graphs, CAND_DIM), "float32"), TensorSpec("counts", (3,), "int64")]


def pad_inputs(inputs: dict[str, np.ndarray], specs: list[Any]) -> dict[str, np.ndarray]:
    """`inputs` (state_inputs) zero-padded to the specs' shapes, with their `counts`."""
    n, e, b = inputs["x"].shape[0], inputs["edge_index"].shape[1], inputs["u"].shape[0]
    out = {"counts": np.array([n, e, b], dtype=np.int64)}
    for spec in specs:
        if spec.name == "counts":
            continue
        arr = inputs[spec.name]
        if any(have > room for have, room in zip(arr.shape, spec.shape)):
            raise ConfigError(f"{spec.name} of shape {arr.shape} exceeds the declared {spec.shape}; raise the maxima")
        padded = np.zeros(spec.shape, dtype=spec.dtype)
        padded[tuple(slice(0, s) for s in arr.shape)] = arr
        out[spec.name] = padded
    return out


def unpad_inputs(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of pad_inputs: the first `counts` rows (edges) of each tensor."""
    n, e, b = (int(c) for c in obs["counts"])
    return {"x": obs["x"][:n], "edge_index": obs["edge_index"][:, :e], "edge_attr": obs["edge_attr"][:e],
            "u": obs["u"][:b], "batch": obs["batch"][:n], "cand_attr": obs["cand_attr"][:b]}


def pipe_policy(policy: ReleasePolicy) -> Any:
    """A `xrl.serve.pipe.Policy`: the greedy action from one padded observation."""

    def choose(obs: dict[str, np.ndarray]) -> int:
        from xrl.serve.pipe import PipeProtocolError

        try:
            inputs = unpad_inputs(obs)
            return int(np.argmax(policy.logits({k: np.ascontiguousarray(v) for k, v in inputs.items()})))
        except (KeyError, ValueError) as e:
            raise PipeProtocolError(f"the observation is not a release policy's padded inputs ({e})") from None
        except Exception as e:  # onnxruntime's errors on bad sizes or indices: the host's message was wrong
            raise PipeProtocolError(f"the policy could not read the observation ({type(e).__name__})") from None

    return choose


def main(argv: list[str] | None = None) -> int:
    """`python -m xrl.policies.release serve --in PIPE --out PIPE --policy FILE.onnx`: `xrl serve` for an
    exported policy (the same protocol; the observation is the policy's padded inputs, see pipe_specs)."""
    import argparse
    import sys

    from xrl.serve.pipe import PipeProtocolError, check_fifos, check_timeout, serve_pipes

    ap = argparse.ArgumentParser(prog="python -m xrl.policies.release")
    sub = ap.add_subparsers(dest="command", required=True)
    sv = sub.add_parser("serve")
    sv.add_argument("--in", dest="in_path", required=True)
    sv.add_argument("--out", dest="out_path", required=True)
    sv.add_argument("--policy", required=True, metavar="FILE.onnx")
    sv.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    try:
        check_timeout(args.timeout)
        check_fifos(args.in_path, args.out_path)
        n = serve_pipes(args.in_path, args.out_path, pipe_policy(ReleasePolicy(args.policy)), timeout=args.timeout)
    except (PipeProtocolError, ConfigError) as e:
        print(f"xrl: error: serve: {e}", file=sys.stderr)
        return 2
    print(f"served {n} decisions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

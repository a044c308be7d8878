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


# What an exported policy is made of (every encoder and pooling, with and without hints, as torch's
# TorchScript exporter writes them at opset 18), plus a few elementwise ops another torch version may pick.
# Anything else, Loop and Scan above all, is refused: a policy file is code, and this is all it may do.
ALLOWED_OPS = frozenset({
    "Add", "Cast", "Clip", "Concat", "Constant", "ConstantOfShape", "Div", "Equal", "Exp", "Expand", "Gather",
    "GatherND", "Gemm", "Identity", "If", "LayerNormalization", "LeakyRelu", "MatMul", "Mul", "NonZero", "Not", "Pow",
    "Range", "ReduceMin", "ReduceSum", "Relu", "Reshape", "ScatterElements", "Shape", "Size", "Slice", "Split",
    "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze",
    "Abs", "Elu", "Greater", "Less", "Log", "Max", "Min", "Neg", "ReduceMax", "ReduceMean", "Sigmoid", "Softmax",
    "Sqrt", "Tanh", "Where",
})
# input: (ONNX element type, rank, the feature width it must have where the file fixes it: index -> name)
_FLOAT, _INT64 = 1, 7
INPUT_TYPES = {"x": (_FLOAT, 2), "edge_index": (_INT64, 2), "edge_attr": (_FLOAT, 2), "u": (_FLOAT, 2),
               "batch": (_INT64, 1), "cand_attr": (_FLOAT, 2)}
REQUIRED_INPUTS = ("x", "edge_index", "u", "batch", "cand_attr")  # edge_attr: unused by gcn, dropped on export
MAX_POLICY_BYTES = 64 << 20  # the shipped policy exports to about 100 KB
_ARENA: list[int] = []  # the memory cap of the onnxruntime allocator policies run on (registered once per process)


class PolicyFileError(ConfigError):
    """A policy file (.onnx) that is not what `xrl policy export` writes, or that misbehaves when run."""


def policy_memory_limit() -> int:
    """Bytes one policy's run may allocate in all: half of one tensor's limit in float32 (1 GiB by default)."""
    from xrl.limits import max_elements

    return max_elements() * 2


def _subgraphs(graph: Any) -> Any:
    """`graph` and every subgraph in its nodes' attributes (If's branches), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _subgraphs(g)


class ReleasePolicy:
    """An exported policy file, checked and ready to choose: its inputs, output, metadata and op types are
    checked on load, each run is bounded in memory (`policy_memory_limit`) and, given a timeout, in time,
    and its output must be one finite score per action."""

    def __init__(self, path: str | Path, *, threads: int | None = None) -> None:
        path = Path(path)
        self.path = path
        model = self._read(path)
        self.meta = {p.key: p.value for p in model.metadata_props}
        if self.meta.get("format") != FORMAT:
            raise PolicyFileError(f"{path} is not an exported xrl policy (expected format {FORMAT}; "
                                  "export one with `xrl policy export`)")
        self.config = self._json_meta("policy_config", dict)
        self.max_candidates: int | None = self._json_meta("max_candidates", int | None, default="null")
        if self.max_candidates is not None and self.max_candidates < 0:
            raise PolicyFileError(f"{path}: max_candidates {self.max_candidates} is negative")
        self._check_dims()
        self._check_graph(model)
        self.session = self._session(model, threads)
        self.inputs = [i.name for i in self.session.get_inputs()]  # an unused input (gcn's edge_attr) is dropped

    # ----- checks on load -----
    def _read(self, path: Path) -> Any:
        import os
        import stat

        import onnx

        try:
            st = os.stat(path)
        except OSError:
            raise PolicyFileError(f"{path}: no such policy file (write one with `xrl policy export CKPT -o "
                                  "FILE.onnx`)") from None
        if not stat.S_ISREG(st.st_mode):
            raise PolicyFileError(f"{path} is not a regular file")
        if st.st_size > MAX_POLICY_BYTES:
            raise PolicyFileError(f"{path} has {st.st_size:,} bytes, over the {MAX_POLICY_BYTES:,} of any exported "
                                  "policy")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf's DecodeError and friends: not a model
            raise PolicyFileError(f"{path} is not a readable ONNX model ({type(e).__name__})") from None
        if any(t.data_location == onnx.TensorProto.EXTERNAL for g in _subgraphs(model.graph) for t in g.initializer):
            raise PolicyFileError(f"{path} refers to weights in other files; an exported policy is one file")
        return model

    def _json_meta(self, key: str, kind: Any, default: str | None = None) -> Any:
        raw = self.meta.get(key, default)
        if raw is None:
            raise PolicyFileError(f"{self.path} has no {key!r} metadata; export the policy again")
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            raise PolicyFileError(f"{self.path}: its {key!r} metadata is not JSON; export the policy again") from None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise PolicyFileError(f"{self.path}: its {key!r} metadata is a {type(value).__name__}, not what "
                                  "`xrl policy export` writes")
        return value

    def _check_dims(self) -> None:
        from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM

        dims = tuple(self.config.get(k) for k in ("node_dim", "edge_dim", "global_dim"))
        if dims != (NODE_DIM, EDGE_DIM, GLOBAL_DIM):
            raise PolicyFileError(f"{self.path} was trained on features of size {dims} but this xrl makes "
                                  f"{(NODE_DIM, EDGE_DIM, GLOBAL_DIM)}; retrain and export the policy again")

    def _check_graph(self, model: Any) -> None:
        bad = sorted({f"{n.domain + ':' if n.domain not in ('', 'ai.onnx') else ''}{n.op_type}"
                      for g in _subgraphs(model.graph) for n in g.node
                      if n.domain not in ("", "ai.onnx") or n.op_type not in ALLOWED_OPS})
        if bad:
            raise PolicyFileError(f"{self.path} uses op types an exported policy never does ({', '.join(bad[:8])}); "
                                  "refused: a policy file runs as code")
        inputs = {i.name: i for i in model.graph.input}
        init = {t.name for t in model.graph.initializer}
        extra = sorted(set(inputs) - set(INPUT_TYPES) - init)
        missing = [k for k in REQUIRED_INPUTS if k not in inputs]
        if extra or missing:
            raise PolicyFileError(f"{self.path} has inputs {sorted(set(inputs) - init)}; an exported policy reads "
                                  f"{', '.join(INPUT_TYPES)} (missing: {', '.join(missing) or 'none'}; unknown: "
                                  f"{', '.join(extra) or 'none'})")
        for name, (elem, rank) in INPUT_TYPES.items():
            if name in inputs:
                t = inputs[name].type.tensor_type
                if t.elem_type != elem or len(t.shape.dim) != rank:
                    raise PolicyFileError(f"{self.path}: input {name!r} must be a rank-{rank} "
                                          f"{'float' if elem == _FLOAT else 'int64'} tensor")
        outputs = {o.name: o.type.tensor_type for o in model.graph.output}
        if "logits" not in outputs or outputs["logits"].elem_type != _FLOAT or len(outputs["logits"].shape.dim) != 1:
            raise PolicyFileError(f"{self.path} has no output 'logits' (one float score per action); outputs: "
                                  f"{', '.join(outputs) or 'none'}")

    def _session(self, model: Any, threads: int | None) -> Any:
        import onnxruntime as ort

        if not _ARENA:  # every policy session allocates from one arena capped at the limit: a run over it fails
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(policy_memory_limit(), -1, -1, -1))
            _ARENA.append(policy_memory_limit())
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # a refused run is reported by xrl, in one line
        opts.add_session_config_entry("session.use_env_allocators", "1")
        # no graph optimisation: constant folding would run the file's constant subgraphs at load, unbounded in
        # time (a policy's run is as fast without it: 1.78 vs 1.75 s on inception_v3's 64 candidates)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
        try:
            return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for models it cannot run
            raise PolicyFileError(f"{self.path} is not a model onnxruntime can run ({type(e).__name__}: "
                                  f"{str(e)[:200]})") from None

    # ----- running -----
    def logits(self, inputs: dict[str, np.ndarray], timeout: float | None = None) -> np.ndarray:
        """[graphs] the policy's score of each action; a run past `timeout` seconds is terminated."""
        import threading

        import onnxruntime as ort

        run_options = ort.RunOptions()
        run_options.log_severity_level = 4
        timer = None
        if timeout is not None and timeout != float("inf"):
            def stop() -> None:
                run_options.terminate = True

            timer = threading.Timer(max(timeout, 0.0), stop)
            timer.daemon = True
            timer.start()
        try:
            out = self.session.run(["logits"], {k: inputs[k] for k in self.inputs}, run_options)[0]
        except Exception as e:  # onnxruntime's own error types: over the memory cap, terminated, bad indices
            if run_options.terminate:
                raise PolicyFileError(f"{self.path}: a run of the policy took longer than {timeout:g} s") from None
            limit = policy_memory_limit()
            if "Available memory" in str(e):
                raise PolicyFileError(f"{self.path}: a run of the policy needed more than {limit:,} bytes "
                                      "(raise XRL_MAX_ELEMENTS to allow more)") from None
            raise PolicyFileError(f"{self.path}: the policy failed on this state ({type(e).__name__}: "
                                  f"{str(e)[:160]})") from None
        finally:
            if timer is not None:
                timer.cancel()
        graphs = int(np.asarray(inputs["u"]).shape[0])
        out = np.asarray(out)
        if out.shape != (graphs,):
            raise PolicyFileError(f"{self.path} gave {out.shape} scores for {graphs} actions; refused rather than "
                                  "read as a choice")
        if not np.isfinite(out).all():
            raise PolicyFileError(f"{self.path} gave a score that is not finite; refused rather than read as a "
                                  "choice")
        return out

    def choose(self, env: Any, timeout: float | None = None) -> int:
        """The greedy action in `env`'s current state (lowest index on ties, as the checkpoint's `mode()`)."""
        return int(np.argmax(self.logits(state_inputs(env), timeout)))


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
        left = None if time_limit is None else max(deadline - time.perf_counter(), 0.0)
        _, _, terminated, truncated, _ = env.step(policy.choose(env, left))
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
    from xrl.env.graph_rewrite import default_horizon

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
    if not (0 <= n <= obs["x"].shape[0] and 0 <= e <= obs["edge_index"].shape[1] and 0 <= b <= obs["u"].shape[0]):
        raise ValueError(f"counts {[n, e, b]} exceed the padded tensors")
    return {"x": obs["x"][:n], "edge_index": obs["edge_index"][:, :e], "edge_attr": obs["edge_attr"][:e],
            "u": obs["u"][:b], "batch": obs["batch"][:n], "cand_attr": obs["cand_attr"][:b]}


def pipe_policy(policy: ReleasePolicy, timeout: float | None = None) -> Any:
    """A `xrl.serve.pipe.Policy`: the greedy action from one padded observation; each run of the policy
    is terminated after `timeout` seconds (the server's --timeout)."""
    from xrl.serve.pipe import PipeProtocolError

    def choose(obs: dict[str, np.ndarray]) -> int:
        try:
            inputs = {k: np.ascontiguousarray(v) for k, v in unpad_inputs(obs).items()}
        except (KeyError, ValueError, TypeError) as e:
            raise PipeProtocolError(f"the observation is not a release policy's padded inputs ({e})") from None
        _check_indices(inputs)
        return int(np.argmax(policy.logits(inputs, timeout)))

    choose.requires = {spec.name: len(spec.shape) for spec in pipe_specs(1, 1, 1)}  # type: ignore[attr-defined]
    return choose


def _check_indices(inputs: dict[str, np.ndarray]) -> None:
    """The host's indices must point inside its own tensors: a bad message is the host's error, not the policy's."""
    from xrl.serve.pipe import PipeProtocolError

    n, b = inputs["x"].shape[0], inputs["u"].shape[0]
    ei, batch = inputs["edge_index"], inputs["batch"]
    if b < 1 or n < 1 or (ei.size and (ei.min() < 0 or ei.max() >= n)) or batch.min() < 0 or batch.max() >= b:
        raise PipeProtocolError(f"the observation's edge_index or batch points outside its {n} nodes and {b} graphs")


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
        policy = pipe_policy(ReleasePolicy(args.policy), check_timeout(args.timeout))
        n = serve_pipes(args.in_path, args.out_path, policy, timeout=args.timeout)
    except (PipeProtocolError, ConfigError) as e:
        print(f"xrl: error: serve: {e}", file=sys.stderr)
        return 2
    print(f"served {n} decisions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

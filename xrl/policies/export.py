"""`xrl policy export`: a policy checkpoint as one ONNX file that onnxruntime runs (MLGO's release mode).

The exported graph is the policy's scoring of one state (xrl.nn.policy.GraphPolicy, whole-graph path):

    inputs   x [N, NODE_DIM], edge_index [2, E] int64, edge_attr [E, EDGE_DIM], u [B, GLOBAL_DIM],
             batch [N] int64 (each node's graph), cand_attr [B, CAND_DIM]
             graph 0 is the state's current graph, graph k its candidate k (k = 0: the no-op, G itself)
    output   logits [B]: the policy's score of each action (argmax: the greedy choice)

N, E and B are dynamic. The value head is left out: a release runner only chooses. The checkpoint's
incremental encoding is an exact shortcut of this whole-graph encoding (tests/test_incremental_encoding.py),
so both choose alike (up to ties broken apart by float rounding).

The encoder's forward (xrl.nn.encoders, any registered kind) exports as it is through the TorchScript-based
exporter (message passing becomes Gather and ScatterElements with reduction, opset 18): its pieces are
written export-friendly (node degrees as a scatter-add of ones, max pooling as a scatter max from -inf).
Every export is checked: the file is run under onnxruntime on a sample state and must give the
checkpoint's logits.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from xrl.atomic import atomic_write
from xrl.errors import ConfigError, XrlError

FORMAT = "xrl-release-policy/1"
OPSET = 18  # ScatterElements with reduction max (max pooling, attention softmax) needs 18
INPUTS = ("x", "edge_index", "edge_attr", "u", "batch", "cand_attr")
TOLERANCE = 1e-4  # largest |logit difference| between the checkpoint and its export


class ExportError(XrlError):
    """The exported file does not compute what the checkpoint computes."""


class StateScorer(nn.Module):
    """GraphPolicy's logits for one state whose graphs are [G, G_1, ..., G_n] (see the module docstring)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, u: Tensor, batch: Tensor,
                cand_attr: Tensor) -> Tensor:
        policy = self.policy
        emb = policy.encoder(x, edge_index, edge_attr, u, batch)  # [B, H]: the encoder's own forward exports
        h_s = emb[:1].expand_as(emb)  # the state's embedding beside every candidate's
        hints = cand_attr if policy.cfg.use_hints else torch.zeros_like(cand_attr)
        return policy.score(torch.cat([emb, h_s, emb - h_s, hints], dim=1)).squeeze(-1)


def sample_inputs(graph: Any, max_candidates: int | None) -> dict[str, np.ndarray]:
    """The inputs of one real state: `graph`'s first step in the env (candidates capped as the policy's were)."""
    from xrl.env import GraphRewriteEnv
    from xrl.policies.release import state_inputs

    env = GraphRewriteEnv(graph, "analytic", max_candidates=max_candidates, observation="summary")
    return state_inputs(env)


def export_onnx(checkpoint: str | Path, out: str | Path, *, sample_graph: str = "tiny_cnn") -> dict[str, Any]:
    """Write `checkpoint`'s policy to `out` (ONNX) after checking it on `sample_graph`; its metadata and the check."""
    from xrl.rl.checkpoint import load_policy

    out = Path(out)
    if out.suffix != ".onnx":
        raise ConfigError(f"the exported policy must be a .onnx file, not {out}")
    policy, ckpt = load_policy(checkpoint)
    cap = (ckpt.get("config", {}).get("env") or {}).get("max_candidates")
    meta = {"format": FORMAT, "policy_config": json.dumps(policy.cfg.to_dict()), "max_candidates": json.dumps(cap),
            "source": Path(checkpoint).name, "update": str(int(ckpt.get("update", 0)))}
    scorer = StateScorer(policy).eval()
    feed = sample_inputs(sample_graph, cap)
    args = tuple(torch.from_numpy(feed[k]) for k in INPUTS)
    dynamic = {"x": {0: "nodes"}, "edge_index": {1: "edges"}, "edge_attr": {0: "edges"}, "u": {0: "graphs"},
               "batch": {0: "nodes"}, "cand_attr": {0: "graphs"}, "logits": {0: "graphs"}}
    # a temporary of this writer's own (two exports to one file at once must not share one), checked before
    # it replaces `out`
    with atomic_write(out, mkdir=True) as pending:
        tmp = pending.temp
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's and the legacy exporter's notices, not errors
            torch.onnx.export(scorer, args, str(tmp), input_names=list(INPUTS), output_names=["logits"],
                              dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
        _add_metadata(tmp, meta)
        with torch.no_grad():
            expected = scorer(*args).numpy()
        err = _check(tmp, feed, expected)
    return {**meta, "check_graph": sample_graph, "check_candidates": len(expected), "max_logit_error": err}


def _add_metadata(path: Path, meta: dict[str, str]) -> None:
    import onnx

    model = onnx.load(str(path))
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))


def _check(path: Path, feed: dict[str, np.ndarray], expected: np.ndarray) -> float:
    from xrl.policies.release import ReleasePolicy

    got = ReleasePolicy(path).logits(feed)
    err = float(np.abs(got - expected).max()) if got.shape == expected.shape else float("inf")
    if not err <= TOLERANCE or int(got.argmax()) != int(expected.argmax()):
        raise ExportError(f"the exported policy's logits differ from the checkpoint's by {err:.3g} "
                          f"(shape {got.shape} vs {expected.shape}); not written")
    return err

"""The shared part of the deployment families: seeding that looks trained, BatchNorm calibration, export.

Every family module defines torch modules as their libraries write them and a `Member` table; this
module turns a (module, example inputs) pair into an ONNX model with either torch exporter:

- "ts": TorchScript-based `torch.onnx.export(..., dynamo=False)`, opset 17, constant folding on;
- "dynamo": `torch.onnx.export(..., dynamo=True)` (needs onnxscript), opset 18 (its lowest).

Static shapes, batch as given (1 in the benchmark), one self-contained ModelProto (no external data).
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from . import EXPORTER_ALIASES, EXPORTERS

OPSET_TS = 17
OPSET_DYNAMO = 18


@dataclass(frozen=True)
class Spec:
    """One graph input: name, shape (batch first), and how its values are drawn."""

    name: str
    shape: tuple[int, ...]
    kind: str = "normal"  # "normal" | "mask" (int64 ones, trailing eighth zero) | "adapter" (normal * 0.02)
    # | "ids" (int64 token ids below `high`)
    high: int = 0


@dataclass
class Built:
    """A family member's torch module in eval mode (original form) and how to make its limit."""

    module: nn.Module
    inputs: list[Spec]
    outputs: list[str]
    # the merged / re-parameterised network (a new module); None: the member has no limit (the deployment
    # models, hand-written references)
    limit: Callable[[], nn.Module] | None
    limit_kind: str  # "exact" (a re-parameterisation) | "plain" (no exact merge: the limit is the original) | "none"
    extra: dict = field(default_factory=dict)


def exporter_key(name: str) -> str:
    if name not in EXPORTER_ALIASES:
        raise ValueError(f"unknown exporter {name!r}; choose from {', '.join(EXPORTERS)} (or torchscript)")
    return EXPORTER_ALIASES[name]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's global RNG seeded for module construction, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@torch.no_grad()
def look_trained(module: nn.Module, seed: int) -> None:
    """Weights that look trained: non-zero biases, non-unit norm scales and shifts (seeded)."""
    gen = torch.Generator().manual_seed(seed + 7919)
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)) and m.bias is not None:
            m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.05)
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)) and m.weight is not None:
            m.weight.copy_(1.0 + torch.randn(m.weight.shape, generator=gen) * 0.1)
            m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.05)
        elif isinstance(m, nn.MultiheadAttention):
            if m.in_proj_bias is not None:
                m.in_proj_bias.copy_(torch.randn(m.in_proj_bias.shape, generator=gen) * 0.05)
            if m.out_proj.bias is not None:
                m.out_proj.bias.copy_(torch.randn(m.out_proj.bias.shape, generator=gen) * 0.05)
        elif "RMSNorm" in type(m).__name__ and getattr(m, "weight", None) is not None:  # written by hand
            m.weight.copy_(1.0 + torch.randn(m.weight.shape, generator=gen) * 0.1)


@torch.no_grad()
def calibrate_batchnorm(module: nn.Module, shape: tuple[int, ...], seed: int, batches: int = 4) -> None:
    """BatchNorm running statistics from a few seeded batches in train mode (cumulative average), then eval."""
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative moving average over the calibration batches
    module.train()
    gen = torch.Generator().manual_seed(seed + 104729)
    for _ in range(batches):
        module(torch.randn((max(2, shape[0] * 2), *shape[1:]), generator=gen))
    for bn in bns:
        bn.momentum = 0.1
    module.eval()


def feeds(inputs: list[Spec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded input values for a member's graph inputs."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.kind == "mask":
            mask = np.ones(spec.shape, dtype=np.int64)
            seq = spec.shape[-1]
            mask[..., seq - max(1, seq // 8):] = 0  # the last eighth is padding, as in a real batch
            out[spec.name] = mask
        elif spec.kind == "ids":
            out[spec.name] = rng.integers(0, spec.high, size=spec.shape, dtype=np.int64)
        elif spec.kind == "adapter":
            out[spec.name] = (rng.standard_normal(spec.shape) * 0.02).astype(np.float32)
        else:
            out[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    return out


def example_args(inputs: list[Spec], seed: int = 0) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(v) for v in feeds(inputs, seed).values())


def export(module: nn.Module, inputs: list[Spec], outputs: list[str], exporter: str) -> onnx.ModelProto:
    """One static-shape export of `module` (eval mode) as a self-contained ModelProto."""
    exporter = exporter_key(exporter)
    args = example_args(inputs)
    names = [s.name for s in inputs]
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    # nn.MultiheadAttention's fused fast path (aten::_native_multi_head_attention) has no ONNX export
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "ts":
                buf = io.BytesIO()
                torch.onnx.export(module, args, buf, input_names=names, output_names=outputs,
                                  opset_version=OPSET_TS, do_constant_folding=True, dynamo=False)
                return onnx.load_from_string(buf.getvalue())
            program = torch.onnx.export(module, args, input_names=names, output_names=outputs,
                                        opset_version=OPSET_DYNAMO, dynamo=True, verbose=False)
            with tempfile.TemporaryDirectory(prefix="xrl-families-") as tmp:
                path = Path(tmp) / "model.onnx"
                program.save(str(path), external_data=False)
                return onnx.load(str(path))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)

"""Models as people export them from PyTorch: xrl's rules reach the merged ("limit") network.

Each case is a small torch module in its training/adapter form with weights that look trained (non-zero
biases, non-unit BatchNorm scales, running statistics calibrated on seeded batches), and the same network
merged in torch (LoRA's W + s B A; RepVGG's and ACNet's branches re-parameterised into one 3x3 conv). Both are
exported (TorchScript, and dynamo where onnxscript is installed); greedy optimisation of the unmerged export
must write the merged export's op histogram, and verify. The rules that make this possible are in
rewrite_rules/lora.rules and rewrite_rules/reparam.rules.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from xrl.api import optimize  # noqa: E402

HIDDEN, RANK, ALPHA = 32, 4, 8
CH, SIZE = 8, 8
EXPORTERS = ["torchscript"] + (["dynamo"] if importlib.util.find_spec("onnxscript") else [])
NOT_COMPUTE = {"Identity", "Constant"}  # TorchScript writes Identity for shared initialisers


# ----- the modules ----------------------------------------------------------------------------
class LoRALinear(nn.Module):
    """nn.Linear with a PEFT-style LoRA adapter (dropout off): base(x) + lora_B(lora_A(x)) * alpha / r."""

    def __init__(self, d: int = HIDDEN, r: int = RANK, alpha: float = ALPHA) -> None:
        super().__init__()
        self.base_layer = nn.Linear(d, d)
        self.lora_A = nn.Linear(d, r, bias=False)
        self.lora_B = nn.Linear(r, d, bias=False)
        self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling

    def merged(self) -> nn.Module:
        m = nn.Linear(self.base_layer.in_features, self.base_layer.out_features)
        with torch.no_grad():
            m.weight.copy_(self.base_layer.weight + self.scaling * self.lora_B.weight @ self.lora_A.weight)
            m.bias.copy_(self.base_layer.bias)
        return m


class LoRAInputs(nn.Module):
    """A multi-LoRA server's form: the adapters are graph inputs, so nothing may be merged."""

    def __init__(self) -> None:
        super().__init__()
        self.base_layer = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + (x @ a) @ b * (ALPHA / RANK)


def _conv_bn(k: tuple[int, int]) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(CH, CH, k, padding=(k[0] // 2, k[1] // 2), bias=False), nn.BatchNorm2d(CH))


def _fold(branch: nn.Module | None, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(3x3 kernel, bias) of BN(conv(x)) or, with branch None, of BN(x)."""
    if branch is None:
        k = torch.zeros(CH, CH, 3, 3)
        k[range(CH), range(CH), 1, 1] = 1.0
    else:
        w = branch.weight
        kh, kw = w.shape[2:]
        k = F.pad(w, ((3 - kw) // 2, (3 - kw) // 2, (3 - kh) // 2, (3 - kh) // 2))
    f = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return k * f.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * f


class Reparam(nn.Module):
    """A block of parallel branches of one input, summed: RepVGG (3x3 + 1x1 + BN identity, then ReLU) or ACNet
    (3x3 + 1x3 + 3x1), each conv followed by its BatchNorm, in training form."""

    def __init__(self, kernels: list[tuple[int, int]], identity: bool, relu: bool) -> None:
        super().__init__()
        self.branches = nn.ModuleList(_conv_bn(k) for k in kernels)
        self.id_bn = nn.BatchNorm2d(CH) if identity else None
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.branches[0](x)
        for b in self.branches[1:]:
            y = y + b(x)
        if self.id_bn is not None:
            y = y + self.id_bn(x)
        return torch.relu(y) if self.relu else y

    def merged(self) -> nn.Module:
        parts = [_fold(b[0], b[1]) for b in self.branches] + ([_fold(None, self.id_bn)] if self.id_bn else [])
        conv = nn.Conv2d(CH, CH, 3, padding=1)
        with torch.no_grad():
            conv.weight.copy_(sum(k for k, _ in parts))
            conv.bias.copy_(sum(b for _, b in parts))
        return nn.Sequential(conv, nn.ReLU()) if self.relu else conv


def _trained(m: nn.Module, x: torch.Tensor) -> nn.Module:
    """Weights that look trained: a non-zero LoRA B, non-unit BN scales and shifts, BN statistics calibrated by a
    few seeded train-mode batches (shifted and scaled so that mean and variance are far from 0 and 1)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.copy_(0.5 + torch.rand(mod.weight.shape, generator=g))
                mod.bias.copy_(0.2 * torch.randn(mod.bias.shape, generator=g))
            if isinstance(mod, LoRALinear):
                mod.lora_B.weight.copy_(0.1 * torch.randn(mod.lora_B.weight.shape, generator=g))
        if any(isinstance(mod, nn.BatchNorm2d) for mod in m.modules()):
            m.train()
            for _ in range(4):
                m(2.0 * torch.randn((4,) + tuple(x.shape[1:]), generator=g) + 0.5)
    return m.eval()


def _export(m: nn.Module, args: tuple, path: Path, exporter: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            if exporter == "dynamo":
                with io.StringIO() as sink, __import__("contextlib").redirect_stdout(sink):
                    torch.onnx.export(m, args, str(path), dynamo=True, opset_version=18)
            else:
                torch.onnx.export(m, args, str(path), dynamo=False, opset_version=17)
        finally:
            logging.disable(logging.NOTSET)
    return path


def _histogram(path: Path | str) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node if n.op_type not in NOT_COMPUTE)


# name -> (module factory, example input)
CASES = {
    "lora": (lambda: LoRALinear(), (1, 6, HIDDEN)),
    "lora_2d": (lambda: LoRALinear(), (6, HIDDEN)),  # nn.Linear on a 2-D input: the base is a Gemm
    "repvgg": (lambda: Reparam([(3, 3), (1, 1)], identity=True, relu=True), (1, CH, SIZE, SIZE)),
    "acnet": (lambda: Reparam([(3, 3), (1, 3), (3, 1)], identity=False, relu=False), (1, CH, SIZE, SIZE)),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """case -> (the limit's TorchScript export, {exporter: the unmerged export}); the merged torch module is
    checked against the unmerged one first."""
    root = tmp_path_factory.mktemp("real_exports")
    torch.manual_seed(0)
    out = {}
    for name, (make, shape) in CASES.items():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
        m = _trained(make(), x)
        limit = m.merged().eval()
        with torch.no_grad():
            np.testing.assert_allclose(limit(x).numpy(), m(x).numpy(), rtol=1e-4, atol=1e-5)
        limit_path = _export(limit, (x,), root / f"{name}.limit.onnx", "torchscript")
        out[name] = (limit_path, {e: _export(m, (x,), root / f"{name}.{e}.onnx", e) for e in EXPORTERS})
    return out


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(CASES))
def test_greedy_reaches_the_merged_network(exported: dict, name: str, exporter: str, tmp_path: Path) -> None:
    limit, models = exported[name]
    r = optimize(str(models[exporter]), search="greedy", target="ort-cpu", cost="target", prepass=(),
                 output=tmp_path / "out.onnx")
    assert r.verified
    assert _histogram(tmp_path / "out.onnx") == _histogram(limit), r.steps


@pytest.mark.parametrize("name", list(CASES))
def test_default_prepasses_reach_the_merged_network(exported: dict, name: str, tmp_path: Path) -> None:
    # The pre-passes rewrite the forms first (onnxslim turns a 3-D MatMul + bias into Reshape-Gemm-Reshape): the
    # merged network through the same pipeline is what the unmerged one must reach.
    limit, models = exported[name]
    r = optimize(str(models[EXPORTERS[-1]]), search="greedy", target="ort-cpu", cost="target",
                 output=tmp_path / "out.onnx")
    ref = optimize(str(limit), search="greedy", target="ort-cpu", cost="target", output=tmp_path / "limit.onnx")
    assert r.verified and ref.verified
    assert _histogram(tmp_path / "out.onnx") == _histogram(tmp_path / "limit.onnx"), r.steps


def test_adapters_that_are_graph_inputs_are_not_merged(tmp_path: Path) -> None:
    x = torch.randn(1, 6, HIDDEN)
    a, b = torch.randn(HIDDEN, RANK), torch.randn(RANK, HIDDEN)
    path = _export(LoRAInputs().eval(), (x, a, b), tmp_path / "inputs.onnx", "torchscript")
    r = optimize(str(path), search="greedy", target="ort-cpu", cost="target", prepass=(), output=tmp_path / "o.onnx")
    assert r.verified
    assert not [s for s in r.steps if s.startswith(("merge_lowrank", "scale_gemm"))], r.steps
    g = onnx.load(str(tmp_path / "o.onnx")).graph
    adapters = [i.name for i in g.input][1:]
    assert len(adapters) == 2  # still read as inputs, each by a MatMul of the activations
    for a in adapters:
        assert [n.op_type for n in g.node if a in n.input] == ["MatMul"], a

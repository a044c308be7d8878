"""Generated conflict graphs for the research benchmark (issue 32, item 2): seeded graphs whose best rewrite
sequence, under the elementary rules, starts with steps a greedy search never takes.

Each generator draws its sizes and its motifs from `seed` and returns a float32 ONNX model (opset 17), like
the other builders. Four kinds, one benchmark family each (`xrl.search.suite` splits them by family):

- `gen_lora_trap`: token features through projections of one input, some with an unmerged PEFT adapter
  (x W + b + (x A) B s). Two rewrites compete for the shared input: merging the sibling MatMuls into one
  (merge_matmul_2/3, a gain at once) and merging each adapter into its base (fold the scale, reassociate A B:
  more flops, move the bias: neutral, factor: a GEMM fewer). The first closes off the second.
- `gen_sum_trap`: parallel linear layers of one input summed (x W1 + b1) + x W2 (a multi-path block): their
  concatenation (merge_matmul_2, a gain) closes off factoring them into one MatMul, which needs the bias moved
  first (neutral).
- `gen_branch_trap`: RepVGG/ACNet/MobileOne-style branches of one input summed (3x3, 1x1, 1x3, 3x1 convs,
  a BatchNorm identity, an average pool of a 1x1 conv), in a random summation order. Summing them into one
  conv takes enlarging a kernel or writing the identity as a conv (each costs more) and, in a chain, a
  reassociation (neutral); packing sibling convs of different kernels into one (merge_conv_bias_pad_kernel,
  a gain) closes it off.
- `gen_mixed`: a conv stem of branch blocks, pooled to tokens, then LoRA-adapted projections: both at once.

`conflict_graph(kind, seed)` builds one; `KINDS` lists them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .builder import OnnxBuilder

KINDS = ("gen_lora_trap", "gen_sum_trap", "gen_branch_trap", "gen_mixed")


def _adapted_linear(b: OnnxBuilder, x: str, dout: int, rank: int, alpha: float, *, bias: bool, adapter: bool,
                    name: str) -> str:
    """x W (+ b) (+ (x A) B * alpha / rank), as PEFT's unmerged LoRA layer exports on a 3-D input."""
    din = b.shape(x)[-1]
    with b.scope(name):
        y = b.matmul(x, b.weight((din, dout), 1.0 / math.sqrt(din), "weight"))
        if bias:
            y = b.add(y, b.weight((dout,), 0.02, "bias"))
        if adapter:
            low = b.matmul(b.matmul(x, b.weight((din, rank), 1.0 / math.sqrt(din), "lora_A")),
                           b.weight((rank, dout), 0.02, "lora_B"))
            y = b.add(y, b.mul(low, b.scalar(alpha / rank)))
    return y


def _lora_block(b: OnnxBuilder, rng: np.random.Generator, x: str, name: str) -> str:
    """Two or three projections of x (some adapted), combined as attention-free token mixing: gate * value,
    then an (adapted) output projection and a residual."""
    d = b.shape(x)[-1]
    rank = int(rng.choice([4, 8, 16]))
    n = int(rng.integers(2, 4))
    adapted = rng.random(n) < 0.7
    adapted[int(rng.integers(n))] = True  # at least one adapter per block
    bias = bool(rng.random() < 0.7)
    hidden = int(rng.choice([d, 2 * d]))
    with b.scope(name):
        projs = [_adapted_linear(b, x, hidden, rank, 2.0 * rank, bias=bias, adapter=bool(adapted[i]), name=f"p{i}")
                 for i in range(n)]
        h = b.mul(b.relu(projs[0]), projs[1])
        if n == 3:
            h = b.add(h, projs[2])
        out = _adapted_linear(b, h, d, rank, 2.0 * rank, bias=bias, adapter=bool(rng.random() < 0.6), name="out")
        return b.add(out, x)


def _sum_block(b: OnnxBuilder, rng: np.random.Generator, x: str, name: str) -> str:
    """Parallel linear layers of one input summed, the first biased: (x W1 + b1) + x W2 (+ x W3), then Relu."""
    d = b.shape(x)[-1]
    n = int(rng.integers(2, 4))
    with b.scope(name):
        y = _adapted_linear(b, x, d, 4, 8.0, bias=True, adapter=False, name="p0")
        for i in range(1, n):
            y = b.add(y, _adapted_linear(b, x, d, 4, 8.0, bias=False, adapter=bool(rng.random() < 0.3),
                                         name=f"p{i}"))
        return b.relu(y)


def _branch_block(b: OnnxBuilder, rng: np.random.Generator, x: str, name: str) -> str:
    """Branches of one input summed in a random order, then Relu: a 3x3 conv and two to four of 1x1, 1x3, 3x1,
    a BatchNorm identity, an average pool of a 1x1 conv (biased convs: BatchNorms folded, as TorchScript
    exports them)."""
    c = b.shape(x)[1]
    kinds = ["1x1", "1x3", "3x1", "bn", "avg"]
    picked = list(rng.choice(kinds, size=int(rng.integers(2, 5)), replace=False))
    with b.scope(name):
        branches = [b.conv(x, c, 3, bias=True, name="k3x3")]
        for k in picked:
            if k == "bn":
                branches.append(b.bn(x, name="id"))
            elif k == "avg":
                branches.append(b.avgpool(b.conv(x, c, 1, pad=1, bias=True, name="avg1x1"), 3, stride=1))
            else:
                kh, kw = (int(v) for v in k.split("x"))
                branches.append(b.conv(x, c, (kh, kw), bias=True, name=f"k{k}"))
        order = [int(i) for i in rng.permutation(len(branches))]
        y = branches[order[0]]
        for i in order[1:]:
            y = b.add(y, branches[i])
        return b.relu(y)


def conflict_graph(kind: str, seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """One generated conflict graph of `kind` (see the module docstring), its sizes and motifs drawn from `seed`."""
    if kind not in KINDS:
        raise ValueError(f"unknown conflict-graph kind {kind!r}; choose one of {', '.join(KINDS)}")
    rng = np.random.default_rng([KINDS.index(kind), seed])
    b = OnnxBuilder(f"{kind}_{seed}", seed, f"generated conflict graph ({kind}, seed {seed}; graphs/conflicts.py)")
    if kind in ("gen_lora_trap", "gen_sum_trap"):
        d = int(rng.choice([256, 384, 512, 768]))
        s = int(rng.choice([64, 128, 256]))
        x = b.input("x", (batch, s, d))
        block = _lora_block if kind == "gen_lora_trap" else _sum_block
        for i in range(int(rng.integers(1, 3))):
            x = block(b, rng, x, f"block{i}")
        b.output(x, "y")
        return b.model()
    c = int(rng.choice([32, 48, 64]))
    hw = int(rng.choice([16, 28, 32]))
    x = b.input("x", (batch, c, hw, hw))
    for i in range(int(rng.integers(2, 4)) if kind == "gen_branch_trap" else 2):
        x = _branch_block(b, rng, x, f"block{i}")
    if kind == "gen_mixed":
        tokens = b.reshape(x, (batch, c, hw * hw))
        t = b.transpose(tokens, (0, 2, 1))
        t = _adapted_linear(b, t, 4 * c, 8, 16.0, bias=True, adapter=False, name="embed")
        x = _lora_block(b, rng, t, "mix")
    b.output(x, "y")
    return b.model()

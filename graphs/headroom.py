"""Graphs with headroom above greedy search on a CPU (suite "headroom").

On the rest of the built-in suite, under the default target (onnxruntime on the CPU, its own fusions
credited to the baseline), every search finds the same result as greedy. These graphs are built so
that the best rewrite sequence starts with steps greedy never takes: steps the target estimates as
neutral (a BatchNormalization or a scalar folded into the op before it: onnxruntime does that
itself) or as worse (two low-rank weights multiplied into one full-rank weight), after which a merge
or a factoring removes whole kernels.

Two families:

- LoRA-adapted layers (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022,
  Eq. 3: h = W0 x + (alpha / r) B A x), exported unmerged, as PEFT's `LoraLayer.forward` computes it
  (base output + scaling * lora_B(lora_A(x))). Deployment merges the adapter into W0
  (`merge_and_unload`); xrl's rules reach the same graph in three steps: fold the scaling into B
  (neutral), multiply A B into one d x d weight (worse: a full GEMM instead of two thin ones), then
  factor x W0 + x (A B s) = x (W0 + A B s) (one GEMM fewer). The projections are bias-free, as in
  LLaMA (Touvron et al., 2023), where PEFT adapts q_proj and v_proj by default.
- Multi-branch CNN cells at small sizes (SqueezeNet's fire module, Iandola et al., 2016, Fig. 2;
  Inception-A, Szegedy et al., "Rethinking the Inception Architecture", CVPR 2016, Fig. 5, as in
  torchvision's InceptionA), written Conv -> BatchNormalization -> Relu as frameworks export them.
  Sibling convolutions merge into one only after their BatchNormalizations are folded, which the
  target calls neutral. At 8x8 feature maps and 16-32 channels their kernels are far below the GEMM
  saturation of the cpu profile, where the estimate credits merging.

Every builder takes (batch, seed) and returns a float32 ONNX model (opset 17), like the other suites.
"""

from __future__ import annotations

import math

import onnx

from .builder import OnnxBuilder
from .cnns import conv_bn


def lora_linear(b: OnnxBuilder, x: str, dout: int, rank: int, alpha: float, name: str = "proj") -> str:
    """A bias-free linear layer with an unmerged LoRA adapter: x W0 + (x A B) * (alpha / rank).

    A is drawn like W0 and B small but non-zero (a trained adapter; PEFT initialises B to zeros)."""
    din = b.shape(x)[-1]
    with b.scope(name):
        base = b.matmul(x, b.weight((din, dout), 1.0 / math.sqrt(din), "weight"))
        low = b.matmul(b.matmul(x, b.weight((din, rank), 1.0 / math.sqrt(din), "lora_A")),
                       b.weight((rank, dout), 0.02, "lora_B"))
        return b.add(base, b.mul(low, b.scalar(alpha / rank)))


LORA_MLP_DOC = ("LoRA (Hu et al., ICLR 2022, Eq. 3) on both bias-free layers of a Relu MLP: 64 tokens, width 128, "
                "rank 16, alpha 32, two blocks; the adapters unmerged, as PEFT runs them.")


def lora_mlp(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_mlp", seed, LORA_MLP_DOC)
    x = b.input("x", (batch, 64, 128))
    for i in range(2):
        with b.scope(f"block{i}"):
            h = b.relu(lora_linear(b, x, 128, 16, 32.0, name="fc1"))
            x = b.add(x, lora_linear(b, h, 128, 16, 32.0, name="fc2"))
    b.output(x, "y")
    return b.model()


LORA_TINY_DOC = ("LoRA (Hu et al., ICLR 2022) on a small two-layer MLP: 16 tokens, width 64, rank 16, alpha 16: "
                 "a shape where per-kernel overhead dominates on a CPU.")


def lora_tiny(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_tiny", seed, LORA_TINY_DOC)
    x = b.input("x", (batch, 16, 64))
    h = b.relu(lora_linear(b, x, 64, 16, 16.0, name="fc1"))
    b.output(b.relu(lora_linear(b, h, 64, 16, 16.0, name="fc2")), "y")
    return b.model()


LORA_DECODE_DOC = ("One decoding step (a single token, batch-1 GEMVs) through two LoRA-adapted bias-free layers "
                   "(Hu et al., ICLR 2022), width 256, rank 8, alpha 16: what an adapted LLM runs per generated token.")


def lora_decode(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_decode", seed, LORA_DECODE_DOC)
    x = b.input("x", (batch, 256))
    h = b.relu(lora_linear(b, x, 256, 8, 16.0, name="fc1"))
    b.output(lora_linear(b, h, 256, 8, 16.0, name="fc2"), "y")
    return b.model()


def lora_attention_layer(b: OnnxBuilder, x: str, heads: int, rank: int, alpha: float, adapted: tuple[str, ...],
                         name: str = "attn") -> str:
    """LLaMA-style bias-free multi-head self-attention whose projections in `adapted` carry LoRA adapters."""
    bsz, s, d = b.shape(x)
    dh = d // heads

    def proj(x_in: str, p: str) -> str:
        if p in adapted:
            return lora_linear(b, x_in, d, rank, alpha, name=f"{p}_proj")
        return b.linear(x_in, d, bias=False, name=f"{p}_proj")

    with b.scope(name):
        q, k, v = (proj(x, p) for p in ("q", "k", "v"))
        q = b.transpose(b.reshape(q, (bsz, s, heads, dh)), (0, 2, 1, 3))
        k = b.transpose(b.reshape(k, (bsz, s, heads, dh)), (0, 2, 3, 1))
        v = b.transpose(b.reshape(v, (bsz, s, heads, dh)), (0, 2, 1, 3))
        scores = b.div(b.matmul(q, k), b.scalar(math.sqrt(dh)))
        ctx = b.matmul(b.softmax(scores, axis=-1), v)
        ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (bsz, s, d))
        return proj(ctx, "o")


LORA_ATTENTION_DOC = ("LLaMA-style bias-free self-attention (hidden 64, 4 heads, 32 tokens) with LoRA on q_proj and "
                      "v_proj, PEFT's default targets for LLaMA (Hu et al., ICLR 2022, Sec. 7.1: adapting Wq and Wv), "
                      "rank 32, alpha 64; residual and LayerNorm around it, two layers.")


def lora_attention(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_attention", seed, LORA_ATTENTION_DOC)
    x = b.input("x", (batch, 32, 64))
    for i in range(2):
        with b.scope(f"layer{i}"):
            x = b.add(x, lora_attention_layer(b, b.layernorm(x), 4, 32, 64.0, ("q", "v")))
    b.output(x, "y")
    return b.model()


LORA_ATTENTION_ALL_DOC = ("Bias-free self-attention (hidden 96, 4 heads, 32 tokens) with LoRA on all four projections "
                          "Wq, Wk, Wv, Wo (Hu et al., ICLR 2022, Table 5's widest setting), rank 8, alpha 16.")


def lora_attention_all(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_attention_all", seed, LORA_ATTENTION_ALL_DOC)
    x = b.input("x", (batch, 32, 96))
    y = lora_attention_layer(b, b.layernorm(x), 4, 8, 16.0, ("q", "k", "v", "o"))
    b.output(b.add(x, y), "y")
    return b.model()


FIRE_SMALL_DOC = ("Three SqueezeNet fire modules (Iandola et al., 2016, Fig. 2: a 1x1 squeeze conv, then 1x1 and 3x3 "
                  "expand convs concatenated) with BatchNormalization after every conv, on a 32-channel 8x8 map.")


def fire_small(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("fire_small", seed, FIRE_SMALL_DOC)
    x = b.input("x", (batch, 32, 8, 8))
    for i in range(3):
        with b.scope(f"fire{i}"):
            s = conv_bn(b, x, 16, 1, name="squeeze")
            x = b.concat([conv_bn(b, s, 32, 1, name="expand1x1"), conv_bn(b, s, 32, 3, name="expand3x3")])
    b.output(x, "y")
    return b.model()


INCEPTION_A_SMALL_DOC = ("Two Inception-A modules (Szegedy et al., CVPR 2016, Fig. 5; torchvision's InceptionA) at a "
                         "32-channel 8x8 map: three 1x1 convs read the module's input, then 5x5, double 3x3 and "
                         "pool branches; Conv-BN-Relu throughout.")


def inception_a_small(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("inception_a_small", seed, INCEPTION_A_SMALL_DOC)
    x = b.input("x", (batch, 32, 8, 8))
    for i in range(2):
        with b.scope(f"mixed{i}"):
            b1 = conv_bn(b, x, 8, 1, name="branch1x1")
            b5 = conv_bn(b, conv_bn(b, x, 6, 1, name="branch5x5_1"), 8, 5, name="branch5x5_2")
            b3 = conv_bn(b, x, 8, 1, name="branch3x3dbl_1")
            b3 = conv_bn(b, conv_bn(b, b3, 12, 3, name="branch3x3dbl_2"), 12, 3, name="branch3x3dbl_3")
            bp = conv_bn(b, b.avgpool(x, 3, 1, 1), 4, 1, name="branch_pool")
            x = b.concat([b1, b5, b3, bp])
    b.output(x, "y")
    return b.model()


MULTI_LORA_DOC = ("Two LoRA adapters (Hu et al., ICLR 2022) served unmerged on one bias-free layer, their "
                  "outputs added (adapter composition as in LoraHub, Huang et al., 2023): 32 tokens, width 96, "
                  "ranks 8 and 16, one Relu layer.")


def multi_lora(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("multi_lora", seed, MULTI_LORA_DOC)
    x = b.input("x", (batch, 32, 96))
    y = lora_linear(b, x, 96, 8, 16.0, name="task_a")  # the base weight and the first adapter
    with b.scope("task_b"):
        a = b.matmul(x, b.weight((96, 16), 1.0 / math.sqrt(96), "lora_A"))
        low = b.matmul(a, b.weight((16, 96), 0.02, "lora_B"))
        y = b.add(y, b.mul(low, b.scalar(2.0)))
    b.output(b.relu(y), "y")
    return b.model()


LORA_QKV_DOC = ("LoRA (Hu et al., ICLR 2022, Sec. 5.5: GPT-2 with adapted attention weights) on a fused, bias-free "
                "Q/K/V projection (GPT-2's c_attn layout, width 64 to 192), 16 tokens, rank 8, alpha 16, split into "
                "Q, K and V and one attention head.")


def lora_qkv(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_qkv", seed, LORA_QKV_DOC)
    x = b.input("x", (batch, 16, 64))
    q, k, v = b.split(lora_linear(b, x, 192, 8, 16.0, name="c_attn"), [64, 64, 64], axis=-1)
    scores = b.div(b.matmul(q, b.transpose(k, (0, 2, 1))), b.scalar(8.0))
    b.output(b.matmul(b.softmax(scores, axis=-1), v), "y")
    return b.model()


LORA_FFN_DOC = ("LoRA (Hu et al., ICLR 2022) on both bias-free projections of a transformer feed-forward block "
                "(width 64, inner 256, Gelu), 16 tokens, rank 8, alpha 16, with its residual.")


def lora_ffn(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("lora_ffn", seed, LORA_FFN_DOC)
    x = b.input("x", (batch, 16, 64))
    h = b.gelu(lora_linear(b, x, 256, 8, 16.0, name="up"))
    b.output(b.add(x, lora_linear(b, h, 64, 8, 16.0, name="down")), "y")
    return b.model()

"""Transformer benchmark graphs: BERT, ViT, a mini DALL-E decoder and the Transformer-Transducer.

Written as frameworks export them: separate Q/K/V MatMuls reading one normalised input, bias Adds,
Reshape/Transpose into heads, exact GELU from Erf, LayerNormalization, residual Adds. Token
embeddings (a Gather) are outside the graphs: their inputs are the embedded sequences.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import OnnxBuilder

MASKED = -1e4  # additive mask value: exp underflows to exactly 0 after the softmax


def mlp(b: OnnxBuilder, x: str, hidden: int, name: str = "mlp") -> str:
    """Feed-forward block: Linear, GELU, Linear."""
    with b.scope(name):
        h = b.gelu(b.linear(x, hidden, name="fc1"))
        return b.linear(h, b.shape(x)[-1], name="fc2")


def geglu(b: OnnxBuilder, x: str, hidden: int, name: str = "ffn") -> str:
    """Gated feed-forward (GEGLU): two parallel projections of x, gelu(gate) * up, then down."""
    with b.scope(name):
        gate = b.linear(x, hidden, name="gate")
        up = b.linear(x, hidden, name="up")
        return b.linear(b.mul(b.gelu(gate), up), b.shape(x)[-1], name="down")


def post_norm_layer(b: OnnxBuilder, x: str, heads: int, ffn: int) -> str:
    """BERT's layer: LayerNorm after each residual sum."""
    x = b.layernorm(b.add(x, b.attention(x, heads)), name="ln1")
    return b.layernorm(b.add(x, mlp(b, x, ffn)), name="ln2")


def pre_norm_layer(b: OnnxBuilder, x: str, heads: int, ffn: int, mask: str | None = None, gated: bool = False) -> str:
    """GPT/ViT-style layer: LayerNorm before attention and feed-forward, residuals around them."""
    x = b.add(x, b.attention(b.layernorm(x, name="ln1"), heads, mask))
    h = b.layernorm(x, name="ln2")
    return b.add(x, geglu(b, h, ffn) if gated else mlp(b, h, ffn))


def causal_mask(b: OnnxBuilder, seq: int) -> str:
    """An additive (1, 1, seq, seq) constant: 0 on and below the diagonal, MASKED above it."""
    mask = np.triu(np.full((seq, seq), MASKED, np.float32), k=1)
    return b.param(mask[None, None], "causal_mask")


def encoder(b: OnnxBuilder, x: str, layers: int, heads: int, ffn: int, name: str, *, mask: str | None = None,
            gated: bool = False) -> str:
    for i in range(layers):
        with b.scope(f"{name}.{i}"):
            x = pre_norm_layer(b, x, heads, ffn, mask, gated)
    return x


BERT_DOC = ("BERT-large-width encoder as X-RLflow used it: seq 64, hidden 1024, 8 post-norm layers, 16 heads, "
            "FFN 4096. Input: the embedded token sequence (batch, 64, 1024); output: the last hidden states.")


def bert(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    seq, hidden, layers, heads, ffn = 64, 1024, 8, 16, 4096
    b = OnnxBuilder("bert", seed, BERT_DOC)
    x = b.input("embeddings", (batch, seq, hidden))
    for i in range(layers):
        with b.scope(f"layer.{i}"):
            x = post_norm_layer(b, x, heads, ffn)
    b.output(x, "hidden_states")
    return b.model()


VIT_DOC = ("ViT-Base/16 on a 128x128 image: a stride-16 Conv patch embedding gives 64 patch tokens, plus a class "
           "token (65 tokens); hidden 768, 12 pre-norm layers, 12 heads, MLP 3072; classifier on the class token.")


def vit(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    image, patch, hidden, layers, heads, ffn, classes = 128, 16, 768, 12, 12, 3072, 1000
    tokens = (image // patch) ** 2
    b = OnnxBuilder("vit", seed, VIT_DOC)
    x = b.input("image", (batch, 3, image, image))
    x = b.conv(x, hidden, patch, stride=patch, pad=0, bias=True, name="patch_embed")  # (b, 768, 8, 8)
    x = b.transpose(b.reshape(x, (batch, hidden, tokens)), (0, 2, 1))  # (b, 64, 768)
    cls = b.rng.standard_normal((1, 1, hidden), dtype=np.float32) * np.float32(0.02)
    x = b.concat([b.param(np.repeat(cls, batch, axis=0), "cls_token"), x], axis=1)  # (b, 65, 768)
    x = b.add(x, b.weight((1, tokens + 1, hidden), 0.02, "pos_embed"))
    x = b.layernorm(encoder(b, x, layers, heads, ffn, "block"), name="norm")
    x = b.squeeze(b.slice(x, axis=1, start=0, end=1), axis=1)  # the class token: (b, 768)
    b.output(b.gemm(x, classes, name="head"), "logits")
    return b.model()


DALLE_DOC = ("Mini DALL-E decoder: 16 text tokens, hidden 768, 8 causal pre-norm layers, 12 heads, GEGLU "
             "feed-forward 2048, logits over an 8192-entry image-token codebook. Input: embedded tokens.")


def dalle(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    seq, hidden, layers, heads, ffn, vocab = 16, 768, 8, 12, 2048, 8192
    b = OnnxBuilder("dalle", seed, DALLE_DOC)
    x = b.input("tokens", (batch, seq, hidden))
    x = encoder(b, x, layers, heads, ffn, "layer", mask=causal_mask(b, seq), gated=True)
    x = b.layernorm(x, name="norm")
    b.output(b.linear(x, vocab, name="to_logits"), "logits")
    return b.model()


TT_DOC = ("Transformer-Transducer: audio encoder (80 frames of 80 mel features, projected to d 512, 12 pre-norm "
          "layers), label encoder (16 embedded labels, 2 causal layers), 8 heads, FF 2048; joint network projects "
          "both, adds them broadcast to (batch, 80, 16, 512), Tanh, then logits over a 128-token vocabulary.")


def tt(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    frames, mels, labels, d, heads, ffn, vocab = 80, 80, 16, 512, 8, 2048, 128
    b = OnnxBuilder("tt", seed, TT_DOC)
    audio = b.linear(b.input("audio", (batch, frames, mels)), d, name="audio_proj")
    audio = b.layernorm(encoder(b, audio, 12, heads, ffn, "audio"), name="audio_norm")
    label = b.input("labels", (batch, labels, d))
    label = b.layernorm(encoder(b, label, 2, heads, ffn, "label", mask=causal_mask(b, labels)), name="label_norm")
    with b.scope("joint"):
        a = b.unsqueeze(b.linear(audio, d, name="audio"), 2)  # (b, 80, 1, d)
        lab = b.unsqueeze(b.linear(label, d, bias=False, name="label"), 1)  # (b, 1, 16, d)
        logits = b.linear(b.tanh(b.add(a, lab)), vocab, name="out")  # (b, 80, 16, vocab)
    b.output(logits, "logits")
    return b.model()

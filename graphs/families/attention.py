"""Attention as the common torch modules write it, in pre-/post-LN transformer layers with a GELU MLP.

Members:
- attn_mha: `nn.MultiheadAttention` (batch_first, biases, packed in_proj) in a post-LN encoder layer with a
  key-padding mask from an int64 attention_mask (`attention_mask == 0`);
- attn_mha_causal: `nn.MultiheadAttention(bias=False)` in a pre-LN decoder layer with a boolean causal
  `attn_mask` (True where masked) and no biases anywhere in the attention;
- attn_sdpa: hand-written, separate bias-free q/k/v Linears and `F.scaled_dot_product_attention` with a
  boolean mask from the attention_mask input (dynamo writes it with IsNaN/Where), pre-LN;
- attn_packed: timm's ViT `Attention`: one packed biased qkv Linear, reshape/permute/unbind, q scaled
  first, explicit softmax, no mask, pre-LN;
- attn_bert: HF's BertSelfAttention: separate biased q/k/v, explicit softmax, additive mask, post-LN
  (the form onnxruntime's transformers optimizer fuses).

Limit: where q, k and v are separate Linears of one input (attn_sdpa), the same network with them
packed into one Linear (an exact re-parameterisation); where the projection is already packed (attn_mha,
attn_mha_causal, attn_packed) no exact merge exists in torch and the limit is the plain export. attn_bert's
limit is its plain export too: its best exact form is onnxruntime's contrib Attention (com.microsoft), which
packs q/k/v itself and fuses the whole block; the transformers optimizer writes it from the separate
projections only (not from a packed Linear), so the export with separate q/k/v is the form that reaches it
(packing alone measured 1.002-1.005x). Fusions into onnxruntime's contrib ops are not otherwise part of the limit.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .export import Built, Spec, look_trained, seeded

MEMBERS = ("attn_mha", "attn_mha_causal", "attn_sdpa", "attn_packed", "attn_bert")
MASKED = ("attn_mha", "attn_sdpa", "attn_bert")  # take an attention_mask input
SEPARATE = ("attn_sdpa",)  # the limit packs q/k/v


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    ffn: int
    seq: int
    layers: int


DIMS = {
    "small": Dims(hidden=64, heads=4, ffn=256, seq=16, layers=2),
    "full": Dims(hidden=768, heads=12, ffn=3072, seq=128, layers=4),
}


class SeparateAttention(nn.Module):
    """q/k/v as separate Linears (or packed, for the limit); SDPA or explicit softmax."""

    def __init__(self, d: Dims, bias: bool, sdpa: bool, packed: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim, self.hidden = d.heads, d.hidden // d.heads, d.hidden
        self.sdpa, self.packed = sdpa, packed
        if packed:
            self.qkv = nn.Linear(d.hidden, 3 * d.hidden, bias=bias)
        else:
            self.query, self.key, self.value = (nn.Linear(d.hidden, d.hidden, bias=bias) for _ in range(3))
        self.out = nn.Linear(d.hidden, d.hidden, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        if self.packed:
            q, k, v = self.qkv(x).split(self.hidden, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (y.view(b, t, self.heads, self.head_dim).transpose(1, 2) for y in (q, k, v))
        if self.sdpa:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask: bool, True = attend
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.transpose(1, 2).reshape(b, t, c))

    @torch.no_grad()
    def packed_copy(self, d: Dims) -> SeparateAttention:
        bias = self.query.bias is not None
        out = SeparateAttention(d, bias, self.sdpa, packed=True)
        out.qkv.weight.copy_(torch.cat([self.query.weight, self.key.weight, self.value.weight]))
        if bias:
            out.qkv.bias.copy_(torch.cat([self.query.bias, self.key.bias, self.value.bias]))
        out.out.load_state_dict(self.out.state_dict())
        return out


class TimmAttention(nn.Module):
    """timm's vision_transformer.Attention (fused_attn off)."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.num_heads, self.head_dim = d.heads, d.hidden // d.heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(d.hidden, 3 * d.hidden, bias=True)
        self.proj = nn.Linear(d.hidden, d.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = attn @ v
        x = x.transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class MhaAttention(nn.Module):
    def __init__(self, d: Dims, bias: bool) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d.hidden, d.heads, bias=bias, batch_first=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, causal: torch.Tensor | None = None
                ) -> torch.Tensor:
        out, _ = self.mha(x, x, x, key_padding_mask=mask, attn_mask=causal, need_weights=False)
        return out


class Layer(nn.Module):
    def __init__(self, d: Dims, attn: nn.Module, post_ln: bool) -> None:
        super().__init__()
        self.attn, self.post_ln = attn, post_ln
        self.ln1, self.ln2 = nn.LayerNorm(d.hidden), nn.LayerNorm(d.hidden)
        self.fc1, self.fc2 = nn.Linear(d.hidden, d.ffn), nn.Linear(d.ffn, d.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, causal: torch.Tensor | None) -> torch.Tensor:
        call = (lambda y: self.attn(y, mask, causal)) if causal is not None else (lambda y: self.attn(y, mask))
        if self.post_ln:
            x = self.ln1(x + call(x))
            return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))
        x = x + call(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Net(nn.Module):
    def __init__(self, member: str, d: Dims) -> None:
        super().__init__()
        self.member, self.d = member, d

        def attn() -> nn.Module:
            if member == "attn_mha":
                return MhaAttention(d, bias=True)
            if member == "attn_mha_causal":
                return MhaAttention(d, bias=False)
            if member == "attn_packed":
                return TimmAttention(d)
            return SeparateAttention(d, bias=member == "attn_bert", sdpa=member == "attn_sdpa")

        post_ln = member in ("attn_mha", "attn_bert")
        self.layers = nn.ModuleList(Layer(d, attn(), post_ln) for _ in range(d.layers))
        causal = torch.ones(d.seq, d.seq, dtype=torch.bool).triu(1)  # True where masked (nn.MultiheadAttention)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask: torch.Tensor | None = None
        causal = self.causal if self.member == "attn_mha_causal" else None
        if self.member == "attn_mha":
            mask = attention_mask == 0  # key_padding_mask: True where a token is padding
        elif self.member == "attn_sdpa":
            mask = (attention_mask != 0)[:, None, None, :]  # SDPA's boolean mask: True where attended
        elif self.member == "attn_bert":
            mask = (1.0 - attention_mask[:, None, None, :].to(hidden_states.dtype)) * torch.finfo(torch.float32).min
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, causal)
        return hidden_states


def packed(model: Net) -> Net:
    out = copy.deepcopy(model)
    for layer in out.layers:
        layer.attn = layer.attn.packed_copy(model.d)
    return out.eval()


def build(member: str, size: str, seed: int = 0, batch: int = 1) -> Built:
    d = DIMS[size]
    with seeded(seed):
        model = Net(member, d)
    look_trained(model, seed)
    model.eval()
    inputs = [Spec("hidden_states", (batch, d.seq, d.hidden))]
    if member in MASKED:
        inputs.append(Spec("attention_mask", (batch, d.seq), "mask"))
    if member in SEPARATE:
        return Built(model, inputs, ["last_hidden_state"], limit=lambda: packed(model), limit_kind="exact",
                     extra={"limit": "q/k/v packed into one Linear"})
    if member == "attn_bert":
        return Built(model, inputs, ["last_hidden_state"], limit=lambda: model, limit_kind="plain",
                     extra={"limit": "the plain export: onnxruntime's Attention (packed q/k/v, fused) is its best "
                                     "exact form, and the transformers optimizer writes it from separate q/k/v"})
    return Built(model, inputs, ["last_hidden_state"], limit=lambda: model, limit_kind="plain",
                 extra={"limit": "no exact merge in torch: the plain export"})

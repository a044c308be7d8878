"""LLaMA-style decoders as HF transformers' modeling_llama writes them (Touvron et al., 2023).

RMSNorm (`weight * x * rsqrt(mean(x^2) + eps)`, computed in float32), rotary position embeddings,
SwiGLU MLP (`down(silu(gate(x)) * up(x))`), grouped-query attention (`repeat_kv` by expand + reshape),
a causal mask, no biases. Input: hidden states (the embedding lookup is left out); output: the final
RMSNorm's hidden states. Positions are the static 0..seq-1, so exporters fold cos/sin to constants.

Members:
- llama: rotate-half rotary embeddings (HF's `rotate_half`), attention by F.scaled_dot_product_attention
  with is_causal=True (HF's sdpa path);
- llama_eager: interleaved rotary embeddings (GPT-J / GPT-NeoX-style `rotate_every_two`, sin/cos
  repeat-interleaved), explicit attention (matmul, + additive causal mask, softmax in float32, matmul:
  HF's eager path).

Limit: no exact merge removes attention or the rotary embedding, so the limit is the same network
with two exact re-parameterisations: each RMSNorm scale folded into the projections that read it
(W diag(g)), and the parallel projections packed (q/k/v into one Linear, gate/up into one Linear, split
after). Fusions into onnxruntime's contrib ops (SimplifiedLayerNormalization, RotaryEmbedding,
GroupQueryAttention) are not part of this limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .export import Built, Spec, look_trained, seeded

MEMBERS = ("llama", "llama_eager")


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    layers: int


DIMS = {
    "small": Dims(hidden=64, heads=4, kv_heads=2, ffn=176, seq=16, layers=2),
    "full": Dims(hidden=768, heads=12, kv_heads=4, ffn=2048, seq=128, layers=4),
    "xl": Dims(hidden=768, heads=12, kv_heads=4, ffn=2048, seq=128, layers=12),
}


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6, elementwise: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden)) if elementwise else None
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight is None:
            return hidden_states.to(input_dtype)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, seq: int, base: float = 10000.0, interleaved: bool = False) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("position_ids", torch.arange(seq)[None], persistent=False)
        self.interleaved = interleaved

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = self.position_ids
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
        if self.interleaved:
            emb = torch.repeat_interleave(freqs, 2, dim=-1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = rotate_every_two if interleaved else rotate_half
    return (q * cos) + (rot(q) * sin), (k * cos) + (rot(k) * sin)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaAttention(nn.Module):
    def __init__(self, d: Dims, sdpa: bool, interleaved: bool, packed: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = d.heads, d.kv_heads, d.hidden // d.heads
        self.sdpa, self.interleaved, self.packed = sdpa, interleaved, packed
        q_out, kv_out = d.heads * self.head_dim, d.kv_heads * self.head_dim
        if packed:
            self.qkv_proj = nn.Linear(d.hidden, q_out + 2 * kv_out, bias=False)
        else:
            self.q_proj = nn.Linear(d.hidden, q_out, bias=False)
            self.k_proj = nn.Linear(d.hidden, kv_out, bias=False)
            self.v_proj = nn.Linear(d.hidden, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, d.hidden, bias=False)
        causal = torch.full((d.seq, d.seq), torch.finfo(torch.float32).min).triu(1)
        self.register_buffer("causal_mask", causal[None, None], persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        if self.packed:
            q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([q_out, kv_out, kv_out], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, t, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, self.interleaved)
        n_rep = self.heads // self.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        else:
            weights = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
            weights = weights + self.causal_mask[:, :, :t, :t]
            weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, v)
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, d: Dims, packed: bool = False) -> None:
        super().__init__()
        self.packed, self.ffn = packed, d.ffn
        if packed:
            self.gate_up_proj = nn.Linear(d.hidden, 2 * d.ffn, bias=False)
        else:
            self.gate_proj = nn.Linear(d.hidden, d.ffn, bias=False)
            self.up_proj = nn.Linear(d.hidden, d.ffn, bias=False)
        self.down_proj = nn.Linear(d.ffn, d.hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            gate, up = self.gate_up_proj(x).split(self.ffn, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act_fn(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d: Dims, sdpa: bool, interleaved: bool, packed: bool = False) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(d, sdpa, interleaved, packed)
        self.mlp = LlamaMLP(d, packed)
        self.input_layernorm = LlamaRMSNorm(d.hidden, elementwise=not packed)
        self.post_attention_layernorm = LlamaRMSNorm(d.hidden, elementwise=not packed)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        residual = x
        x = self.input_layernorm(x)
        x = self.self_attn(x, cos, sin)
        x = residual + x
        residual = x
        x = self.post_attention_layernorm(x)
        x = self.mlp(x)
        return residual + x


class LlamaModel(nn.Module):
    def __init__(self, d: Dims, sdpa: bool, interleaved: bool, packed: bool = False) -> None:
        super().__init__()
        self.d, self.sdpa, self.interleaved = d, sdpa, interleaved
        self.layers = nn.ModuleList(LlamaDecoderLayer(d, sdpa, interleaved, packed) for _ in range(d.layers))
        self.norm = LlamaRMSNorm(d.hidden)
        self.rotary_emb = LlamaRotaryEmbedding(d.hidden // d.heads, d.seq, interleaved=interleaved)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary_emb(hidden_states)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cos, sin)
        return self.norm(hidden_states)


@torch.no_grad()
def packed_and_folded(model: LlamaModel) -> LlamaModel:
    """The same network with RMSNorm scales folded into the next projections and q/k/v, gate/up packed."""
    out = LlamaModel(model.d, model.sdpa, model.interleaved, packed=True)
    out.norm.load_state_dict(model.norm.state_dict())
    for src, dst in zip(model.layers, out.layers):
        g1 = src.input_layernorm.weight.double()
        g2 = src.post_attention_layernorm.weight.double()
        a = src.self_attn
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).double() * g1
        dst.self_attn.qkv_proj.weight.copy_(qkv.float())
        dst.self_attn.o_proj.weight.copy_(a.o_proj.weight)
        gate_up = torch.cat([src.mlp.gate_proj.weight, src.mlp.up_proj.weight]).double() * g2
        dst.mlp.gate_up_proj.weight.copy_(gate_up.float())
        dst.mlp.down_proj.weight.copy_(src.mlp.down_proj.weight)
    return out.eval()


def build(member: str, size: str, seed: int = 0, batch: int = 1) -> Built:
    d = DIMS[size]
    sdpa = member == "llama"
    with seeded(seed):
        model = LlamaModel(d, sdpa=sdpa, interleaved=not sdpa)
    look_trained(model, seed)
    model.eval()
    return Built(model, [Spec("hidden_states", (batch, d.seq, d.hidden))],
                 ["last_hidden_state"], limit=lambda: packed_and_folded(model), limit_kind="exact",
                 extra={"limit": "RMSNorm scales folded, q/k/v and gate/up packed (no contrib-op fusion)"})

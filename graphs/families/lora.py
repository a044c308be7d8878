"""LoRA-adapted transformer layers, as PEFT applies them (Hu et al., 2022; PEFT's `lora.Linear.forward`).

Each adapted projection is PEFT's `lora.Linear`: `result = base_layer(x)` (the base nn.Linear, bias
kept) then `result = result + lora_B(lora_A(lora_dropout(x))) * scaling`, dropout off (PEFT makes it
nn.Identity), scaling = alpha / r. Adapters on the attention's q/k/v/o projections and both MLP
Linears. lora_B is seeded non-zero (a trained adapter; PEFT initialises it to zero).

Members:
- lora_encoder: BERT-style post-LN encoder layers (HF's BertSelfAttention form: separate biased
  query/key/value Linears, explicit softmax, an additive padding mask from an int64 attention_mask), r 16;
- lora_decoder: OPT-style pre-LN decoder layers (q/k/v/out_proj, fc1/fc2 with ReLU, causal additive mask), r 8;
- lora_vit: a ViT (conv patch embedding, cls token, pre-LN layers, GELU, head), r 32;
- lora_server: the encoder with q and v adapters as graph inputs (a multi-LoRA server's form: the
  adapter is chosen per request, so nothing may be merged), r 8;
- lora_dora: the encoder with PEFT's DoRA (`use_dora=True`, `DoraLinear`) on the same Linears, r 16.

Limit: `merge_and_unload`: W <- W + (B A) * scaling in each adapted Linear, the adapter removed (an
exact re-parameterisation; DoRA's: W <- (m / ||W + s B A||_row) (W + s B A)). lora_server's limit is its
plain export (nothing may be merged).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .export import Built, Spec, look_trained, seeded

TARGETS = ("query", "key", "value", "out", "fc1", "fc2")
SERVER_TARGETS = ("query", "value")


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    ffn: int
    seq: int
    layers: int
    image: int = 32
    patch: int = 8
    classes: int = 10


DIMS = {
    "small": Dims(hidden=64, heads=4, ffn=256, seq=16, layers=2, image=32, patch=8, classes=10),
    "full": Dims(hidden=768, heads=12, ffn=3072, seq=128, layers=4, image=224, patch=16, classes=1000),
    "xl": Dims(hidden=768, heads=12, ffn=3072, seq=128, layers=12, image=224, patch=16, classes=1000),
}
RANKS = {"lora_encoder": 16, "lora_decoder": 8, "lora_vit": 32, "lora_server": 8, "lora_dora": 16}
MEMBERS = tuple(RANKS)


class LoraLinear(nn.Module):
    """PEFT's lora.Linear (one adapter, dropout 0, not merged)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.Identity()
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        return result

    def merged(self) -> nn.Linear:
        """PEFT's merge: base weight += (B @ A) * scaling; returns the base Linear (a copy)."""
        base = copy.deepcopy(self.base_layer)
        with torch.no_grad():
            delta = (self.lora_B.weight.double() @ self.lora_A.weight.double()) * self.scaling
            base.weight.copy_((base.weight.double() + delta).float())
        return base


class DoraLinear(LoraLinear):
    """PEFT's lora.Linear with use_dora=True (peft.tuners.lora.dora.DoraLinearLayer), eval mode, dropout 0.

    forward: result = base_layer(x); lora_weight = lora_B(lora_A(eye(in))).T; weight_norm =
    ||W + scaling * lora_weight|| over dim 1 (per output row), detached; mag_norm_scale = (m /
    weight_norm).view(1, -1); result + (mag_norm_scale - 1) * (result - bias) + mag_norm_scale *
    lora_B(lora_A(x)) * scaling (PEFT's DoraLinearVariant passes the base result when dropout is off).
    """

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__(base, r, alpha)
        self.magnitude = nn.Parameter(torch.ones(base.out_features))

    def weight_norm(self, lora_weight: torch.Tensor) -> torch.Tensor:
        weight = self.base_layer.weight + self.scaling * lora_weight
        return torch.linalg.norm(weight, dim=1).to(weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        x_eye = torch.eye(self.lora_A.weight.shape[1], device=x.device, dtype=self.lora_A.weight.dtype)
        lora_weight = self.lora_B(self.lora_A(x_eye)).T
        weight_norm = self.weight_norm(lora_weight.detach()).detach()
        mag_norm_scale = (self.magnitude / weight_norm).view(1, -1)
        lora_result = self.lora_B(self.lora_A(self.lora_dropout(x)))
        base_result = result
        if self.base_layer.bias is not None:
            base_result = base_result - self.base_layer.bias
        return result + ((mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * self.scaling)

    def merged(self) -> nn.Linear:
        """PEFT's DoRA merge: W <- (m / ||W + s B A||_row)[:, None] * (W + s B A), bias kept."""
        base = copy.deepcopy(self.base_layer)
        with torch.no_grad():
            w = base.weight.double() + (self.lora_B.weight.double() @ self.lora_A.weight.double()) * self.scaling
            scale = self.magnitude.double() / torch.linalg.norm(w, dim=1)
            base.weight.copy_((scale[:, None] * w).float())
        return base


def _proj(module: nn.Module, name: str, x: torch.Tensor, adapters: dict | None, scaling: float) -> torch.Tensor:
    """A projection; with adapters given as tensors (the server form), PEFT's formula on them."""
    y = getattr(module, name)(x)
    if adapters is not None and name in adapters:
        a, b = adapters[name]
        y = y + F.linear(F.linear(x, a), b) * scaling
    return y


class Attention(nn.Module):
    """HF BertSelfAttention + output projection: separate biased q/k/v, explicit softmax, additive mask."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.heads, self.head_dim = d.heads, d.hidden // d.heads
        self.query, self.key, self.value = (nn.Linear(d.hidden, d.hidden) for _ in range(3))
        self.out = nn.Linear(d.hidden, d.hidden)
        self.scaling = 1.0

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, adapters: dict | None = None) -> torch.Tensor:
        b, t, c = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q = heads(_proj(self, "query", x, adapters, self.scaling))
        k = heads(_proj(self, "key", x, adapters, self.scaling))
        v = heads(_proj(self, "value", x, adapters, self.scaling))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, c)
        return _proj(self, "out", ctx, adapters, self.scaling)


class EncoderLayer(nn.Module):
    """Post-LN (BERT): x = LN(x + attn(x)); x = LN(x + fc2(gelu(fc1(x))))."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.attn = Attention(d)
        self.ln1, self.ln2 = nn.LayerNorm(d.hidden, eps=1e-12), nn.LayerNorm(d.hidden, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d.hidden, d.ffn), nn.Linear(d.ffn, d.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, adapters: dict | None = None) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, mask, adapters))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Encoder(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d) for _ in range(d.layers))

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # HF's extended attention mask: 0 where attended, the dtype's minimum where padding
        ext = (1.0 - attention_mask[:, None, None, :].to(hidden_states.dtype)) * torch.finfo(torch.float32).min
        for layer in self.layers:
            hidden_states = layer(hidden_states, ext)
        return hidden_states


class ServerEncoder(Encoder):
    """The encoder with per-request q/v adapters as inputs: (A_q, B_q, A_v, B_v) per layer."""

    def __init__(self, d: Dims, r: int) -> None:
        super().__init__(d)
        for layer in self.layers:
            layer.attn.scaling = 2.0  # alpha / r with alpha = 2 r

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor,  # type: ignore[override]
                *adapters: torch.Tensor) -> torch.Tensor:
        ext = (1.0 - attention_mask[:, None, None, :].to(hidden_states.dtype)) * torch.finfo(torch.float32).min
        for i, layer in enumerate(self.layers):
            a = adapters[4 * i:4 * i + 4]
            hidden_states = layer(hidden_states, ext, {"query": (a[0], a[1]), "value": (a[2], a[3])})
        return hidden_states


class DecoderLayer(nn.Module):
    """OPT-style pre-LN: x = x + out(attn(LN(x))) with a causal mask; x = x + fc2(relu(fc1(LN(x))))."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.attn = Attention(d)
        self.ln1, self.ln2 = nn.LayerNorm(d.hidden), nn.LayerNorm(d.hidden)
        self.fc1, self.fc2 = nn.Linear(d.hidden, d.ffn), nn.Linear(d.ffn, d.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(F.relu(self.fc1(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.layers))
        self.norm = nn.LayerNorm(d.hidden)
        causal = torch.full((d.seq, d.seq), torch.finfo(torch.float32).min).triu(1)
        self.register_buffer("causal_mask", causal[None, None], persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states, self.causal_mask)
        return self.norm(hidden_states)


class VitLayer(nn.Module):
    """Pre-LN ViT layer: x = x + attn(LN(x)); x = x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.attn = Attention(d)
        self.ln1, self.ln2 = nn.LayerNorm(d.hidden, eps=1e-6), nn.LayerNorm(d.hidden, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(d.hidden, d.ffn), nn.Linear(d.ffn, d.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), None)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Vit(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        patches = (d.image // d.patch) ** 2
        self.embed = nn.Conv2d(3, d.hidden, d.patch, stride=d.patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d.hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, patches + 1, d.hidden) * 0.02)
        self.layers = nn.ModuleList(VitLayer(d) for _ in range(d.layers))
        self.norm = nn.LayerNorm(d.hidden, eps=1e-6)
        self.head = nn.Linear(d.hidden, d.classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


def add_lora(model: nn.Module, r: int, seed: int, targets: tuple[str, ...] = TARGETS, dora: bool = False) -> nn.Module:
    """PEFT's inject_adapter: every nn.Linear named in `targets` becomes a LoraLinear (alpha = 2 r).

    dora: a DoraLinear instead, its magnitude ||W + s B A||_row times 1 + 0.1 N(0, 1) (a trained
    magnitude; PEFT initialises it to the norm itself).
    """
    gen = torch.Generator().manual_seed(seed + 31337)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                lora = (DoraLinear if dora else LoraLinear)(child, r, alpha=2.0 * r)
                with torch.no_grad():
                    bound = 1.0 / math.sqrt(child.in_features)  # PEFT: kaiming_uniform(a=sqrt(5)) on A
                    lora.lora_A.weight.copy_((torch.rand(lora.lora_A.weight.shape, generator=gen) * 2 - 1) * bound)
                    lora.lora_B.weight.copy_(torch.randn(lora.lora_B.weight.shape, generator=gen) * 0.05)
                    if isinstance(lora, DoraLinear):
                        norm = lora.weight_norm(lora.lora_B.weight @ lora.lora_A.weight)
                        lora.magnitude.copy_(norm * (1 + 0.1 * torch.randn(norm.shape, generator=gen)))
                setattr(parent, name, lora)
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """A copy of `model` with every LoraLinear merged into its base Linear."""
    merged = copy.deepcopy(model)
    for parent in list(merged.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoraLinear):
                setattr(parent, name, child.merged())
    return merged.eval()


def build(member: str, size: str, seed: int = 0, batch: int = 1) -> Built:
    d = DIMS[size]
    r = RANKS[member]
    with seeded(seed):
        if member == "lora_vit":
            model: nn.Module = Vit(d)
        elif member == "lora_decoder":
            model = Decoder(d)
        elif member == "lora_server":
            model = ServerEncoder(d, r)
        else:
            model = Encoder(d)
    look_trained(model, seed)
    if member != "lora_server":
        add_lora(model, r, seed, dora=member == "lora_dora")
    model.eval()
    if member == "lora_vit":
        inputs = [Spec("pixel_values", (batch, 3, d.image, d.image))]
        outputs = ["logits"]
    elif member == "lora_decoder":
        inputs = [Spec("hidden_states", (batch, d.seq, d.hidden))]
        outputs = ["last_hidden_state"]
    else:
        inputs = [Spec("hidden_states", (batch, d.seq, d.hidden)), Spec("attention_mask", (batch, d.seq), "mask")]
        outputs = ["last_hidden_state"]
    if member == "lora_server":
        for i in range(d.layers):
            for proj in ("q", "v"):
                inputs += [Spec(f"lora_A_{proj}_{i}", (r, d.hidden), "adapter"),
                           Spec(f"lora_B_{proj}_{i}", (d.hidden, r), "adapter")]
        return Built(model, inputs, outputs, limit=lambda: model, limit_kind="plain",
                     extra={"rank": r, "note": "adapters are graph inputs: nothing may be merged"})
    return Built(model, inputs, outputs, limit=lambda: merge_and_unload(model), limit_kind="exact",
                 extra={"rank": r, "targets": TARGETS})

"""The deployment models (issue 10) as a family: real PyTorch models written from torch.nn's own layers
(no torchvision, nothing downloaded), exported with both torch exporters by the families' `export`.

Members: a BERT-style encoder with a padding mask (`bert`), a GPT-style decoder with a causal mask (`gpt`),
a ViT-B/16 (`vit`), a ResNet-50 (`resnet`) and an EfficientNet-B0-style CNN with TF-"same" explicit
padding (`effnet`). `base` is the real size (hidden 768, 12 layers, sequence 128, images 224x224, batch
1); `tiny` is for tests. Weights are seeded; BatchNorm running statistics get seeded non-trivial values
so folding them is not a no-op.

Limit: none. These are the reference models as their libraries write them; no hand-merged form exists,
so `Built.limit` is None and `limit_kind` "none" (the benchmark's table has no limit column for them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .export import Built, Spec, seeded

MEMBERS = ("bert", "gpt", "vit", "resnet", "effnet")
TRANSFORMERS = ("bert", "gpt", "vit")
SIZES = ("tiny", "base")
LIMIT_KIND = "none"


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    seq: int
    image: int
    vocab: int
    patch: int
    resnet_width: int  # channels of ResNet's stem; 64 is ResNet-50
    resnet_blocks: tuple[int, ...]
    effnet_scale: float  # channel multiplier of EfficientNet-B0's stages


DIMS = {
    "tiny": Dims(hidden=64, layers=2, heads=4, seq=16, image=32, vocab=1000, patch=16,
                 resnet_width=8, resnet_blocks=(1, 1, 1, 1), effnet_scale=0.25),
    "base": Dims(hidden=768, layers=12, heads=12, seq=128, image=224, vocab=30522, patch=16,
                 resnet_width=64, resnet_blocks=(3, 4, 6, 3), effnet_scale=1.0),
}


# --------------------------------------------------------------------------- transformers


class Bert(nn.Module):
    """Post-LN BERT encoder: token + position embeddings, LayerNorm, nn.TransformerEncoderLayer with GELU."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)
        self.pos = nn.Embedding(d.seq, d.hidden)
        self.norm = nn.LayerNorm(d.hidden, eps=1e-12)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d.hidden, d.heads, 4 * d.hidden, dropout=0.0, activation="gelu",
                                       batch_first=True, layer_norm_eps=1e-12)
            for _ in range(d.layers))
        self.register_buffer("positions", torch.arange(d.seq).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.tok(input_ids) + self.pos(self.positions))
        padding = attention_mask == 0  # True where a token is padding, as nn.MultiheadAttention wants it
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return x


class CausalSelfAttention(nn.Module):
    """GPT-2's attention: one packed QKV projection, a causal mask, scaled dot product written out."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.heads, self.head_dim = d.heads, d.hidden // d.heads
        self.qkv = nn.Linear(d.hidden, 3 * d.hidden)
        self.proj = nn.Linear(d.hidden, d.hidden)
        self.register_buffer("causal", torch.tril(torch.ones(d.seq, d.seq, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, self.head_dim).transpose(1, 2) for y in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class GptBlock(nn.Module):
    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d.hidden), nn.LayerNorm(d.hidden)
        self.attn = CausalSelfAttention(d)
        self.mlp = nn.Sequential(nn.Linear(d.hidden, 4 * d.hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d.hidden, d.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """Pre-LN GPT-2-style decoder; returns the final hidden states (the LM head is a plain MatMul)."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.tok = nn.Embedding(d.vocab, d.hidden)
        self.pos = nn.Embedding(d.seq, d.hidden)
        self.blocks = nn.ModuleList(GptBlock(d) for _ in range(d.layers))
        self.norm = nn.LayerNorm(d.hidden)
        self.register_buffer("positions", torch.arange(d.seq).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Vit(nn.Module):
    """ViT-B/16: a 16x16 stride-16 conv patch embedding, a cls token, pre-LN encoder blocks, a linear head."""

    def __init__(self, d: Dims, classes: int = 1000) -> None:
        super().__init__()
        patches = (d.image // d.patch) ** 2
        self.embed = nn.Conv2d(3, d.hidden, d.patch, stride=d.patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d.hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, patches + 1, d.hidden) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d.hidden, d.heads, 4 * d.hidden, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True, layer_norm_eps=1e-6)
            for _ in range(d.layers))
        self.norm = nn.LayerNorm(d.hidden, eps=1e-6)
        self.head = nn.Linear(d.hidden, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


# --------------------------------------------------------------------------- CNNs


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-50 (torchvision's layout: stride on the 3x3 conv, v1.5)."""

    def __init__(self, d: Dims, classes: int = 1000) -> None:
        super().__init__()
        w = d.resnet_width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], w
        for i, n in enumerate(d.resnet_blocks):
            width = w * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(pixel_values))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _same_pad(kernel: int, stride: int) -> nn.ZeroPad2d:
    """TF "SAME" padding as the EfficientNet ports write it: explicit, asymmetric when stride 2 (even inputs)."""
    total = max(kernel - stride, 0)
    lo = total // 2
    return nn.ZeroPad2d((lo, total - lo, lo, total - lo))


class ConvBnAct(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        layers: list[nn.Module] = []
        if kernel > 1:
            layers.append(_same_pad(kernel, stride))
        layers += [nn.Conv2d(cin, cout, kernel, stride, 0, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.SiLU())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = ConvBnAct(cin, mid, 1) if expand != 1 else nn.Identity()
        self.depthwise = ConvBnAct(mid, mid, kernel, stride, groups=mid)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = ConvBnAct(mid, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


# EfficientNet-B0: (expand ratio, channels, repeats, stride, kernel)
B0_STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
             (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))


class EfficientNet(nn.Module):
    """EfficientNet-B0-style: MBConv with depthwise convs, SiLU, squeeze-excite, explicit ZeroPad2d padding."""

    def __init__(self, d: Dims, classes: int = 1000) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return max(8, int(round(c * d.effnet_scale / 8)) * 8)

        stages = B0_STAGES if d.effnet_scale >= 1.0 else tuple((e, c, 1, s, k) for e, c, _, s, k in B0_STAGES)
        self.stem = ConvBnAct(3, ch(32), 3, 2)
        blocks, cin = [], ch(32)
        for expand, c, repeats, stride, kernel in stages:
            for j in range(repeats):
                blocks.append(MBConv(cin, ch(c), expand, kernel, stride if j == 0 else 1))
                cin = ch(c)
        self.blocks = nn.Sequential(*blocks)
        self.head = ConvBnAct(cin, ch(1280), 1)
        self.fc = nn.Linear(ch(1280), classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(pixel_values)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- building


def _seed_batchnorm(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial running statistics and affine terms, so a BatchNorm fold changes real numbers."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(1.0 + torch.randn(n, generator=gen) * 0.1)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)


def network(member: str, size: str = "base", seed: int = 0) -> nn.Module:
    """The torch module, seeded, in eval mode."""
    d = DIMS[size]
    with seeded(seed):
        model = {"bert": Bert, "gpt": Gpt, "vit": Vit, "resnet": ResNet, "effnet": EfficientNet}[member](d)
    with torch.no_grad():
        _seed_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()


def inputs(member: str, size: str, batch: int = 1) -> list[Spec]:
    """Token ids within the vocabulary and a mask with trailing padding, or an image."""
    d = DIMS[size]
    if member == "bert":
        return [Spec("input_ids", (batch, d.seq), "ids", high=d.vocab), Spec("attention_mask", (batch, d.seq), "mask")]
    if member == "gpt":
        return [Spec("input_ids", (batch, d.seq), "ids", high=d.vocab)]
    return [Spec("pixel_values", (batch, 3, d.image, d.image))]


def build(member: str, size: str, seed: int = 0, batch: int = 1) -> Built:
    outputs = ["last_hidden_state"] if member in ("bert", "gpt") else ["logits"]
    return Built(network(member, size, seed), inputs(member, size, batch), outputs, limit=None,
                 limit_kind=LIMIT_KIND, extra={"limit": "none: a reference model, no hand-merged form"})


def torch_outputs(member: str, size: str, seed: int = 0, input_seed: int = 0) -> list[np.ndarray]:
    """The reference outputs of the torch module on the family's seeded inputs (`input_seed`)."""
    from .export import feeds

    built = build(member, size, seed)
    with torch.no_grad():
        out = built.module(*(torch.from_numpy(v) for v in feeds(built.inputs, input_seed).values()))
    return [out.numpy()]

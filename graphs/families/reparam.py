"""Structural re-parameterisation CNNs in their training-time form, and their fused (deploy) form.

Blocks as their papers' reference code writes them, Conv2d(bias=False) + BatchNorm2d per branch:
- repvgg: RepVGG (Ding et al., CVPR 2021): 3x3 conv+BN, 1x1 conv+BN, identity BN (stride 1, cin == cout),
  summed, ReLU;
- acnet: ACNet's ACBlock (Ding et al., ICCV 2019): 3x3, 1x3 and 3x1 conv+BN, summed, ReLU;
- dbb: Diverse Branch Block (Ding et al., CVPR 2021): 3x3 conv+BN; 1x1 conv+BN; 1x1 conv -> BN-and-pad ->
  3x3 avg pool -> BN; 1x1 conv (identity-based when square) -> BN-and-pad -> 3x3 conv -> BN; summed, ReLU
  (DBB's BNAndPadLayer pads with the value BN gives zero, written as its slice assignments);
- mobileone: MobileOne (Vasu et al., CVPR 2023): a depthwise block (k 3x3 dw conv+BN branches, a 1x1 dw
  conv+BN scale branch, identity BN) then a pointwise block (k 1x1 conv+BN branches, identity BN), ReLU each.

Backbone: RepVGG-A0's layout (stem, four stages, the first block of each stride 2, global average
pool, Linear) at 224x224 for "full" (widths 48/48/96/192/1280, blocks 1/2/4/14/1), a 32x32 miniature
for "small". BatchNorm statistics are calibrated on seeded batches in train mode, then eval.

Limit: every block fused into one conv (+ReLU) with the papers' own algebra (BN folding, kernel padding,
1x1-then-kxk composition, average pooling as a conv): an exact re-parameterisation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .export import Built, Spec, calibrate_batchnorm, look_trained, seeded

MEMBERS = ("repvgg", "acnet", "dbb", "mobileone")


@dataclass(frozen=True)
class Dims:
    image: int
    widths: tuple[int, ...]  # stem, stage 1..4
    blocks: tuple[int, ...]  # stage 1..4
    classes: int
    branches: int  # MobileOne's k


DIMS = {
    "small": Dims(image=32, widths=(8, 8, 16, 16, 32), blocks=(1, 2, 2, 1), classes=10, branches=2),
    "full": Dims(image=224, widths=(48, 48, 96, 192, 1280), blocks=(2, 4, 14, 1), classes=1000, branches=4),
    "xl": Dims(image=224, widths=(64, 64, 128, 256, 1280), blocks=(4, 6, 16, 1), classes=1000, branches=4),
}


def conv_bn(cin: int, cout: int, kernel: int | tuple[int, int], stride: int, padding: int | tuple[int, int],
            groups: int = 1) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("conv", nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False))
    seq.add_module("bn", nn.BatchNorm2d(cout))
    return seq


def fuse_bn(kernel: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel, bias) of conv followed by BN in eval mode, in float64."""
    std = (bn.running_var.double() + bn.eps).sqrt()
    t = bn.weight.double() / std
    return kernel.double() * t.reshape(-1, 1, 1, 1), bn.bias.double() - bn.running_mean.double() * t


def identity_kernel(channels: int, groups: int, k: int = 3) -> torch.Tensor:
    per = channels // groups
    ker = torch.zeros(channels, per, k, k, dtype=torch.float64)
    for i in range(channels):
        ker[i, i % per, k // 2, k // 2] = 1.0
    return ker


def pad_to(kernel: torch.Tensor, k: int = 3) -> torch.Tensor:
    """A kh x kw kernel centred in a k x k one."""
    kh, kw = kernel.shape[-2:]
    ph, pw = (k - kh) // 2, (k - kw) // 2
    return F.pad(kernel, [pw, k - kw - pw, ph, k - kh - ph])


def fused_conv(cin: int, cout: int, stride: int, kernel: torch.Tensor, bias: torch.Tensor,
               groups: int = 1) -> nn.Conv2d:
    k = kernel.shape[-1]
    conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=True)
    with torch.no_grad():
        conv.weight.copy_(kernel.float())
        conv.bias.copy_(bias.float())
    return conv


# --------------------------------------------------------------------------- blocks


class RepVGGBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.cin, self.cout, self.stride = cin, cout, stride
        self.rbr_dense = conv_bn(cin, cout, 3, stride, 1)
        self.rbr_1x1 = conv_bn(cin, cout, 1, stride, 0)
        self.rbr_identity = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.nonlinearity = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        id_out = 0 if self.rbr_identity is None else self.rbr_identity(x)
        return self.nonlinearity(self.rbr_dense(x) + self.rbr_1x1(x) + id_out)

    def reparam(self) -> nn.Module:
        k3, b3 = fuse_bn(self.rbr_dense.conv.weight, self.rbr_dense.bn)
        k1, b1 = fuse_bn(self.rbr_1x1.conv.weight, self.rbr_1x1.bn)
        kernel, bias = k3 + pad_to(k1), b3 + b1
        if self.rbr_identity is not None:
            ki, bi = fuse_bn(identity_kernel(self.cin, 1), self.rbr_identity)
            kernel, bias = kernel + ki, bias + bi
        return nn.Sequential(fused_conv(self.cin, self.cout, self.stride, kernel, bias), nn.ReLU())


class ACBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.cin, self.cout, self.stride = cin, cout, stride
        self.square = conv_bn(cin, cout, (3, 3), stride, (1, 1))
        self.ver = conv_bn(cin, cout, (3, 1), stride, (1, 0))
        self.hor = conv_bn(cin, cout, (1, 3), stride, (0, 1))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.square(x) + self.ver(x) + self.hor(x))

    def reparam(self) -> nn.Module:
        kernel, bias = fuse_bn(self.square.conv.weight, self.square.bn)
        for branch in (self.ver, self.hor):
            k, b = fuse_bn(branch.conv.weight, branch.bn)
            kernel, bias = kernel + pad_to(k), bias + b
        return nn.Sequential(fused_conv(self.cin, self.cout, self.stride, kernel, bias), nn.ReLU())


class BNAndPadLayer(nn.Module):
    """DBB's BN followed by padding with the value BN maps zero to (so a later conv sees a zero-padded input)."""

    def __init__(self, pad_pixels: int, num_features: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)
        self.pad_pixels = pad_pixels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.bn(x)
        if self.pad_pixels > 0:
            if self.bn.affine:
                pad_values = self.bn.bias.detach() - self.bn.running_mean * self.bn.weight.detach() / torch.sqrt(
                    self.bn.running_var + self.bn.eps)
            else:
                pad_values = -self.bn.running_mean / torch.sqrt(self.bn.running_var + self.bn.eps)
            output = F.pad(output, [self.pad_pixels] * 4)
            pad_values = pad_values.view(1, -1, 1, 1)
            output[:, :, 0:self.pad_pixels, :] = pad_values
            output[:, :, -self.pad_pixels:, :] = pad_values
            output[:, :, :, 0:self.pad_pixels] = pad_values
            output[:, :, :, -self.pad_pixels:] = pad_values
        return output


class IdentityBasedConv1x1(nn.Conv2d):
    """DBB's 1x1 conv initialised as (and parameterised around) the identity."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, channels, 1, 1, 0, bias=False)
        ident = torch.zeros(channels, channels, 1, 1)
        for i in range(channels):
            ident[i, i, 0, 0] = 1
        self.register_buffer("id_tensor", ident)
        nn.init.normal_(self.weight, 0.0, 0.1)

    def get_actual_kernel(self) -> torch.Tensor:
        return self.weight + self.id_tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.get_actual_kernel(), None, stride=1, padding=0)


def trans_1x1_kxk(k1: torch.Tensor, b1: torch.Tensor, k2: torch.Tensor, b2: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """DBB's transIII: a 1x1 conv (k1, b1) then a kxk conv (k2, b2) as one kxk conv (groups 1)."""
    k = F.conv2d(k2, k1.permute(1, 0, 2, 3))
    b_hat = (k2 * b1.reshape(1, -1, 1, 1)).sum((1, 2, 3))
    return k, b_hat + b2


class DiverseBranchBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.cin, self.cout, self.stride = cin, cout, stride
        self.dbb_origin = conv_bn(cin, cout, 3, stride, 1)
        self.dbb_1x1 = conv_bn(cin, cout, 1, stride, 0)
        self.dbb_avg = nn.Sequential()
        self.dbb_avg.add_module("conv", nn.Conv2d(cin, cout, 1, 1, 0, bias=False))
        self.dbb_avg.add_module("bn", BNAndPadLayer(1, cout))
        self.dbb_avg.add_module("avg", nn.AvgPool2d(3, stride, 0))
        self.dbb_avg.add_module("avgbn", nn.BatchNorm2d(cout))
        internal = cin  # DBB's internal_channels_1x1_3x3 for groups 1
        self.dbb_1x1_kxk = nn.Sequential()
        self.dbb_1x1_kxk.add_module("idconv1", IdentityBasedConv1x1(cin) if internal == cin
                                    else nn.Conv2d(cin, internal, 1, bias=False))
        self.dbb_1x1_kxk.add_module("bn1", BNAndPadLayer(1, internal))
        self.dbb_1x1_kxk.add_module("conv2", nn.Conv2d(internal, cout, 3, stride, 0, bias=False))
        self.dbb_1x1_kxk.add_module("bn2", nn.BatchNorm2d(cout))
        self.nonlinear = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dbb_origin(x)
        out = out + self.dbb_1x1(x)
        out = out + self.dbb_avg(x)
        out = out + self.dbb_1x1_kxk(x)
        return self.nonlinear(out)

    def reparam(self) -> nn.Module:
        k_origin, b_origin = fuse_bn(self.dbb_origin.conv.weight, self.dbb_origin.bn)
        k_1x1, b_1x1 = fuse_bn(self.dbb_1x1.conv.weight, self.dbb_1x1.bn)
        k1, b1 = fuse_bn(self.dbb_1x1_kxk.idconv1.get_actual_kernel().detach(), self.dbb_1x1_kxk.bn1.bn)
        k2, b2 = fuse_bn(self.dbb_1x1_kxk.conv2.weight, self.dbb_1x1_kxk.bn2)
        k_1x1_kxk, b_1x1_kxk = trans_1x1_kxk(k1, b1, k2, b2)
        ka, ba = fuse_bn(self.dbb_avg.conv.weight, self.dbb_avg.bn.bn)
        avg = torch.zeros(self.cout, self.cout, 3, 3, dtype=torch.float64)
        for i in range(self.cout):
            avg[i, i] = 1.0 / 9
        k2a, b2a = fuse_bn(avg, self.dbb_avg.avgbn)
        k_avg, b_avg = trans_1x1_kxk(ka, ba, k2a, b2a)
        kernel = k_origin + pad_to(k_1x1) + k_1x1_kxk + k_avg
        bias = b_origin + b_1x1 + b_1x1_kxk + b_avg
        return nn.Sequential(fused_conv(self.cin, self.cout, self.stride, kernel, bias), nn.ReLU())


class MobileOneBlock(nn.Module):
    """One MobileOne block (depthwise when groups == channels, pointwise when kernel 1), training form."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int, branches: int) -> None:
        super().__init__()
        self.cin, self.cout, self.kernel, self.stride, self.groups = cin, cout, kernel, stride, groups
        self.rbr_skip = nn.BatchNorm2d(cin) if cout == cin and stride == 1 else None
        self.rbr_conv = nn.ModuleList(conv_bn(cin, cout, kernel, stride, kernel // 2, groups)
                                      for _ in range(branches))
        self.rbr_scale = conv_bn(cin, cout, 1, stride, 0, groups) if kernel > 1 else None
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity_out = 0 if self.rbr_skip is None else self.rbr_skip(x)
        scale_out = 0 if self.rbr_scale is None else self.rbr_scale(x)
        out = scale_out + identity_out
        for conv in self.rbr_conv:
            out = out + conv(x)
        return self.activation(out)

    def reparam(self) -> nn.Module:
        kernel = torch.zeros(self.cout, self.cin // self.groups, self.kernel, self.kernel, dtype=torch.float64)
        bias = torch.zeros(self.cout, dtype=torch.float64)
        for conv in self.rbr_conv:
            k, b = fuse_bn(conv.conv.weight, conv.bn)
            kernel, bias = kernel + k, bias + b
        if self.rbr_scale is not None:
            k, b = fuse_bn(self.rbr_scale.conv.weight, self.rbr_scale.bn)
            kernel, bias = kernel + pad_to(k, self.kernel), bias + b
        if self.rbr_skip is not None:
            k, b = fuse_bn(identity_kernel(self.cin, self.groups, self.kernel), self.rbr_skip)
            kernel, bias = kernel + k, bias + b
        return nn.Sequential(fused_conv(self.cin, self.cout, self.stride, kernel, bias, self.groups), nn.ReLU())


class MobileOneUnit(nn.Sequential):
    """MobileOne's unit: a depthwise 3x3 block then a pointwise 1x1 block."""

    def __init__(self, cin: int, cout: int, stride: int, branches: int) -> None:
        super().__init__(MobileOneBlock(cin, cin, 3, stride, cin, branches),
                         MobileOneBlock(cin, cout, 1, 1, 1, branches))


# --------------------------------------------------------------------------- backbone


class Backbone(nn.Module):
    def __init__(self, kind: str, d: Dims) -> None:
        super().__init__()
        self.kind, self.branches = kind, d.branches
        stem, *stages = d.widths
        self.stage0 = self._block(3, stem, 2, first=True)
        blocks, cin = [], stem
        for width, n in zip(stages, d.blocks):
            for j in range(n):
                blocks.append(self._block(cin, width, 2 if j == 0 else 1))
                cin = width
        self.stages = nn.Sequential(*blocks)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(cin, d.classes)

    def _block(self, cin: int, cout: int, stride: int, first: bool = False) -> nn.Module:
        if self.kind == "repvgg":
            return RepVGGBlock(cin, cout, stride)
        if self.kind == "acnet":
            return ACBlock(cin, cout, stride)
        if self.kind == "dbb":
            return DiverseBranchBlock(cin, cout, stride)
        if first:  # MobileOne's stem is one 3x3 block, not depthwise
            return MobileOneBlock(cin, cout, 3, stride, 1, self.branches)
        return MobileOneUnit(cin, cout, stride, self.branches)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stage0(pixel_values))
        return self.linear(torch.flatten(self.gap(x), 1))


def reparameterize(model: nn.Module) -> nn.Module:
    """A copy of `model` with every multi-branch block replaced by its fused conv + ReLU."""
    fused = copy.deepcopy(model)
    with torch.no_grad():
        for parent in list(fused.modules()):
            for name, child in list(parent.named_children()):
                if hasattr(child, "reparam") and not isinstance(child, nn.Sequential):
                    setattr(parent, name, child.reparam())
    return fused.eval()


def build(member: str, size: str, seed: int = 0, batch: int = 1) -> Built:
    d = DIMS[size]
    with seeded(seed):
        model = Backbone(member, d)
    look_trained(model, seed)
    shape = (batch, 3, d.image, d.image)
    calibrate_batchnorm(model, shape, seed)
    return Built(model, [Spec("pixel_values", shape)], ["logits"], limit=lambda: reparameterize(model),
                 limit_kind="exact", extra={"blocks": sum(d.blocks) + 1})

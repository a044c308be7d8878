"""Convolutional benchmark graphs: Inception-v3, ResNet-50, ResNeXt-50, SqueezeNet 1.1, VGG-19, NASNet-A.

Topologies follow torchvision (NASNet-A: the cells of Zoph et al., 2018, concatenated as in
TASO). Convolutions are exported unfused, Conv -> BatchNormalization -> Relu, as a framework
writes them: fusing them is the optimiser's job. SqueezeNet and VGG-19 have no
BatchNormalization (Conv with bias -> Relu), as in their papers.
"""

from __future__ import annotations

import onnx

from .builder import IntPair, OnnxBuilder


def conv_bn(b: OnnxBuilder, x: str, cout: int, k: IntPair, stride: IntPair = 1, pad: IntPair | None = None,
            group: int = 1, relu: bool = True, eps: float = 1e-5, name: str = "conv") -> str:
    """Conv (no bias) -> BatchNormalization (-> Relu)."""
    with b.scope(name):
        y = b.bn(b.conv(x, cout, k, stride, pad, group), eps)
        return b.relu(y) if relu else y


def classifier(b: OnnxBuilder, x: str, classes: int = 1000) -> None:
    """Global average pool, flatten, fully connected: the ImageNet head."""
    b.output(b.gemm(b.flatten(b.global_avgpool(x)), classes), "logits")


# ----- ResNet-50 and ResNeXt-50 ----------------------------------------------------------------
def bottleneck(b: OnnxBuilder, x: str, planes: int, stride: int, groups: int, base_width: int) -> str:
    """torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv)."""
    width = planes * base_width // 64 * groups
    out = planes * 4
    y = conv_bn(b, x, width, 1, name="conv1")
    y = conv_bn(b, y, width, 3, stride, group=groups, name="conv2")
    y = conv_bn(b, y, out, 1, relu=False, name="conv3")
    if stride != 1 or b.shape(x)[1] != out:
        x = conv_bn(b, x, out, 1, stride, relu=False, name="downsample")
    return b.relu(b.add(y, x))


def _resnet(name: str, doc: str, batch: int, seed: int, groups: int, base_width: int) -> onnx.ModelProto:
    b = OnnxBuilder(name, seed, doc)
    x = b.input("image", (batch, 3, 224, 224))
    x = b.maxpool(conv_bn(b, x, 64, 7, 2, 3, name="conv1"), 3, 2, 1)
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True), start=1):
        for i in range(blocks):
            with b.scope(f"layer{stage}.{i}"):
                x = bottleneck(b, x, planes, 2 if i == 0 and stage > 1 else 1, groups, base_width)
    classifier(b, x)
    return b.model()


RESNET50_DOC = "ResNet-50 (torchvision, v1.5), 224x224 input, 1000 classes."
RESNEXT50_DOC = "ResNeXt-50 32x4d (torchvision), 224x224 input: grouped 3x3 convs with group=32, 1000 classes."


def resnet50(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet50", RESNET50_DOC, batch, seed, groups=1, base_width=64)


def resnext50(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnext50", RESNEXT50_DOC, batch, seed, groups=32, base_width=4)


# ----- Inception-v3 ----------------------------------------------------------------------------
def _basic(b: OnnxBuilder, x: str, cout: int, k: IntPair, stride: int = 1, pad: IntPair = 0,
           name: str = "conv") -> str:
    """torchvision's BasicConv2d: Conv -> BN (eps 1e-3) -> Relu, padding 0 unless given."""
    return conv_bn(b, x, cout, k, stride, pad, eps=1e-3, name=name)


def _pool_branch(b: OnnxBuilder, x: str, cout: int) -> str:
    return _basic(b, b.avgpool(x, 3, 1, 1), cout, 1, name="branch_pool")


def inception_a(b: OnnxBuilder, x: str, pool_features: int) -> str:
    b1 = _basic(b, x, 64, 1, name="branch1x1")
    b5 = _basic(b, _basic(b, x, 48, 1, name="branch5x5_1"), 64, 5, pad=2, name="branch5x5_2")
    b3 = _basic(b, x, 64, 1, name="branch3x3dbl_1")
    b3 = _basic(b, b3, 96, 3, pad=1, name="branch3x3dbl_2")
    b3 = _basic(b, b3, 96, 3, pad=1, name="branch3x3dbl_3")
    return b.concat([b1, b5, b3, _pool_branch(b, x, pool_features)])


def inception_b(b: OnnxBuilder, x: str) -> str:
    b3 = _basic(b, x, 384, 3, stride=2, name="branch3x3")
    bd = _basic(b, x, 64, 1, name="branch3x3dbl_1")
    bd = _basic(b, bd, 96, 3, pad=1, name="branch3x3dbl_2")
    bd = _basic(b, bd, 96, 3, stride=2, name="branch3x3dbl_3")
    return b.concat([b3, bd, b.maxpool(x, 3, 2)])


def inception_c(b: OnnxBuilder, x: str, c7: int) -> str:
    """The 17x17 block: 7x7 convolutions factorised into 1x7 and 7x1."""
    b1 = _basic(b, x, 192, 1, name="branch1x1")
    b7 = _basic(b, x, c7, 1, name="branch7x7_1")
    b7 = _basic(b, b7, c7, (1, 7), pad=(0, 3), name="branch7x7_2")
    b7 = _basic(b, b7, 192, (7, 1), pad=(3, 0), name="branch7x7_3")
    bd = _basic(b, x, c7, 1, name="branch7x7dbl_1")
    bd = _basic(b, bd, c7, (7, 1), pad=(3, 0), name="branch7x7dbl_2")
    bd = _basic(b, bd, c7, (1, 7), pad=(0, 3), name="branch7x7dbl_3")
    bd = _basic(b, bd, c7, (7, 1), pad=(3, 0), name="branch7x7dbl_4")
    bd = _basic(b, bd, 192, (1, 7), pad=(0, 3), name="branch7x7dbl_5")
    return b.concat([b1, b7, bd, _pool_branch(b, x, 192)])


def inception_d(b: OnnxBuilder, x: str) -> str:
    b3 = _basic(b, _basic(b, x, 192, 1, name="branch3x3_1"), 320, 3, stride=2, name="branch3x3_2")
    b7 = _basic(b, x, 192, 1, name="branch7x7x3_1")
    b7 = _basic(b, b7, 192, (1, 7), pad=(0, 3), name="branch7x7x3_2")
    b7 = _basic(b, b7, 192, (7, 1), pad=(3, 0), name="branch7x7x3_3")
    b7 = _basic(b, b7, 192, 3, stride=2, name="branch7x7x3_4")
    return b.concat([b3, b7, b.maxpool(x, 3, 2)])


def inception_e(b: OnnxBuilder, x: str) -> str:
    """The 8x8 block: 1x3 and 3x1 convolutions in parallel on the same input, concatenated."""
    b1 = _basic(b, x, 320, 1, name="branch1x1")
    b3 = _basic(b, x, 384, 1, name="branch3x3_1")
    b3 = b.concat([_basic(b, b3, 384, (1, 3), pad=(0, 1), name="branch3x3_2a"),
                   _basic(b, b3, 384, (3, 1), pad=(1, 0), name="branch3x3_2b")])
    bd = _basic(b, _basic(b, x, 448, 1, name="branch3x3dbl_1"), 384, 3, pad=1, name="branch3x3dbl_2")
    bd = b.concat([_basic(b, bd, 384, (1, 3), pad=(0, 1), name="branch3x3dbl_3a"),
                   _basic(b, bd, 384, (3, 1), pad=(1, 0), name="branch3x3dbl_3b")])
    return b.concat([b1, b3, bd, _pool_branch(b, x, 192)])


INCEPTION_DOC = ("Inception-v3 (torchvision, inference: no auxiliary head), 299x299 input: stem, 3x InceptionA, "
                 "InceptionB, 4x InceptionC, InceptionD, 2x InceptionE, global average pool, fc 1000.")


def inception_v3(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("inception_v3", seed, INCEPTION_DOC)
    x = b.input("image", (batch, 3, 299, 299))
    x = _basic(b, x, 32, 3, stride=2, name="Conv2d_1a_3x3")
    x = _basic(b, x, 32, 3, name="Conv2d_2a_3x3")
    x = _basic(b, x, 64, 3, pad=1, name="Conv2d_2b_3x3")
    x = b.maxpool(x, 3, 2)
    x = _basic(b, x, 80, 1, name="Conv2d_3b_1x1")
    x = _basic(b, x, 192, 3, name="Conv2d_4a_3x3")
    x = b.maxpool(x, 3, 2)  # (b, 192, 35, 35)
    blocks = [("Mixed_5b", inception_a, (32,)), ("Mixed_5c", inception_a, (64,)), ("Mixed_5d", inception_a, (64,)),
              ("Mixed_6a", inception_b, ()), ("Mixed_6b", inception_c, (128,)), ("Mixed_6c", inception_c, (160,)),
              ("Mixed_6d", inception_c, (160,)), ("Mixed_6e", inception_c, (192,)), ("Mixed_7a", inception_d, ()),
              ("Mixed_7b", inception_e, ()), ("Mixed_7c", inception_e, ())]
    for name, block, args in blocks:
        with b.scope(name):
            x = block(b, x, *args)
    classifier(b, x)  # (b, 2048, 8, 8) -> (b, 1000)
    return b.model()


# ----- SqueezeNet 1.1 and VGG-19 ---------------------------------------------------------------
def conv_relu(b: OnnxBuilder, x: str, cout: int, k: int, stride: int = 1, pad: int | None = None,
              name: str = "conv") -> str:
    """Conv with bias -> Relu, for the networks without BatchNormalization."""
    with b.scope(name):
        return b.relu(b.conv(x, cout, k, stride, pad, bias=True))


def fire(b: OnnxBuilder, x: str, squeeze: int, expand: int) -> str:
    """SqueezeNet's fire module: squeeze 1x1, then expand 1x1 and 3x3 on the same input, concatenated."""
    s = conv_relu(b, x, squeeze, 1, name="squeeze")
    return b.concat([conv_relu(b, s, expand, 1, name="expand1x1"), conv_relu(b, s, expand, 3, name="expand3x3")])


SQUEEZENET_DOC = "SqueezeNet 1.1 (torchvision), 224x224 input: 8 fire modules, a 1x1 conv classifier, 1000 classes."


def squeezenet(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("squeezenet", seed, SQUEEZENET_DOC)
    x = b.input("image", (batch, 3, 224, 224))
    x = b.maxpool(conv_relu(b, x, 64, 3, stride=2, pad=0, name="conv1"), 3, 2, ceil=True)
    fires = [(16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool", (48, 192), (48, 192), (64, 256), (64, 256)]
    index = 2
    for spec in fires:
        if spec == "pool":
            x = b.maxpool(x, 3, 2, ceil=True)
            continue
        with b.scope(f"fire{index}"):
            x = fire(b, x, *spec)
        index += 1
    x = conv_relu(b, x, 1000, 1, name="classifier")  # (b, 1000, 13, 13)
    b.output(b.flatten(b.global_avgpool(x)), "logits")
    return b.model()


VGG19_DOC = "VGG-19 (configuration E, no BatchNormalization), 224x224 input, fc 4096-4096-1000."


def vgg19(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("vgg19", seed, VGG19_DOC)
    x = b.input("image", (batch, 3, 224, 224))
    for stage, (width, convs) in enumerate(zip((64, 128, 256, 512, 512), (2, 2, 4, 4, 4), strict=True), start=1):
        for i in range(convs):
            x = conv_relu(b, x, width, 3, name=f"conv{stage}_{i + 1}")
        x = b.maxpool(x, 2, 2)
    x = b.flatten(x)  # (b, 512 * 7 * 7)
    x = b.relu(b.gemm(x, 4096, gain=2**0.5, name="fc6"))
    x = b.relu(b.gemm(x, 4096, gain=2**0.5, name="fc7"))
    b.output(b.gemm(x, 1000, name="fc8"), "logits")
    return b.model()


# ----- NASNet-A --------------------------------------------------------------------------------
def sep_conv(b: OnnxBuilder, x: str, cout: int, k: int, stride: int = 1, name: str = "sep") -> str:
    """NASNet's separable convolution: Relu, depthwise kxk conv (group = channels), pointwise 1x1 conv, BN."""
    c = b.shape(x)[1]
    with b.scope(name):
        y = b.conv(b.relu(x), c, k, stride, group=c, name="depthwise")
        return b.bn(b.conv(y, cout, 1, name="pointwise"))


def adjust(b: OnnxBuilder, x: str, cout: int, stride: int = 1, name: str = "adjust") -> str:
    """Relu -> 1x1 conv -> BN: brings a cell input to the cell's width (and, strided, to its resolution)."""
    with b.scope(name):
        return b.bn(b.conv(b.relu(x), cout, 1, stride))


def _avg(b: OnnxBuilder, x: str, stride: int = 1) -> str:
    return b.avgpool(x, 3, stride, 1, count_include_pad=False)  # TensorFlow "SAME" pooling


def _cell_inputs(b: OnnxBuilder, prev: str, cur: str, width: int) -> tuple[str, str]:
    cur = adjust(b, cur, width, name="adjust_cur")
    stride = b.shape(prev)[2] // b.shape(cur)[2]  # prev is twice cur's size after a reduction cell
    return adjust(b, prev, width, stride, name="adjust_prev"), cur


def normal_cell(b: OnnxBuilder, prev: str, cur: str, width: int) -> str:
    """NASNet-A normal cell: five pairwise sums over the two cell inputs, concatenated."""
    prev, cur = _cell_inputs(b, prev, cur, width)
    return b.concat([
        b.add(sep_conv(b, cur, width, 3, name="comb0_left"), cur),
        b.add(sep_conv(b, prev, width, 3, name="comb1_left"), sep_conv(b, cur, width, 5, name="comb1_right")),
        b.add(_avg(b, cur), prev),
        b.add(_avg(b, prev), _avg(b, prev)),
        b.add(sep_conv(b, prev, width, 5, name="comb4_left"), sep_conv(b, prev, width, 3, name="comb4_right")),
    ])


def reduction_cell(b: OnnxBuilder, prev: str, cur: str, width: int) -> str:
    """NASNet-A reduction cell: strided separable convs and pools, halving the resolution."""
    prev, cur = _cell_inputs(b, prev, cur, width)
    c0 = b.add(sep_conv(b, prev, width, 7, 2, name="comb0_left"), sep_conv(b, cur, width, 5, 2, name="comb0_right"))
    c1 = b.add(b.maxpool(cur, 3, 2, 1), sep_conv(b, prev, width, 7, 2, name="comb1_right"))
    c2 = b.add(_avg(b, cur, 2), sep_conv(b, prev, width, 5, 2, name="comb2_right"))
    c3 = b.add(b.maxpool(cur, 3, 2, 1), sep_conv(b, c0, width, 3, name="comb3_right"))
    c4 = b.add(_avg(b, c0), c1)
    return b.concat([c0, c1, c2, c3, c4])


NASNET_DOC = ("NASNet-A, mobile-sized: 224x224 input; stem 3x3/2 conv-BN-ReLU (32) and 3x3/2 max pool to 56x56; "
              "three stages of 4 normal cells (widths 44, 88, 176), each followed by a reduction cell; every cell "
              "concatenates 5 pairwise sums of separable-conv, pool and identity branches, as TASO's nasnet_a; "
              "final 7x7 grid with 1760 channels, global average pool, fc 1000.")


def nasnet_a(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    cells_per_stage, width = 4, 44
    b = OnnxBuilder("nasnet_a", seed, NASNET_DOC)
    x = b.input("image", (batch, 3, 224, 224))
    x = b.maxpool(conv_bn(b, x, 32, 3, 2, name="stem"), 3, 2, 1)  # (b, 32, 56, 56)
    prev = cur = x
    for stage in range(3):
        for i in range(cells_per_stage):
            with b.scope(f"stage{stage}.normal{i}"):
                prev, cur = cur, normal_cell(b, prev, cur, width)
        width *= 2
        with b.scope(f"stage{stage}.reduction"):
            prev, cur = cur, reduction_cell(b, prev, cur, width)
    classifier(b, b.relu(cur))
    return b.model()

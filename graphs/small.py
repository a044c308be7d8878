"""Two small graphs for fast tests and demos: they build in milliseconds and run in microseconds."""

from __future__ import annotations

import math

import onnx

from .builder import OnnxBuilder
from .cnns import classifier, conv_bn

MLP_DOC = ("Small graph for fast tests and demos: a 4-layer MLP on (batch, 64) whose second layer is two branches "
           "(Relu and Tanh) reading the same input, concatenated; 10 outputs.")


def mlp(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("mlp", seed, MLP_DOC)
    relu_gain = math.sqrt(2.0)
    x = b.relu(b.linear(b.input("x", (batch, 64)), 256, gain=relu_gain, name="fc1"))
    left = b.relu(b.linear(x, 256, gain=relu_gain, name="fc2a"))
    right = b.tanh(b.linear(x, 256, name="fc2b"))
    x = b.relu(b.linear(b.concat([left, right], axis=1), 256, gain=relu_gain, name="fc3"))
    b.output(b.linear(x, 10, name="fc4"), "y")
    return b.model()


TINY_CNN_DOC = ("Small graph for fast tests and demos: a 32x32 CNN of Conv-BN-Relu blocks, a fire-style block "
                "(1x1 and 3x3 convs reading one squeezed input, concatenated), a residual block, 10 classes.")


def tiny_cnn(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    b = OnnxBuilder("tiny_cnn", seed, TINY_CNN_DOC)
    x = b.input("image", (batch, 3, 32, 32))
    x = conv_bn(b, x, 16, 3, name="conv1")
    x = conv_bn(b, x, 32, 3, stride=2, name="conv2")  # (b, 32, 16, 16)
    with b.scope("fire"):
        s = conv_bn(b, x, 16, 1, name="squeeze")
        x = b.concat([conv_bn(b, s, 32, 1, name="expand1x1"), conv_bn(b, s, 32, 3, name="expand3x3")])
    x = b.maxpool(x, 2)  # (b, 64, 8, 8)
    with b.scope("res"):
        y = conv_bn(b, conv_bn(b, x, 64, 3, name="conv1"), 64, 3, relu=False, name="conv2")
        x = b.relu(b.add(x, y))
    classifier(b, x, classes=10)
    return b.model()

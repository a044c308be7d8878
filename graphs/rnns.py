"""Recurrent benchmark graphs: NasRNN, unrolled over time as TASO's nasrnn example."""

from __future__ import annotations

import math

import onnx

from .builder import OnnxBuilder


def nas_cell(b: OnnxBuilder, x: str, h: str, weights: list[tuple[str, str]]) -> str:
    """The NAS-discovered recurrent cell (Zoph & Le, 2017) as TASO writes it.

    Eight mixes x @ Wx_i + h @ Wh_i, then a binary tree of Relu/Sigmoid/Tanh activations combined
    by Add and Mul. Every mix reads the same x and the same h: the optimiser can merge those MatMuls.
    """
    t = [b.add(b.matmul(x, wx), b.matmul(h, wh)) for wx, wh in weights]
    m0 = b.add(b.relu(t[0]), b.sigmoid(t[3]))
    m1 = b.add(b.sigmoid(t[1]), b.tanh(t[2]))
    m2 = b.mul(b.sigmoid(t[4]), b.tanh(t[5]))
    m3 = b.mul(b.sigmoid(t[6]), b.relu(t[7]))
    m4 = b.add(b.sigmoid(m1), b.tanh(m2))
    m5 = b.mul(b.tanh(m0), b.tanh(m3))
    return b.tanh(b.mul(b.tanh(m4), b.tanh(m5)))


NASRNN_DOC = ("NasRNN as TASO's nasrnn example: 5 time steps, hidden 512. Input (batch, 5, 512) is split into "
              "steps; one set of cell weights is shared across steps; the initial state is a learned (1, 512) "
              "weight. Output: the final hidden state.")


def nasrnn(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    steps, hidden = 5, 512
    b = OnnxBuilder("nasrnn", seed, NASRNN_DOC)
    xs = b.split(b.input("x", (batch, steps, hidden)), [1] * steps, axis=1)
    std = 2.0 / math.sqrt(hidden)  # gain 2: the cell squashes its mixes through up to four nonlinearities
    with b.scope("cell"):
        weights = [(b.weight((hidden, hidden), std, f"wx{i}"), b.weight((hidden, hidden), std, f"wh{i}"))
                   for i in range(8)]
    h = b.weight((1, hidden), 0.5, "h0")
    for step, x in enumerate(xs):
        with b.scope(f"step{step}"):
            h = nas_cell(b, b.squeeze(x, axis=1), h, weights)
    b.output(h, "hidden")
    return b.model()

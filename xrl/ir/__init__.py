"""The graph IR: typed operators, shape inference, FLOP/byte counts, hashing, validation.

Pure Python and numpy: no torch, no onnx, no gym (see docs/architecture.md, "Boundaries").
"""

from xrl.ir.graph import Graph, Node
from xrl.ir.types import TensorType

__all__ = ["Graph", "Node", "TensorType"]

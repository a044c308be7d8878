"""Graph -> PyG `Data`: typed node, edge and graph-level feature tensors for the GNN (see featurize.py)."""

from xrl.features.featurize import DTYPE_VOCAB, EDGE_DIM, GLOBAL_DIM, KIND_VOCAB, NODE_DIM, OP_VOCAB, featurize

__all__ = ["DTYPE_VOCAB", "EDGE_DIM", "GLOBAL_DIM", "KIND_VOCAB", "NODE_DIM", "OP_VOCAB", "featurize"]

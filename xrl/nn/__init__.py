"""Encoders and heads (torch and PyG only): graphs in, candidate scores and state values out.

Modules: `encoders` (EncoderConfig, the GraphEncoder base and one class per kind, registered in
ENCODERS: add a kind with `register_encoder`), `layers` (MLPs, reverse edges, degrees), `pooling`
(graph pooling, whole and incremental), `policy` (GraphPolicy), `distributions`.
"""

from xrl.nn.distributions import GroupedCategorical
from xrl.nn.encoders import ENCODERS, POOLINGS, EncoderConfig, GraphEncoder, register_encoder
from xrl.nn.policy import GraphPolicy, PolicyConfig

__all__ = ["ENCODERS", "POOLINGS", "EncoderConfig", "GraphEncoder", "GraphPolicy", "GroupedCategorical",
           "PolicyConfig", "register_encoder"]

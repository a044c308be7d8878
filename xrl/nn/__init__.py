"""Encoders and heads (torch and PyG only): graphs in, candidate scores and state values out."""

from xrl.nn.distributions import GroupedCategorical
from xrl.nn.encoders import ENCODERS, POOLINGS, EncoderConfig, GraphEncoder
from xrl.nn.policy import GraphPolicy, PolicyConfig

__all__ = ["ENCODERS", "POOLINGS", "EncoderConfig", "GraphEncoder", "GraphPolicy", "GroupedCategorical", "PolicyConfig"]

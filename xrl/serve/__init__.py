"""Serving policies to an external optimiser process (after MLGO's interactive model runner)."""

from xrl.serve.pipe import PipeProtocolError, PolicyServer, TensorSpec, read_message, write_header, write_observation

__all__ = ["PipeProtocolError", "PolicyServer", "TensorSpec", "read_message", "write_header", "write_observation"]

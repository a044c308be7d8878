"""xrl: graph reinforcement learning for dataflow-graph rewriting (after X-RLflow, MLSys 2023)."""

__version__ = "0.1.0"

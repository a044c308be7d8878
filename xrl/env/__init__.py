"""The gymnasium environment of graph rewriting; `import xrl.env` registers `xrl/GraphRewrite-v0`."""

import gymnasium as gym

from xrl.env.graph_rewrite import MAX_ACTIONS, GraphRewriteEnv, resolve_cost, resolve_graph, rule_name
from xrl.env.reward import REWARD_MODES, SHAPING, Potential, RewardConfig

ENV_ID = "xrl/GraphRewrite-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="xrl.env.graph_rewrite:GraphRewriteEnv", disable_env_checker=False)

__all__ = ["ENV_ID", "MAX_ACTIONS", "REWARD_MODES", "SHAPING", "GraphRewriteEnv", "Potential", "RewardConfig",
           "resolve_cost", "resolve_graph", "rule_name"]

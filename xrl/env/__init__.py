"""The gymnasium environments of xrl; `import xrl` (or `import xrl.env`) registers them.

    xrl/GraphRewrite-v0   one verified rewrite per step (X-RLflow); defaults: tiny_cnn, 64 candidates
    xrl/PassOrdering-v0   one compiler pass per step (after the XLA pass-ordering work)
"""

from xrl import ENV_DEFAULTS, register_envs
from xrl.env.graph_rewrite import (
    DEFAULT_GRAPH,
    MAX_ACTIONS,
    OBSERVATIONS,
    GraphRewriteEnv,
    resolve_graph,
    rule_name,
)
from xrl.env.reward import REWARD_MODES, SHAPING, Potential, RewardConfig
from xrl.env.state import EnvState, ValidationResult, read_states, write_states

ENV_ID = "xrl/GraphRewrite-v0"
PASS_ORDERING_ID = "xrl/PassOrdering-v0"
DEFAULT_MAX_CANDIDATES = ENV_DEFAULTS["max_candidates"]

register_envs()  # done by `import xrl` already; kept so the ids exist whichever module is imported first

__all__ = ["DEFAULT_GRAPH", "DEFAULT_MAX_CANDIDATES", "ENV_ID", "MAX_ACTIONS", "OBSERVATIONS", "PASS_ORDERING_ID",
           "REWARD_MODES", "SHAPING", "EnvState", "GraphRewriteEnv", "Potential", "RewardConfig", "ValidationResult",
           "read_states", "resolve_graph", "rule_name", "write_states"]

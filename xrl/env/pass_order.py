"""Pass ordering (xrl/PassOrdering-v0, after the XLA pass-ordering work), by one name for existing callers.

    xrl.env.passes      the passes (cse, dce, the rule families), PASSES, default_order, op_vocab
    xrl.env.pass_env    PassOrderingEnv: observation, reward, shaping
    xrl.env.pass_eval   agents (greedy lookahead, random) and evaluate_orders against the default order

The gymnasium id xrl/PassOrdering-v0 points at `xrl.env.pass_order:PassOrderingEnv`.
"""

from xrl.env.pass_env import REWARDS, SHAPINGS, PassOrderingEnv
from xrl.env.pass_eval import (
    OrderResult,
    Policy,
    evaluate_orders,
    geomean,
    greedy_policy,
    random_policy,
    run_order,
    suite_graphs,
)
from xrl.env.passes import (
    FAMILY_ORDER,
    PASSES,
    TRANSCENDENTAL,
    cse,
    dce,
    default_order,
    family_engine,
    op_vocab,
    run_family,
    run_pass,
    transcendentals,
)

__all__ = ["FAMILY_ORDER", "PASSES", "REWARDS", "SHAPINGS", "TRANSCENDENTAL", "OrderResult", "PassOrderingEnv",
           "Policy", "cse", "dce", "default_order", "evaluate_orders", "family_engine", "geomean", "greedy_policy",
           "op_vocab", "random_policy", "run_family", "run_order", "run_pass", "suite_graphs", "transcendentals"]

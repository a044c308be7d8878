"""xrl: graph reinforcement learning for dataflow-graph rewriting (after X-RLflow, MLSys 2023)."""

__version__ = "0.1.0"

ENV_DEFAULTS = {"graph": "tiny_cnn", "max_candidates": 64}  # a small graph; a finite, padded action space


def register_envs() -> None:
    """Register xrl's gymnasium environments, so `gymnasium.make("xrl/GraphRewrite-v0")` works after
    `import xrl`. Only entry points are recorded: torch and the env modules load on the first make."""
    try:
        import gymnasium as gym
    except ModuleNotFoundError:  # an install without gymnasium: nothing to register with
        return
    if "xrl/GraphRewrite-v0" not in gym.registry:
        gym.register(id="xrl/GraphRewrite-v0", entry_point="xrl.env.graph_rewrite:GraphRewriteEnv",
                     kwargs=dict(ENV_DEFAULTS))
    if "xrl/PassOrdering-v0" not in gym.registry:
        gym.register(id="xrl/PassOrdering-v0", entry_point="xrl.env.pass_order:PassOrderingEnv")


register_envs()

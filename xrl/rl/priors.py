"""Priors for the guided search: for a state's candidates, a distribution over actions and a value.

The guided search (xrl.rl.guided) reads a state only through a prior, so the learning can be ablated
at equal search and budget (issue 24: "Learning that beats search"):

    trained     a policy checkpoint: its policy head's distribution and its value head (today's path)
    untrained   the same network shape, freshly initialised from a seed: what the search earns by itself
                with a network that learned nothing
    uniform     equal over the state's candidates (never the no-op), value 0
    cost        a softmax over each candidate's one-step estimated gain, -delta cost% / temperature (the
                no-op has gain 0, so the argmax stops where no rewrite is estimated to help), value 0

Every prior answers for a batch of env states at once (the network's forward pass is batched); the
actions are the env's, the no-op first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xrl.errors import ConfigError

PRIORS = ("trained", "untrained", "uniform", "cost")
COST_TEMPERATURE = 1.0  # in percent of the graph's estimated cost: a 1% better rewrite is e times likelier


@dataclass
class Judgement:
    """A prior's view of one state."""

    log_probs: torch.Tensor  # [num_actions]: the no-op first, then the env's candidates in order
    value: float  # what the prior expects is left to gain from here, in the env's reward units (percent)


class Prior:
    """Base class: `judge` a batch of env states."""

    name: str = ""
    has_value = False  # a value head whose estimate may bound what is left (the search's stop rule)
    rolls_out = True  # its argmax rollout is worth running before the search (uniform's is arbitrary)
    # Judgement.value's unit (xrl.nn.policy.PolicyConfig.value_unit): "start", percent of the search's input cost;
    # "state", percent of the judged state's own cost (the search rescales it by cost(s) / cost(input))
    value_unit = "start"

    def judge(self, envs: Sequence[Any]) -> list[Judgement]:
        raise NotImplementedError


class PolicyPrior(Prior):
    """A GraphPolicy's policy and value heads."""

    has_value = True

    def __init__(self, policy: Any, name: str = "trained") -> None:
        from xrl.nn.policy import GraphPolicy

        if not isinstance(policy, GraphPolicy):
            raise ConfigError(f"a policy prior needs a GraphPolicy, not {type(policy).__name__}")
        self.policy, self.name = policy, name
        self.value_unit = policy.cfg.value_unit
        self.featurize = policy.features()
        policy.eval()

    def judge(self, envs: Sequence[Any]) -> list[Judgement]:
        from xrl.rl.rollout import observe

        return self.judge_observed([observe(e, self.featurize) for e in envs])

    def judge_observed(self, metas: Sequence[Any]) -> list[Judgement]:
        """`judge` on observations already made (one per state, by this prior's `featurize`)."""
        with torch.no_grad():
            dist, value = self.policy(type(metas[0]).collate(metas) if len(metas) > 1 else metas[0])
        out = []
        for i in range(len(metas)):
            start, count = int(dist.start[i]), int(dist.counts[i])
            out.append(Judgement(dist.log_probs[start:start + count], float(value[i])))
        return out


class UniformPrior(Prior):
    name, rolls_out = "uniform", False

    def judge(self, envs: Sequence[Any]) -> list[Judgement]:
        out = []
        for e in envs:
            n = len(e.candidates)
            lp = torch.full((n + 1,), -torch.log(torch.tensor(float(max(n, 1)))).item())
            lp[0] = -float("inf")  # the no-op is the search's own stopping, never a prior's choice
            out.append(Judgement(lp, 0.0))
        return out


class CostPrior(Prior):
    """softmax(-hint / T): the hint is the env's estimate of a rewrite's cost change in percent of the
    starting cost (the no-op's is 0), the same estimate that ranks candidates under a cap."""

    name = "cost"

    def __init__(self, temperature: float = COST_TEMPERATURE) -> None:
        if not temperature > 0:
            raise ConfigError(f"the cost prior's temperature must be positive, not {temperature}")
        self.temperature = temperature

    def judge(self, envs: Sequence[Any]) -> list[Judgement]:
        out = []
        for e in envs:
            gain = -torch.from_numpy(e.candidate_hints()[:, 0].copy()).double() / self.temperature
            out.append(Judgement(torch.log_softmax(gain, 0).float(), 0.0))
        return out


def untrained_like(policy: Any, seed: int) -> Any:
    """A network of `policy`'s shape (its PolicyConfig), freshly initialised from `seed`."""
    from xrl.nn.policy import GraphPolicy

    state = torch.get_rng_state()
    try:  # a seeded initialisation that leaves the caller's torch RNG as it was
        torch.manual_seed(seed)
        fresh = GraphPolicy(policy.cfg)
    finally:
        torch.set_rng_state(state)
    return fresh.eval()


def make_prior(name: str, *, policy: str | Path | Any | None = None, seed: int = 0,
               temperature: float = COST_TEMPERATURE) -> Prior:
    """The prior called `name`; `policy` (a checkpoint path, a GraphPolicy, or None: the shipped one) is what
    `trained` reads and whose shape `untrained` copies; `seed` initialises `untrained`."""
    if name not in PRIORS:
        raise ConfigError(f"unknown prior {name!r}; choose one of: {', '.join(PRIORS)}")
    if name == "uniform":
        return UniformPrior()
    if name == "cost":
        return CostPrior(temperature)
    net = load_network(policy)
    return PolicyPrior(net) if name == "trained" else PolicyPrior(untrained_like(net, seed), f"untrained-{seed}")


def load_network(policy: str | Path | Any | None) -> Any:
    from xrl.nn.policy import GraphPolicy
    from xrl.rl.checkpoint import default_policy_path, load_policy

    if isinstance(policy, GraphPolicy):
        return policy
    return load_policy(Path(policy) if policy is not None else default_policy_path())[0]


__all__ = ["COST_TEMPERATURE", "PRIORS", "CostPrior", "Judgement", "PolicyPrior", "Prior", "UniformPrior",
           "load_network", "make_prior", "untrained_like"]

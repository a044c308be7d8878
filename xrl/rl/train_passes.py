"""`xrl train env=pass_ordering`: PPO on xrl/PassOrdering-v0 (which compiler pass next), and its evaluation.

The observation is a fixed-length vector (op-type counts, episode progress, which passes are idle), so
the policy is a small MLP actor-critic (`PassPolicy`; it and its checkpoints: `xrl.rl.pass_policy`), trained
by xrl's own clipped PPO (`xrl.rl.ppo.ppo_update`, the update the graph policy uses): a `PassObs` collates
into tensors and the policy returns (masked categorical, value), which is all `ppo_update` asks of a
policy. Keeping xrl's PPO rather than sb3-contrib's MaskablePPO means `xrl train` needs no optional
dependency and writes what every xrl training writes (metrics.jsonl, learning curves, last.pt / best.pt,
exact resume).

The loop is the one every training runs (`xrl.rl.loop.run`); `PassOrderingTask` supplies its pieces:

    collect      episodes_per_worker * max(workers, 1) whole episodes, in this process (passes are memoised
                 per (graph, pass), so after the first visits an episode costs almost nothing)
    evaluate     the greedy (argmax) order on every train and held-out graph

Metrics: `speedup/<graph>` and `eval_speedup/<graph>` are the improvement over xrl's default pass
order in op count (ops after the default order / ops after the agent's; > 1: the agent's order removes
more), so `xrl sweep summarize` and the sweep objective read them like the rewrite training's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xrl.env.pass_env import PassOrderingEnv
from xrl.env.pass_eval import evaluate_orders, geomean, greedy_policy, run_order, suite_graphs  # noqa: F401 - callers import suite_graphs from here too
from xrl.env.passes import PASSES, default_order
from xrl.errors import ConfigError
from xrl.rl.checkpoint import CheckpointError, restore_rng, rng_state
from xrl.rl.config import take, typed
from xrl.rl.loop import Experience, RunState, TrainingTask, TrainSummary, run, seed_everything
from xrl.rl.pass_policy import (
    PassObs,
    PassPolicy,
    PassPolicyConfig,
    features,
    load_pass_checkpoint,
    load_pass_policy,
    obs_dim,
    save_pass_checkpoint,
)
from xrl.rl.ppo import PPOConfig, RolloutBatch
from xrl.rl.rollout import EpisodeRecord

ENV_DEFAULTS: dict[str, Any] = {"name": "pass_ordering", "horizon": len(PASSES), "reward": "ops", "shaping": "none",
                                "gamma": 0.99, "max_rewrites": None, "hidden": 64, "layers": 2}
# The env's rewards are percentages (returns up to ~60); PPO sees them / 100 so that its value clipping
# (algo.clip_coef on the value's change) works on returns of order 1, the scale it is tuned for.
REWARD_SCALE = 0.01


# ----- configuration -------------------------------------------------------------------------------
def pass_env_settings(env: Mapping[str, Any]) -> dict[str, Any]:
    """The `env` section (conf/env/pass_ordering.yaml), type-checked, with its defaults."""
    unknown = sorted(set(env) - set(ENV_DEFAULTS))
    if unknown:
        raise ConfigError(f"env (pass_ordering) has no setting {', '.join(map(repr, unknown))}; "
                          f"its settings: {', '.join(ENV_DEFAULTS)}")
    s = {k: typed(f"env.{k}", env.get(k, d), d) for k, d in ENV_DEFAULTS.items()}
    if s["hidden"] < 1 or s["layers"] < 0:
        raise ConfigError("env.hidden must be at least 1 and env.layers at least 0")
    return s


def env_kwargs_of(settings: Mapping[str, Any], device: str = "h100") -> dict[str, Any]:
    """PassOrderingEnv keyword arguments from the settings (the MLP's size is not the env's)."""
    return {"horizon": settings["horizon"], "reward": settings["reward"], "shaping": settings["shaping"],
            "gamma": settings["gamma"], "max_rewrites": settings["max_rewrites"], "device": device}


# ----- playing -------------------------------------------------------------------------------------
class Episodes:
    """One env for training and evaluation, so the memo of pass results is shared by both."""

    def __init__(self, env: PassOrderingEnv) -> None:
        self.env = env
        self._graphs: dict[str, Any] = {}
        self._default_ops: dict[str, int] = {}

    def graph(self, name: str) -> Any:
        from xrl.env.graph_rewrite import resolve_graph

        if name not in self._graphs:
            self._graphs[name] = resolve_graph(name)
        return self._graphs[name]

    def default_ops(self, name: str) -> int:
        """Op count after xrl's default order (cycled to the horizon, as evaluate_orders plays it)."""
        if name not in self._default_ops:
            order = default_order()
            self._default_ops[name] = len(run_order(self.env, self.graph(name),
                                                    lambda e, o: order[e.step_count % len(order)]))
        return self._default_ops[name]

    def play(self, policy: PassPolicy, *, graph: str | None = None, greedy: bool = False
             ) -> tuple[EpisodeRecord, list[PassObs], list[int], list[float], list[float], list[float]]:
        """One episode: on `graph`, or on one the env draws from its pool (its seeded RNG)."""
        env = self.env
        obs, _ = env.reset(options={"graph": self.graph(graph)} if graph else None)
        name = env.graph.name
        states, actions, logps, values, rewards = [], [], [], [], []
        least, done = len(env.graph), False
        while not done:
            o = PassObs(features(obs), env.action_masks())
            a, lp, v = policy.act(o, greedy)
            obs, r, terminated, truncated, _ = env.step(a)
            states.append(o)
            actions.append(a)
            logps.append(lp)
            values.append(v)
            rewards.append(r)
            least = min(least, len(env.graph))
            done = terminated or truncated
        final, passes = len(env.graph), list(env.passes)
        d = self.default_ops(name)  # after reading the episode's end: the default order is played on the same env
        rec = EpisodeRecord(name, float(sum(rewards)), len(actions), d / max(final, 1), d / max(least, 1), passes)
        return rec, states, actions, logps, values, rewards


# ----- training ------------------------------------------------------------------------------------
def train_passes(c: dict[str, Any], out_dir: str | Path) -> TrainSummary:
    """Train a pass-ordering policy as the plain config `c` says (conf/train.yaml with env=pass_ordering)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return run(PassOrderingTask(c), c, out)


class PassOrderingTask(TrainingTask):
    """A PassPolicy on one PassOrderingEnv over the training graphs: built, or restored from `resume`."""

    label = "train passes"

    def __init__(self, c: dict[str, Any]) -> None:
        self.config = c
        seed = typed("seed", c.get("seed", 0), 0)
        typed("updates", c["updates"], 0)  # checked before any work (the loop reads it)
        self.ppo = take(PPOConfig, c["algo"], "algo", ignore=("name",))
        settings = pass_env_settings(c.get("env", {}))
        self.train_graphs = tuple(c["graphs"]["train"])
        self.eval_graphs = tuple(c["graphs"].get("eval") or ())
        if not self.train_graphs:
            raise ConfigError("graphs.train is empty: name at least one built-in graph to train on")
        self.episodes = typed("episodes_per_worker", c.get("episodes_per_worker", 4), 0) * max(
            typed("workers", c.get("workers", 2), 0), 1)
        if self.episodes < 1:
            raise ConfigError("episodes_per_worker must be at least 1")
        device = (c.get("cost") or {}).get("device", "h100")

        self.ppo_rng = seed_everything(seed)
        self.play = Episodes(PassOrderingEnv(list(self.train_graphs), **env_kwargs_of(settings, device)))
        self.play.env.reset(seed=seed)  # seeds the env's draw of a training graph per episode
        self.policy = PassPolicy(PassPolicyConfig(obs_dim(), len(PASSES), settings["hidden"], settings["layers"]))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.ppo.lr, eps=1e-5)
        self.state = RunState()
        if c.get("resume"):
            self.restore(c["resume"], settings)

    def restore(self, resume: str, settings: Mapping[str, Any]) -> None:
        """Weights, optimizer, RNGs (PPO's and the env's) and run state of the checkpoint `resume`."""
        ckpt = load_pass_checkpoint(resume)
        if "optimizer" not in ckpt:
            raise CheckpointError(f"{resume} holds a policy only; it cannot be resumed")
        if (ckpt["policy_config"]["hidden"], ckpt["policy_config"]["layers"]) != (settings["hidden"],
                                                                                  settings["layers"]):
            raise ConfigError(f"{resume} was trained with another env.hidden/env.layers; resume with the same")
        self.policy.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng(ckpt["rng"], self.ppo_rng)
        self.play.env.np_random.bit_generator.state = ckpt["rng"]["env"]
        self.state = RunState.from_checkpoint(ckpt)

    def collect(self, update: int) -> Experience:
        t0 = time.perf_counter()
        self.policy.eval()
        records, obs, acts, logps, vals, rews, dones = [], [], [], [], [], [], []
        for _ in range(self.episodes):
            rec, o, a, lp, v, r = self.play.play(self.policy)
            records.append(rec)
            obs += o
            acts += a
            logps += lp
            vals += v
            rews += r
            dones += [0.0] * (len(a) - 1) + [1.0]
        collect_s = time.perf_counter() - t0
        batch = RolloutBatch(obs, torch.tensor(acts), torch.tensor(logps), torch.tensor(vals),  # type: ignore[arg-type]
                             REWARD_SCALE * torch.tensor(rews), torch.tensor(dones))
        return Experience(batch, records, collect_s)

    def evaluate(self, policy: nn.Module, graphs: Sequence[str]) -> list[EpisodeRecord]:
        policy.eval()
        return [self.play.play(policy, graph=g, greedy=True)[0] for g in graphs]  # type: ignore[arg-type]

    def save(self, path: Path, update: int, run_id: str | None, policy: nn.Module | None = None) -> Path:
        s = self.state
        rng = {**rng_state(self.ppo_rng), "env": self.play.env.np_random.bit_generator.state}
        return save_pass_checkpoint(path, policy or self.policy, optimizer=self.optimizer.state_dict(),  # type: ignore[arg-type]
                                    update=update, env_steps=s.env_steps, rng=rng, config=self.config,
                                    history=s.history,
                                    metadata={"wandb_id": run_id, "best_score": s.best_score,
                                              "train_graphs": list(self.train_graphs),
                                              "eval_graphs": list(self.eval_graphs)})

    def progress(self, metrics: Mapping[str, float]) -> dict[str, str]:
        return {"vs_default": f"{metrics['speedup_mean']:.3f}", "ret": f"{metrics['episode_return']:.2f}"}


# ----- evaluation (xrl eval --env pass_ordering) ---------------------------------------------------
def evaluate_passes(policy_path: str | None, graphs: Sequence[tuple[str, Any]], *, horizon: int | None = None,
                    device: str = "h100") -> dict[str, Any]:
    """Per graph: op counts at the start, after the default order and after the agent's order, the
    improvements (start / after) of both, the ratio (default / agent), and the ratio's geomean.
    Without a policy the agent is the one-step lookahead (`greedy_policy`)."""
    kwargs: dict[str, Any] = {"device": device}
    if policy_path:
        policy, ckpt = load_pass_policy(policy_path)
        settings = pass_env_settings(ckpt.get("config", {}).get("env", {}))
        kwargs = env_kwargs_of(settings, device)
        choose, agent = policy.chooser(), str(policy_path)
        trained_on = set(ckpt.get("metadata", {}).get("train_graphs", []))
    else:
        choose, agent, trained_on = greedy_policy, "greedy (one-step lookahead)", set()
    if horizon is not None:
        if horizon < 1:
            raise ConfigError(f"--horizon must be at least 1, not {horizon}")
        kwargs["horizon"] = horizon
    results = evaluate_orders([g for _, g in graphs], choose, **kwargs)
    rows = [{"graph": label, "split": "hlo" if label.startswith("hlo/") else
             ("train" if label in trained_on else "held-out"),
             "ops": r.ops0, "default_ops": r.default_ops, "agent_ops": r.ops,
             "default_improvement": r.ops0 / max(r.default_ops, 1), "agent_improvement": r.ops0 / max(r.ops, 1),
             "ratio": r.improvement, "passes": list(r.passes)} for (label, _), r in zip(graphs, results)]
    return {"agent": agent, "horizon": kwargs.get("horizon", len(PASSES)), "graphs": rows,
            "geomean_ratio": geomean([r["ratio"] for r in rows]),
            "geomean_default_improvement": geomean([r["default_improvement"] for r in rows]),
            "geomean_agent_improvement": geomean([r["agent_improvement"] for r in rows])}

"""`xrl train`: PPO on graph rewriting (the GNN policy), or on pass ordering with `env=pass_ordering`.

The loop itself is `xrl.rl.loop.run`; this module supplies its rewrite task: a `GraphPolicy` trained on
whole episodes that a collector (`xrl.rl.collectors`: processes, this process, Ray actors) plays on the
training graphs, optionally warm-started by imitating search teachers, resumable exactly.

`cfg` is the Hydra config of `conf/train.yaml` (or any mapping with the same keys); `train` knows
nothing of Hydra itself, so tests and scripts call it directly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from xrl.errors import ConfigError
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.checkpoint import CheckpointError, load_checkpoint, restore_rng, rng_state, save_checkpoint
from xrl.rl.collectors import make_collector
from xrl.rl.config import check_settings, env_kwargs, imitation_config, plain, policy_config, take, typed
from xrl.rl.imitation import warm_start
from xrl.rl.loop import Experience, RunState, TrainingTask, TrainSummary, run, seed_everything
from xrl.rl.metrics import selection_key
from xrl.rl.ppo import PPOConfig
from xrl.rl.rollout import CollectorSpec, EpisodeRecord, RolloutCollector, check_mask_stop

__all__ = ["RewriteTask", "TrainSummary", "check_settings", "init_weights", "policy_config", "train"]


def train(cfg: Mapping[str, Any], out_dir: str | Path) -> TrainSummary:
    """Train a policy as `cfg` says (see conf/train.yaml), writing checkpoints and logs under `out_dir`."""
    c = json.loads(json.dumps(plain(cfg), default=str))  # plain values only: checkpoints load weights_only
    if (c.get("env") or {}).get("name") == "pass_ordering":  # xrl/PassOrdering-v0: an MLP policy, its own task
        from xrl.rl.train_passes import train_passes

        return train_passes(c, out_dir)
    check_settings(c)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return run(RewriteTask(c, out), c, out)


class RewriteTask(TrainingTask):
    """A GraphPolicy on xrl/GraphRewrite-v0: built, warm-started or restored as the plain config `c` says."""

    label = "train"

    def __init__(self, c: dict[str, Any], out: Path) -> None:
        # settings first, each checked before any work
        self.config = c
        self.seed = seed = typed("seed", c.get("seed", 0), 0)
        # The learner on one torch thread (0: torch's default): on a busy machine torch's pool spin-waits and
        # a PPO update took 2.4x longer on 2 threads than on 1 (2 cores, 2 other busy processes); on an idle
        # 2-core machine 2 threads were 1.27x faster. Rollout workers always run on one thread each.
        threads = typed("torch_threads", c.get("torch_threads", 1), 0)
        if threads > 0:
            torch.set_num_threads(threads)
        typed("updates", c["updates"], 0)  # the loop reads it; a bad value is refused before any work
        self.ppo = take(PPOConfig, c["algo"], "algo", ignore=("name",))
        pcfg = policy_config(c["model"])
        if c.get("init_from"):  # fine-tuning keeps the starting network's scoring: plain policies stay plain
            pcfg = starting_scoring(pcfg, c["init_from"])
        self.train_graphs, self.val_graphs, self.eval_graphs = graph_split(c["graphs"])
        cost = c.get("cost", {})
        # The env's rule set is the run's `rules` (xrl.rewrite.rules.load_rules(rule_set=...)): all, elementary, ...
        env = {**env_kwargs(c.get("env", {})), "rules": c.get("rules") or "all"}
        self.spec = CollectorSpec(graphs=self.train_graphs, policy=pcfg, env=env,
                                  cost=cost.get("name", "analytic"), device=cost.get("device", "h100"),
                                  episodes_per_worker=typed("episodes_per_worker", c.get("episodes_per_worker", 4), 0),
                                  seed=seed, cache_size=typed("cache_size", c.get("cache_size", 4096), 0),
                                  mask_stop=check_mask_stop(c.get("mask_stop") or "none"))
        self.workers = typed("workers", c.get("workers", 2), 0)
        self._collector: RolloutCollector | None = None  # started by the first collect or evaluate

        # then the learner: seeded, built, and restored or warm-started
        self.ppo_rng = seed_everything(seed)
        self.policy = GraphPolicy(pcfg)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.ppo.lr, eps=1e-5)
        self.state = RunState()
        resume, init_from = c.get("resume"), c.get("init_from")
        if resume and init_from:
            raise ConfigError("set resume (continue a run) or init_from (start a new run from a policy's weights), "
                              "not both")
        if init_from:
            init_weights(self.policy, pcfg, init_from)
        if resume:
            self.restore(resume, pcfg)
        self.imitation = imitation_config(c.get("imitation") or {})
        if init_from and not resume:  # evaluated as update 0 by the loop
            self.baseline = GraphPolicy(pcfg)
            self.baseline.load_state_dict(self.policy.state_dict())
        self.demos: list = []
        if self.imitation.teachers and not resume:  # a resumed run was warm-started when it began
            self.demos = self.warm_start(out, seed)
        elif self.imitation.rehearse:
            raise ConfigError("imitation.rehearse needs imitation.teachers (and is not available on resume)")
        self.rehearsal = (torch.optim.Adam(self.policy.parameters(), lr=self.imitation.lr, eps=1e-5)
                          if self.imitation.rehearse else None)

    def restore(self, resume: str, pcfg: PolicyConfig) -> None:
        """Weights, optimizer, RNG and run state of the checkpoint `resume`."""
        ckpt = load_checkpoint(resume)
        if "optimizer" not in ckpt or "rng" not in ckpt:
            raise CheckpointError(f"{resume} holds a policy only (no optimizer or RNG state); it cannot be resumed")
        # `incremental` is how candidates are encoded, not the network: a run may resume with either.
        if dataclasses.replace(PolicyConfig.from_dict(ckpt["policy_config"]), incremental=pcfg.incremental) != pcfg:
            raise ConfigError(f"{resume} was trained with a different model config; resume with the same model")
        self.policy.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        restore_rng(ckpt["rng"], self.ppo_rng)
        self.state = RunState.from_checkpoint(ckpt)

    def warm_start(self, out: Path, seed: int) -> list:
        """Imitate the search teachers before PPO (report in imitation.json); returns their demonstrations."""
        from xrl.cost import get_cost_model
        from xrl.env import resolve_graph

        report, demos = warm_start(self.policy, {g: resolve_graph(g) for g in self.train_graphs},
                                   get_cost_model(self.spec.cost, device=self.spec.device), self.spec.env,
                                   self.imitation, seed=seed)
        (out / "imitation.json").write_text(json.dumps(report, indent=1))
        return demos

    @property
    def collector(self) -> RolloutCollector:
        if self._collector is None:
            self._collector = make_collector(self.spec, self.workers, self.config.get("collector"))
        return self._collector

    def collect(self, update: int) -> Experience:
        rollout = self.collector.collect(self.policy.state_dict(), update)
        # the measured kernel cost's work for this update (nothing under an estimate)
        return Experience(rollout.to_batch(), rollout.episodes, rollout.collect_s,
                          {f"cost_{k}": v for k, v in rollout.cost_stats.items()})

    def after_update(self, update: int) -> dict[str, float]:
        if self.rehearsal is None:
            return {}
        from xrl.rl.imitation import clone

        # the teachers' sequences again, so that PPO does not unlearn them
        return {"rehearse_nll": clone(self.policy, self.demos, self.imitation, seed=self.seed + update + 1,
                                      epochs=self.imitation.rehearse, optimizer=self.rehearsal)[-1]["nll"]}

    def evaluate(self, policy: torch.nn.Module, graphs: Sequence[str]) -> list[EpisodeRecord]:
        return self.collector.evaluate(policy.state_dict(), graphs)

    def save(self, path: Path, update: int, run_id: str | None, policy: torch.nn.Module | None = None) -> Path:
        s = self.state
        return save_checkpoint(path, policy or self.policy, optimizer=self.optimizer, update=update,
                               env_steps=s.env_steps, rng=rng_state(self.ppo_rng), config=self.config,
                               history=s.history,
                               metadata={"wandb_id": run_id, "best_score": s.best_score,
                                         "train_graphs": list(self.train_graphs), "val_graphs": list(self.val_graphs),
                                         "eval_graphs": list(self.eval_graphs),
                                         "selected_by": selection_key(self.val_graphs)})

    def close(self) -> None:
        if self._collector is not None:
            self._collector.close()
            self._collector = None


def graph_split(graphs: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(train, val, eval) graph names of the `graphs` section: best.pt is chosen on val, eval is reported only."""
    train_graphs = tuple(graphs["train"])
    eval_graphs = tuple(graphs.get("eval") or ())
    val_graphs = tuple(graphs.get("val") or ())
    if not train_graphs:
        raise ConfigError("graphs.train is empty: name at least one built-in graph to train on")
    if set(val_graphs) & set(train_graphs):
        raise ConfigError(f"graphs.val and graphs.train share {sorted(set(val_graphs) & set(train_graphs))}: "
                          "a checkpoint is chosen on graphs it was not trained on")
    return train_graphs, val_graphs, eval_graphs


def starting_scoring(pcfg: PolicyConfig, source: str) -> PolicyConfig:
    """`pcfg` with the residual cost prior set as in policy file `source` (conf/model's default is residual, the
    shipped default.pt/expert.pt are plain: init_from=default must fine-tune the plain network it names)."""
    from xrl.rl.checkpoint import default_policy_path

    path = default_policy_path() if source == "default" else Path(source)
    if not path.exists():
        return pcfg  # init_weights names the missing file
    theirs = PolicyConfig.from_dict(load_checkpoint(path)["policy_config"])
    return dataclasses.replace(pcfg, residual_prior=theirs.residual_prior, prior_temperature=theirs.prior_temperature)


def init_weights(policy: GraphPolicy, pcfg: PolicyConfig, source: str) -> None:
    """Start from the weights of a policy file (`default`: the shipped one): fine-tuning, as opposed to
    resuming, gets a fresh optimizer, update count and history. The network must be the same."""
    from xrl.rl.checkpoint import default_policy_path

    path = default_policy_path() if source == "default" else Path(source)
    ckpt = load_checkpoint(path)
    theirs = dataclasses.replace(PolicyConfig.from_dict(ckpt["policy_config"]), incremental=pcfg.incremental)
    if theirs != pcfg:
        raise ConfigError(f"init_from={source}: its network ({theirs.encoder}, use_hints={theirs.use_hints}) differs "
                          f"from model= ({pcfg.encoder}, use_hints={pcfg.use_hints}); set model to match it")
    policy.load_state_dict(ckpt["model"])

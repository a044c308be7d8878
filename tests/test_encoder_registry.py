"""Encoder kinds as registered classes: the shipped policy and every built-in kind compute exactly what they
did before the split into classes, and a kind added through `register_encoder` works end to end.

tests/fixtures/encoder_reference.pt was recorded with the single-class encoder (commit 7a441e6): one real
state (tiny_cnn and its first two candidates, as `xrl.policies.release.state_inputs` gives them), the
default policy's outputs on it, and for each built-in kind a small seeded policy's weights and outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.utils import scatter

from xrl.env import GraphRewriteEnv, resolve_graph
from xrl.errors import ConfigError
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.features.metagraph import FeatureCache, build_metagraph
from xrl.nn import ENCODERS, EncoderConfig, GraphEncoder, GraphPolicy, PolicyConfig, register_encoder
from xrl.policies.export import INPUTS, StateScorer
from xrl.rl.checkpoint import default_policy_path, load_policy
from xrl.rl.ppo import PPOConfig, RolloutBatch, ppo_update

REFERENCE = Path(__file__).parent / "fixtures" / "encoder_reference.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(REFERENCE, weights_only=True)


def _meta(t: dict[str, Tensor]):
    """The whole-graph MetaGraph of one state's stacked inputs (graph 0 the state, then its candidates)."""
    graphs = []
    for g in range(int(t["batch"].max()) + 1):
        rows = (t["batch"] == g).nonzero().squeeze(-1)
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        keep = (t["edge_index"][1] >= lo) & (t["edge_index"][1] < hi)
        graphs.append(Data(x=t["x"][lo:hi], edge_index=t["edge_index"][:, keep] - lo, edge_attr=t["edge_attr"][keep],
                           u=t["u"][g:g + 1], num_nodes=hi - lo))
    return build_metagraph(graphs[0], graphs[1:], cand_attr=t["cand_attr"], state_attr=torch.zeros(2))


def _outputs(policy: GraphPolicy, t: dict[str, Tensor]) -> dict[str, Tensor]:
    with torch.no_grad():
        dist, value = policy(_meta(t))
        return {"embedding": policy.encoder(t["x"], t["edge_index"], t["edge_attr"], t["u"], t["batch"]),
                "scorer_logits": StateScorer(policy).eval()(*(t[k] for k in INPUTS)),
                "logits": dist.logits, "value": value}


def test_the_default_policy_scores_exactly_as_before(reference: dict) -> None:
    policy, _ = load_policy(default_policy_path())
    got = _outputs(policy.eval(), reference["inputs"])
    for key, want in reference["default"].items():
        assert torch.equal(got[key], want), key


@pytest.mark.parametrize("key", ["gat-max", "gatv2-attention", "gin-sum", "gcn-mean"])
def test_each_kind_keeps_its_weights_and_outputs(reference: dict, key: str) -> None:
    kind, pooling = key.split("-")
    torch.manual_seed(0)
    cfg = EncoderConfig(kind=kind, pooling=pooling, hidden=8, heads=2, layers=2)
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, cfg)).eval()
    assert type(policy.encoder) is ENCODERS[kind]
    stored = reference[key]["state_dict"]
    fresh = policy.state_dict()
    assert list(fresh) == list(stored)  # the same keys, in the same order
    assert all(torch.equal(fresh[k], stored[k]) for k in stored)  # a seed draws the same initial weights
    policy.load_state_dict(stored, strict=True)
    got = _outputs(policy, reference["inputs"])
    for out in ("embedding", "scorer_logits", "logits", "value"):
        assert torch.equal(got[out], reference[key][out]), out


def test_kind_validation_comes_from_the_table() -> None:
    with pytest.raises(ConfigError, match="unknown encoder 'nosuch'; choose one of: gat, gatv2, gin, gcn"):
        EncoderConfig(kind="nosuch")
    with pytest.raises(ConfigError, match="multiple of heads"):
        EncoderConfig(kind="gatv2", hidden=10, heads=4)
    EncoderConfig(kind="gin", hidden=10, heads=4)  # heads mean nothing to GIN
    with pytest.raises(ConfigError, match="subclass of GraphEncoder"):
        register_encoder("linear", nn.Linear)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a word"):
        register_encoder("two words", ENCODERS["gin"])


class MeanEncoder(GraphEncoder):
    """A kind defined outside xrl: h'_i = W [h_i, mean_{j in N(i)} (h_j + e_ji)]."""

    def make_conv(self, cfg: EncoderConfig) -> nn.Module:
        return nn.Linear(2 * cfg.hidden, cfg.hidden)

    def message_passing(self, conv: nn.Module, h: Tensor, edge_index: Tensor, e: Tensor | None, deg: Tensor | None,
                        n_out: int | None) -> Tensor:
        n = h.size(0) if n_out is None else n_out
        src, dst = edge_index
        return conv(torch.cat([h[:n], scatter(h[src] + e, dst, 0, dim_size=n, reduce="mean")], dim=1))


@pytest.fixture
def mean_kind():
    register_encoder("mean_test", MeanEncoder)
    yield "mean_test"
    del ENCODERS["mean_test"]  # other modules parametrise over ENCODERS


def test_a_registered_kind_trains_end_to_end(mean_kind: str) -> None:
    torch.manual_seed(0)
    cfg = PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(kind=mean_kind, hidden=16, layers=2))
    policy = GraphPolicy(cfg)
    assert isinstance(policy.encoder, MeanEncoder)
    env = GraphRewriteEnv(resolve_graph("tiny_cnn"), "analytic", horizon=4, max_candidates=8)
    env.reset(seed=0)
    incremental, whole = policy.features(), FeatureCache()
    obs, actions, logps, values, rewards, dones = [], [], [], [], [], []
    for _ in range(4):
        meta = incremental.observe(env)
        with torch.no_grad():
            dist, value = policy.eval()(meta)
            full, _ = policy(env.meta_graph(whole))
        # the base class's incremental encoding serves the new kind too: it equals encoding each candidate whole
        torch.testing.assert_close(dist.logits, full.logits, atol=1e-4, rtol=1e-4)
        action = dist.mode()
        obs.append(meta)
        actions.append(action)
        logps.append(dist.log_prob(action))
        values.append(value)
        _, reward, terminated, truncated, _ = env.step(int(action))
        rewards.append(float(reward))
        dones.append(float(terminated or truncated))
        if terminated or truncated:
            break
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    batch = RolloutBatch(obs, torch.cat(actions), torch.cat(logps), torch.cat(values), torch.tensor(rewards),
                         torch.tensor(dones))
    stats = ppo_update(policy, torch.optim.Adam(policy.parameters(), lr=1e-3), batch,
                       PPOConfig(update_epochs=1, minibatch_size=4), np.random.default_rng(0))
    assert np.isfinite(stats["loss"])
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items() if k.startswith("encoder.convs"))


def test_xrl_train_takes_a_registered_kind(mean_kind: str, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from xrl.cli.rl_commands import CONF_DIR
    from xrl.rl.checkpoint import load_policy as load
    from xrl.rl.train import train

    overrides = ["graphs=small", "env.horizon=2", "episodes_per_worker=1", "model.hidden=8", "model.layers=1",
                 "algo.minibatch_size=4", "algo.update_epochs=1", "eval_every=0", "logger=none", "progress=false",
                 "updates=1", "workers=0", f"model.kind={mean_kind}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)
    result = train(cfg, tmp_path)
    policy, _ = load(result.last_checkpoint)
    assert isinstance(policy.encoder, MeanEncoder) and policy.cfg.encoder.kind == mean_kind

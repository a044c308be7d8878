"""Issue 26, item 6 (checkpoints): every checkpoint xrl writes carries a checksum of its contents, and a
changed weight is refused wherever a checkpoint is loaded (`--policy`, `resume=`, `init_from=`, export)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_user_error, run

from xrl.errors import XrlWarning
from xrl.features.featurize import EDGE_DIM, GLOBAL_DIM, NODE_DIM
from xrl.nn.encoders import EncoderConfig
from xrl.nn.policy import GraphPolicy, PolicyConfig
from xrl.rl.checkpoint import (
    CheckpointError,
    default_policy_path,
    load_checkpoint,
    load_policy,
    save_checkpoint,
)


@pytest.fixture()
def saved(tmp_path):
    torch.manual_seed(0)
    policy = GraphPolicy(PolicyConfig(NODE_DIM, EDGE_DIM, GLOBAL_DIM, EncoderConfig(hidden=8, layers=1, heads=2)))
    optimizer = torch.optim.Adam(policy.parameters())
    return save_checkpoint(tmp_path / "last.pt", policy, optimizer=optimizer, update=1,
                           rng={"torch": torch.get_rng_state()}, config={"env": {}})


def _tamper(path, edit) -> None:
    """Change the file's contents as a careless tool or a bad disk would, keeping its stored checksum."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, path)


def _one_weight(ckpt) -> None:
    name = next(iter(ckpt["model"]))
    ckpt["model"][name].view(-1)[0] = -3510.0


def test_a_written_checkpoint_loads_and_carries_a_checksum(saved):
    with warnings.catch_warnings():
        warnings.simplefilter("error", XrlWarning)
        ckpt = load_checkpoint(saved)
        load_policy(saved)
    assert ckpt["checksum"].startswith("sha256:")


@pytest.mark.parametrize("edit", [
    _one_weight,
    lambda c: c.update(update=7),
    lambda c: c["config"].update(env={"horizon": 3}),
    lambda c: c.update(extra="added"),
    lambda c: c.pop("optimizer"),
])
def test_any_change_is_refused(saved, edit):
    _tamper(saved, edit)
    with pytest.raises(CheckpointError, match="do not match its checksum"):
        load_checkpoint(saved)


def test_the_cli_refuses_a_changed_weight(saved, tmp_path, capsys):
    _tamper(saved, _one_weight)
    code, _, err = run(capsys, "optimize", "mlp", "--search", "rl", "--policy", str(saved), "--prepass", "none",
                       "-o", str(tmp_path / "o.onnx"))
    assert_user_error(code, err, "checksum")
    assert not (tmp_path / "o.onnx").exists()
    code, _, err = run(capsys, "policy", "export", str(saved), "-o", str(tmp_path / "p.onnx"))
    assert_user_error(code, err, "checksum")


def test_resume_and_init_from_refuse_a_changed_weight(saved, tmp_path):
    from test_train_smoke import _cfg

    from xrl.rl.train import train

    _tamper(saved, _one_weight)
    for key in ("resume", "init_from"):
        with pytest.raises(CheckpointError, match="checksum"):
            train(_cfg(updates=2, workers=0, **{key: saved}), tmp_path / key)
        assert not (tmp_path / key / "best.pt").exists()


def test_the_shipped_policy_has_a_checksum():
    with warnings.catch_warnings():
        warnings.simplefilter("error", XrlWarning)
        assert load_checkpoint(default_policy_path())["checksum"].startswith("sha256:")


def test_an_old_checkpoint_without_checksum_loads_with_a_warning(saved):
    _tamper(saved, lambda c: c.pop("checksum"))
    with pytest.warns(XrlWarning, match="no checksum"):
        load_checkpoint(saved)


def test_pass_ordering_checkpoints_are_checked_too(tmp_path):
    from xrl.env.passes import PASSES
    from xrl.rl.pass_policy import PassPolicy, PassPolicyConfig, load_pass_checkpoint, obs_dim, save_pass_checkpoint

    path = save_pass_checkpoint(tmp_path / "p.pt", PassPolicy(PassPolicyConfig(obs_dim(), len(PASSES), 8, 1)))
    load_pass_checkpoint(path)
    _tamper(path, _one_weight)
    with pytest.raises(CheckpointError, match="checksum"):
        load_pass_checkpoint(path)


def test_policy_names_resolve_to_the_shipped_policies_and_paths_stay_paths(tmp_path):
    from xrl.rl.checkpoint import default_policy_path, resolve_policy_path, shipped_policy_names

    assert {"default", "expert"} <= set(shipped_policy_names())
    assert resolve_policy_path(None) == resolve_policy_path("default") == default_policy_path()
    assert resolve_policy_path("expert").name == "expert.pt" and resolve_policy_path("expert").is_file()
    assert resolve_policy_path("runs/x/best.pt") == Path("runs/x/best.pt")
    (tmp_path / "expert").write_bytes(b"")  # a file of that name here is the user's, not the shipped one
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve_policy_path("expert") == Path("expert")
    finally:
        os.chdir(cwd)
    from xrl.rl.policy_files import PolicyNotFound

    with pytest.raises(PolicyNotFound, match="not a shipped policy .*expert"):
        resolve_policy_path("nosuch")

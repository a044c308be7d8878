"""xrl on a real two-node Ray cluster started on this machine: rollouts on actors of both nodes (and a killed
one replayed), `xrl train collector=ray`, measurement actors against the local backend, the shared op-timing
cache (two nodes, a killed cache actor), and a sweep through the Hydra Ray launcher.

One module-scoped cluster for the whole file (about 10 s to start). Skipped only where Ray is missing or
cannot start here.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3

import pytest
import torch
from test_train_smoke import FAST, _cfg

from xrl.cli import main
from xrl.env import resolve_graph
from xrl.nn import GraphPolicy
from xrl.rl.rollout import CollectorSpec, LocalCollector
from xrl.rl.train import policy_config

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'xrl[ray]')")
# Under pytest-xdist with --dist loadgroup, the whole file runs in one worker (one cluster).
pytestmark = pytest.mark.xdist_group("ray")

MB = 2**20


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine, 2 logical CPUs each, told apart by a custom resource (head, worker)."""
    from ray.cluster_utils import Cluster

    c = None
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 4},
                                                         "object_store_memory": 80 * MB, "include_dashboard": False})
        c.add_node(num_cpus=2, resources={"worker": 4}, object_store_memory=80 * MB)
        ray.init(address=c.address)
    except Exception as e:  # noqa: BLE001 - any reason Ray cannot run here is a skip, said once
        if c is not None:
            c.shutdown()
        pytest.skip(f"Ray cannot start a local cluster here: {type(e).__name__}: {e}")
    yield c
    ray.shutdown()
    c.shutdown()
    assert not ray.is_initialized()


def _spec() -> tuple[CollectorSpec, dict]:
    cfg = _cfg()
    spec = CollectorSpec(graphs=("mlp", "tiny_cnn"), policy=policy_config(cfg["model"]), env=cfg["env"],
                         episodes_per_worker=2, seed=5)
    torch.manual_seed(0)
    return spec, GraphPolicy(spec.policy).state_dict()


def test_rollout_actors_on_both_nodes_play_what_the_workers_play_and_replay_a_killed_one(cluster):
    from xrl.distributed.ray_collector import RayCollector

    spec, weights = _spec()
    # LocalCollector(workers=2) plays what ProcessCollector(workers=2) plays (tests/test_train_smoke.py)
    local = LocalCollector(spec, workers=2).collect(weights, update=3)
    with RayCollector(spec, actors=2) as col:
        where = col.where()
        assert len({node for _, node in where}) == 2  # one actor per node
        first = col.collect(weights, update=3)
        assert first.actions == local.actions and first.rewards == pytest.approx(local.rewards)
        assert [e.graph for e in first.episodes] == [e.graph for e in local.episodes]
        assert col.timings["wall_s"] >= col.timings["actor_max_s"] > 0

        pending = col.submit_collect(weights, update=3)
        os.kill(where[1][0], signal.SIGKILL)  # actor 1 dies while its episodes are being played
        again = col.gather_collect(pending)
        assert col.restarts == 1
        assert again.actions == local.actions and again.rewards == pytest.approx(local.rewards)
        assert col.where()[1][0] != where[1][0]
        evals = col.evaluate(weights, ["tiny_cnn", "mlp", "tiny_cnn"])
        assert [e.graph for e in evals] == ["tiny_cnn", "mlp", "tiny_cnn"]


def test_xrl_train_collector_ray_two_updates_with_measured_rewards(cluster, tmp_path, capsys):
    # rewards from per-op timings taken on a measurement actor, through the cluster's cache actor into one file
    cache = tmp_path / "op_costs.sqlite"
    code = main(["train", *FAST, "updates=2", "cost=op", "collector=ray", f"collector.address={cluster.address}",
                 "collector.actors=2", "collector.measure_actors=1", f"collector.cache_path={cache}",
                 f"hydra.run.dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "trained 2 updates" in out
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2] and lines[-1]["episodes"] == 4  # 2 actors x 2 episodes
    assert sqlite3.connect(cache).execute("SELECT COUNT(*) FROM op_timings_v2").fetchone()[0] > 0
    assert not ray.util.list_named_actors(all_namespaces=True)  # the run's cache actor stopped with it


@pytest.mark.parametrize("override, needle", [("collector.actors=0", "actors must be at least 1"),
                                              ("collector.max_restarts=x", "max_restarts must be int"),
                                              ("collector.actors=9", "needs 9 CPUs")])  # the cluster has 4
def test_bad_ray_settings_are_one_line_user_errors(cluster, override, needle, tmp_path, capsys):
    code = main(["train", *FAST, "updates=1", "collector=ray", override, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_an_unreachable_address_is_a_user_error_at_once():
    from xrl.distributed.ray_collector import probe_address
    from xrl.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot join the Ray cluster"):
        probe_address("127.0.0.1:1")  # nothing listens on port 1
    with pytest.raises(ConfigError, match="host:port"):
        probe_address("nohost")


def test_measurement_actors_and_the_shared_cache_across_nodes(cluster, tmp_path):
    from xrl.cost import get_cost_model
    from xrl.distributed.ray_service import RemoteCostModel, RemoteTimingCache, cache_actor, start_measurement_actors

    path = tmp_path / "op_costs.sqlite"
    cache = cache_actor(path)
    opts = {"repeats": 3, "warmup": 1, "min_sample_s": 1e-4}
    try:
        on_head = start_measurement_actors("op", "cpu", opts, resources={"head": 1}, cache=cache)
        on_worker = start_measurement_actors("op", "cpu", opts, resources={"worker": 1}, cache=cache)
        assert ray.get(on_head[0].where.remote())[1] != ray.get(on_worker[0].where.remote())[1]
        graph = resolve_graph("mlp")

        head = RemoteCostModel(on_head)
        cost = head.cost(graph)  # measured on the head node, committed to the shared file
        assert cost > 0 and head.per_op and head.name == "op"
        assert ray.get(on_head[0].stats.remote())["measured"] > 0
        worker = RemoteCostModel(on_worker)
        assert worker.cost(graph) == cost  # the other node measures nothing: every timing from the cache
        stats = ray.get(on_worker[0].stats.remote())
        assert stats["measured"] == 0 and stats["cache_hits"] > 0

        # the local backend on the same file: the same API, the same numbers
        local = get_cost_model("op", device="cpu", cache_path=path, **opts)
        assert local.cost(graph) == pytest.approx(cost, rel=1e-12)
        for n in graph.nodes.values():
            assert worker.op_cost(n, graph) == local.op_cost(n, graph)
        assert worker.measure(graph).median_s == pytest.approx(local.measure(graph).median_s, rel=1e-12)
        assert local.stats["measured"] == 0 and worker.measured == local.measured

        # kill the cache actor: Ray restarts it on its node, on its file, and every committed timing is there
        entries = len(RemoteTimingCache(cache))
        key, device = sqlite3.connect(path).execute("SELECT key, device FROM op_timings_v2 LIMIT 1").fetchone()
        before = RemoteTimingCache(cache).get(key, device)
        pid = ray.get(cache.where.remote())[1]
        os.kill(pid, signal.SIGKILL)
        assert len(RemoteTimingCache(cache)) == entries > 0
        assert RemoteTimingCache(cache).get(key, device) == before
        assert ray.get(cache.where.remote())[1] != pid

        # a whole-graph backend: measured on an actor, sensible against the same backend measured here
        ort = RemoteCostModel(start_measurement_actors("ort", "cpu", {"repeats": 5, "warmup": 2}))
        assert not ort.per_op and ort.measured
        here = get_cost_model("ort", device="cpu", repeats=5, warmup=2).cost(graph)
        assert 0.2 < ort.cost(graph) / here < 5
        assert ort.remeasure(graph).median_s > 0
    finally:
        ray.kill(cache, no_restart=True)


def test_a_sweep_through_the_hydra_ray_launcher(cluster, tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher",
                        reason="hydra-ray-launcher is not installed (pip install --no-deps hydra-ray-launcher)")
    try:
        code = main(["train", "-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={cluster.address}",
                     *FAST, "updates=1", "workers=0", "seed=0,1", f"hydra.sweep.dir={tmp_path}"])
    except SystemExit as e:  # Hydra exits when a job raised: show why
        pytest.fail(f"the sweep exited with {e.code}: {capsys.readouterr().err[-3000:]}")
    assert code == 0
    for run in ("0", "1"):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["update"] == 1
        assert f"seed={run}" in (tmp_path / run / ".hydra" / "overrides.yaml").read_text()

"""Collectors are plug-ins: the entry-point group `xrl.collectors` fills the table `collector.kind` picks from."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from test_train_smoke import _cfg

from xrl.errors import ConfigError
from xrl.rl.collectors import available_collectors, collector_class, make_collector
from xrl.rl.rollout import CollectorSpec, LocalCollector, ProcessCollector, RolloutCollector
from xrl.rl.train import policy_config, train

FAKE_MODULE = '''
from xrl.rl.rollout import LocalCollector

CALLS = []


class CountingCollector(LocalCollector):
    """Plays in this process, as `local`, and counts the calls the training loop makes."""

    @classmethod
    def from_config(cls, name, spec, workers, options):
        CALLS.append(("from_config", name, dict(options)))
        return cls(spec, 1)

    def collect(self, weights, update):
        CALLS.append(("collect", update))
        return super().collect(weights, update)

    def evaluate(self, weights, graphs):
        CALLS.append(("evaluate", tuple(graphs)))
        return super().evaluate(weights, graphs)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A distribution on sys.path, as `pip install` leaves it: its module and a dist-info with entry_points.txt."""
    root = tmp_path / "site"
    (root / "xrl_counting_collector-0.1.dist-info").mkdir(parents=True)
    (root / "xrl_counting_collector-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: xrl-counting-collector\nVersion: 0.1\n")
    (root / "xrl_counting_collector-0.1.dist-info" / "entry_points.txt").write_text(textwrap.dedent("""\
        [xrl.collectors]
        counting = xrl_counting_collector:CountingCollector
        not_a_collector = json:dumps
        """))
    (root / "xrl_counting_collector.py").write_text(FAKE_MODULE)
    monkeypatch.syspath_prepend(str(root))  # also invalidates the import caches
    import xrl_counting_collector

    yield xrl_counting_collector
    sys.modules.pop("xrl_counting_collector", None)  # the next test imports a fresh one (its CALLS empty)


def test_xrl_registers_its_collectors_as_entry_points():
    table = available_collectors()
    assert {"process", "local", "ray"} <= set(table)
    assert table["ray"].value == "xrl.distributed.ray_collector:RayCollector"  # loaded only when chosen
    assert collector_class("process") is ProcessCollector and collector_class("local") is LocalCollector


def test_a_collector_added_through_the_entry_point_group_trains(plugin, tmp_path):
    cfg = {**_cfg(updates=1, workers=0), "collector": {"kind": "counting", "note": 1}}
    summary = train(cfg, tmp_path)
    kinds = [call[0] for call in plugin.CALLS]
    assert kinds == ["from_config", "collect", "evaluate"], plugin.CALLS
    assert plugin.CALLS[0] == ("from_config", "counting", {"note": 1})  # the section's other settings reach it
    assert summary.last_checkpoint.exists() and summary.best_checkpoint is not None
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1] and "eval_speedup_mean" in lines[0]


def test_unknown_or_bad_collectors_are_one_line_config_errors(plugin):
    cfg = _cfg()
    spec = CollectorSpec(graphs=("mlp",), policy=policy_config(cfg["model"]), env=cfg["env"], episodes_per_worker=1)
    with pytest.raises(ConfigError, match="unknown collector 'nosuch'; choose one of: counting, local, "
                                          "not_a_collector, process, ray"):
        make_collector(spec, 0, {"kind": "nosuch"})
    with pytest.raises(ConfigError, match="json:dumps.* is not a RolloutCollector subclass"):
        make_collector(spec, 0, {"kind": "not_a_collector"})
    with pytest.raises(ConfigError, match="collector 'local' has no setting 'actors'"):
        make_collector(spec, 0, {"kind": "local", "actors": 2})
    with make_collector(spec, 0, {"kind": "process"}) as c:  # no workers: this process
        assert isinstance(c, LocalCollector) and isinstance(c, RolloutCollector)

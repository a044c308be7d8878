"""The research recipe's parts (issue 32.5): the suite's generated graphs by name, the `reference` teacher."""

from __future__ import annotations

import pytest
from xrl.graphs.conflicts import conflict_graph

from xrl import graphs
from xrl.errors import UnknownGraphError
from xrl.frontends.loader import load_model
from xrl.rl.imitation import ImitationConfig, reference_run, teacher_runs
from xrl.search import suite


def test_generated_suite_graphs_resolve_by_name():
    assert graphs.build("gen_sum_trap_2") == conflict_graph("gen_sum_trap", 2)
    g = load_model("gen_lora_trap_0").graph  # what `graphs.train=[gen_lora_trap_0]` trains on
    assert suite.load_references()["gen_lora_trap_0"].matches(g)
    for bad in ("gen_sum_trap_x", "gen_nope_1", "gen_sum_trap_"):
        with pytest.raises(UnknownGraphError):
            graphs.build(bad)


def test_reference_teacher_replays_the_suites_sequence():
    cost = suite.cost_model()
    ref = suite.load_references()["gen_sum_trap_2"]
    graph = load_model("gen_sum_trap_2").graph
    steps, speedup = reference_run("gen_sum_trap_2", graph, cost)
    assert steps == ref.steps and speedup == pytest.approx(ref.gain, rel=1e-6)
    assert ref.raising + ref.neutral + ref.non_greedy > 0  # what greedy would not take: the point of cloning it
    assert reference_run("mlp", load_model("mlp").graph, cost) is None  # not a suite graph: no demonstration

    runs = teacher_runs({"gen_sum_trap_2": graph, "mlp": load_model("mlp").graph}, cost,
                        ImitationConfig(teachers=("reference",)))
    assert set(runs) == {"gen_sum_trap_2"} and runs["gen_sum_trap_2"][0] == "reference"
    assert runs["gen_sum_trap_2"][2] > ref.original_cost / ref.greedy_cost  # beyond greedy's result

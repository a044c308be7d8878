"""The one search registry, the one geomean, the one atomic write and the one loader's rule for names."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import onnx
import pytest
from cli_helpers import assert_user_error, run

from xrl.search import registry
from xrl.search.result import SearchResult

XRL = Path(__file__).resolve().parent.parent / "xrl"


@pytest.fixture
def table(monkeypatch):
    """The registry's table as it is now, restored after the test (registrations are process-wide)."""
    monkeypatch.setattr(registry, "_SEARCHES", dict(registry.searches()))
    monkeypatch.setattr(registry, "_PLUGINS", dict(registry._PLUGINS))
    return registry._SEARCHES


def first_rewrite(graph, cost, *, seed, steps, time_limit, **options):  # noqa: ANN001, ANN003, ANN201
    """A third-party search: one greedy step, whatever the caller asked for."""
    from xrl.search.greedy import greedy_search

    res = greedy_search(graph, cost, max_steps=1)
    return SearchResult(graph=res.graph, steps=list(res.steps), details={"seen": res.explored, **options})


# ----- the search registry ---------------------------------------------------------------------
def test_a_registered_search_runs_through_xrl_optimize(table, capsys, tmp_path):
    registry.register_search("first_rewrite", first_rewrite, description="the first rewrite offered")
    out = tmp_path / "o.onnx"
    code, stdout, err = run(capsys, "optimize", "mlp", "--search", "first_rewrite", "--target", "paper", "-o",
                            str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["search"] == "first_rewrite" and doc["rewrites"] == 1 and doc["details"]["seen"] > 0
    assert onnx.load(str(out)).graph.node
    for command in ("optimize", "compare"):
        with pytest.raises(SystemExit):
            run(capsys, command, "--help")
        assert "first_rewrite" in re.sub(r"\s+", " ", capsys.readouterr().out)


def test_building_the_parsers_reads_no_entry_points(table, monkeypatch, capsys):
    """The names are listed when help is printed: another command does not pay for the entry-point scan."""
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    code, _, err = run(capsys, "rules", "list", "--json")
    assert code == 0, err
    assert not registry._plugins_loaded


def test_a_registered_search_runs_in_compare(table):
    from xrl.search.compare import CompareConfig, resolve_methods, run_compare

    registry.register_search("first_rewrite", first_rewrite)
    assert resolve_methods("greedy,first_rewrite") == ("greedy", "first_rewrite")
    [rec] = run_compare(CompareConfig(graphs=("mlp",), methods=("first_rewrite",)))
    assert rec.status == "ok" and rec.rewrites == 1, rec.error


def test_an_unknown_search_is_a_user_error_that_lists_every_registered_name(table, capsys):
    registry.register_search("first_rewrite", first_rewrite)
    code, _, err = run(capsys, "optimize", "mlp", "--search", "nosuch")
    assert_user_error(code, err, "'nosuch'", "first_rewrite", *registry.search_names())
    from xrl.errors import ConfigError
    from xrl.search.compare import resolve_methods

    with pytest.raises(ConfigError, match="first_rewrite"):
        resolve_methods("nosuch")


def test_the_table_holds_the_builtins_rl_and_their_flags(table):
    names = registry.search_names()
    assert names[:7] == ("none", "greedy", "random", "taso", "tensat", "beam", "exhaustive") and "rl" in names
    assert [n for n in names if registry.get_search(n).roofline_alternative] == ["greedy"]
    assert not registry.get_search("tensat").default_time_limit  # its saturation and ILP have limits of their own
    assert registry.get_search("rl").requires == ("xrl.rl.rl_search",)
    from xrl import api

    assert api.register_search is registry.register_search and api.run_search is registry.run_search  # re-exports


def test_a_name_registered_in_code_is_kept_by_a_later_registration_that_does_not_replace(table):
    registry.register_search("first_rewrite", first_rewrite)
    kept = registry.register_search("first_rewrite", lambda *a, **k: None, replace=False)
    assert kept.runner is first_rewrite
    with pytest.raises(Exception, match="letters, digits"):
        registry.register_search("no spaces", first_rewrite)


def fake_distribution(monkeypatch, tmp_path: Path, name: str, entry_points: str,  # noqa: ANN001
                      modules: dict[str, str] | None = None) -> None:
    """An installed distribution `name` on sys.path with `entry_points` (an entry_points.txt body) and `modules`
    (module name -> source), and the registry set to read its entry-point groups again on the next lookup."""
    site = tmp_path / "site"
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for module, source in (modules or {}).items():
        (site / f"{module}.py").write_text(source)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_plugins_loaded", False)  # read the groups again, with the fake on the path


def test_a_plugin_from_the_entry_point_group_is_listed_then_imported_when_it_runs(table, monkeypatch, capsys,
                                                                                 tmp_path):
    fake_distribution(monkeypatch, tmp_path, "xrl_fake_plugin",
                      f"[{registry.ENTRY_POINT_GROUP}]\nfake_first = xrl_fake_plugin_module:first\n"
                      "fake_entry = xrl_fake_plugin_module:ENTRY\n", {"xrl_fake_plugin_module": (
        "from xrl.search.result import SearchResult\n\n\n"
        "def first(graph, cost, *, seed, steps, time_limit, **options):\n"
        "    from xrl.search.greedy import greedy_search\n\n"
        "    res = greedy_search(graph, cost, max_steps=1)\n"
        "    return SearchResult(graph=res.graph, steps=list(res.steps), details={'plugin': True})\n\n\n"
        "from xrl.search.registry import SearchEntry\n\n"
        "ENTRY = SearchEntry('any', first, 'one greedy step', default_time_limit=False)\n")})

    assert "fake_first" in registry.search_names()
    assert "xrl_fake_plugin_module" not in sys.modules  # listed from the metadata alone
    code, out, err = run(capsys, "optimize", "mlp", "--search", "fake_first", "--target", "paper", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["search"] == "fake_first" and doc["details"] == {"plugin": True} and doc["rewrites"] == 1
    assert "xrl_fake_plugin_module" in sys.modules
    entry = registry.get_search("fake_entry")  # a SearchEntry: its flags, under the entry point's name
    assert entry.name == "fake_entry" and not entry.default_time_limit and entry.description == "one greedy step"


def test_a_plugin_that_does_not_import_is_reported_unavailable_by_compare(table, monkeypatch, tmp_path):
    from xrl.search.compare import CompareConfig, run_compare

    fake_distribution(monkeypatch, tmp_path, "xrl_broken_plugin",
                      f"[{registry.ENTRY_POINT_GROUP}]\nbroken = xrl_no_such_plugin_module:run\n")
    [rec] = run_compare(CompareConfig(graphs=("mlp",), methods=("broken",)))
    assert rec.status == "unavailable" and "xrl_no_such_plugin_module" in rec.error


def test_a_search_provider_registers_its_rows_in_order_and_a_broken_one_only_warns(table, monkeypatch, tmp_path):
    """xrl's RL searches reach the registry as a provider of the group `xrl.search_providers` (pyproject.toml):
    the registry imports nothing above it, and "rl" and its ablations keep their order and descriptions."""
    fake_distribution(monkeypatch, tmp_path, "xrl_fake_provider",
                      f"[{registry.PROVIDER_GROUP}]\nbroken = xrl_no_such_provider_module:register\n"
                      "fake = xrl_fake_provider_module:register\n", {"xrl_fake_provider_module": (
                          "from xrl.search.registry import register_search\n\n\n"
                          "def register():\n"
                          "    for name in ('zz-second', 'aa-third'):\n"
                          "        register_search(name, lambda *a, **k: None, description=name, replace=False)\n")})
    with pytest.warns(UserWarning, match="xrl_no_such_provider_module"):
        names = registry.search_names()
    assert names.index("zz-second") + 1 == names.index("aa-third")  # the provider's order, not sorted
    rl = names.index("rl")
    assert names[rl:rl + 5] == ("rl", "rl-untrained", "rl-uniform", "rl-cost", "rl-argmax")
    assert registry.get_search("rl").description.startswith("a trained policy")


def test_listing_the_searches_imports_no_training_code():
    """`--search rl --policy FILE.onnx` runs without xrl.rl (tests/test_policy_export.py): the registry's
    first lookup must not import it."""
    import subprocess

    code = ("import sys; from xrl.search.registry import search_names, get_search; "
            "assert 'rl' in search_names() and get_search('rl'); "
            "assert not [m for m in sys.modules if m == 'xrl.rl' or m.startswith('xrl.rl.')], sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_no_module_below_the_api_imports_it():
    """The registry and cost factory live below xrl.api: only the CLI (above it) may import it."""
    offenders = []
    for path in XRL.rglob("*.py"):
        rel = path.relative_to(XRL).as_posix()
        if rel == "api.py" or rel.startswith("cli/"):
            continue
        if re.search(r"^\s*(from xrl\.api import|import xrl\.api|from xrl import api\b)", path.read_text(), re.M):
            offenders.append(rel)
    assert offenders == []


# ----- the one cost factory --------------------------------------------------------------------
def test_the_cost_factory_resolves_devices_and_kernel_targets():
    from xrl.cost import AnalyticCostModel, TargetCostModel, get_cost_model
    from xrl.cost.devices import this_machine_profile

    assert get_cost_model("analytic").device.name == "h100"
    assert get_cost_model("analytic", device="auto").device.name == this_machine_profile()
    paper = get_cost_model("roofline", target="paper")  # every op a kernel: the analytic model on its profile
    assert type(paper) is AnalyticCostModel and paper.device.name == "h100"
    assert type(get_cost_model("target", device="auto", target="ort-cpu")) is TargetCostModel  # roofline in tests


# ----- the one geomean -------------------------------------------------------------------------
def test_geomean_skips_what_is_not_a_ratio_and_is_nan_without_any():
    from xrl.stats import geomean, geomean_values

    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean(iter([2.0, 8.0])) == pytest.approx(4.0)
    skipped = [math.nan, math.inf, -math.inf, 0.0, -3.0]
    assert geomean([1.0, 4.0, *skipped]) == pytest.approx(2.0)
    assert geomean_values([*skipped, 5.0]) == [5.0]
    assert math.isnan(geomean([])) and math.isnan(geomean(skipped))


def test_eval_and_compare_share_the_geomean():
    from xrl.cli import rl_commands
    from xrl.env import pass_order
    from xrl.search import compare
    from xrl.stats import geomean

    assert rl_commands.geomean is geomean and pass_order.geomean is geomean and compare.geomean is geomean


# ----- the one atomic write --------------------------------------------------------------------
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    from xrl.atomic import write_atomic

    path = tmp_path / "f.bin"
    write_atomic(path, b"old")

    def chunks():
        yield b"new, half"
        raise KeyboardInterrupt  # Ctrl-C, or the SIGTERM the CLI raises, mid-write

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, chunks())
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_an_atomic_write_has_a_temporary_of_its_own_and_ordinary_permissions(tmp_path):
    from xrl.atomic import atomic_write, temp_prefix, write_atomic

    path = tmp_path / "s.json"
    with atomic_write(path) as a, atomic_write(path) as b:  # two writers of one file at once
        assert a.temp != b.temp and a.temp.name.startswith(temp_prefix(path)) and str(os.getpid()) in a.temp.name
        a.temp.write_text("a")
        b.temp.write_text("b")
    assert path.read_text() == "a" and os.listdir(tmp_path) == ["s.json"]  # the last to finish wins, whole
    mask = os.umask(0)
    os.umask(mask)
    assert write_atomic(path, "text").stat().st_mode & 0o777 == 0o666 & ~mask


def test_compare_results_are_written_atomically(tmp_path, monkeypatch):
    from xrl.search import compare
    from xrl.search.compare import RunRecord, write_results

    records = [RunRecord("mlp", "greedy", "ok", 1.0, 0.5, 2.0, 0.1, 3, True, 0.0, 5, 4)]
    write_results(records, tmp_path)
    before = (tmp_path / "results.csv").read_text()
    monkeypatch.setattr(compare, "CSV_COLUMNS", compare.CSV_COLUMNS[:-1])  # the writer fails after the header
    with pytest.raises(ValueError):
        write_results(records, tmp_path)
    assert (tmp_path / "results.csv").read_text() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# ----- the one loader's rule -------------------------------------------------------------------
def test_one_rule_decides_built_in_name_or_file_everywhere(tmp_path, monkeypatch):
    """A suffix, a slash or an existing file means a file; anything else names a built-in graph. The
    environments' resolve_graph follows the loader, so a file named like a graph is read as the file."""
    from xrl import graphs
    from xrl.env import resolve_graph
    from xrl.errors import ModelLoadError
    from xrl.frontends.loader import load_model, names_a_file

    monkeypatch.chdir(tmp_path)
    assert not names_a_file("mlp") and names_a_file("x.onnx") and names_a_file("dir/x")
    assert load_model("mlp").kind == "builtin" and len(resolve_graph("mlp")) == len(load_model("mlp").graph)
    for missing in ("no_such.onnx", "sub/no_such"):
        with pytest.raises(ModelLoadError, match="no such file"):
            load_model(missing)
        with pytest.raises(ModelLoadError, match="no such file"):
            resolve_graph(missing)
    onnx.save(graphs.build("tiny_cnn"), str(tmp_path / "mlp"))  # a file in the way of a built-in name
    assert names_a_file("mlp") and load_model("mlp").kind == "onnx"
    assert len(resolve_graph("mlp")) == len(load_model("mlp").graph) == len(load_model("tiny_cnn").graph)

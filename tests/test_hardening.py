"""Hostile and careless inputs (issue 14): bounded memory, user errors, one JSON document, bounded rules."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import assert_user_error, run
from onnx import TensorProto, helper, numpy_helper

from xrl.errors import XrlError
from xrl.frontends.onnx_io import from_onnx
from xrl.limits import MAX_ELEMENTS_ENV, TensorTooLargeError


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def constant_of_shape_model(dims: list[int]) -> onnx.ModelProto:
    """A ConstantOfShape of `dims` reshaped flat: a couple of hundred bytes asking for prod(dims) floats."""
    shape = numpy_helper.from_array(np.array(dims, dtype=np.int64), "shp")
    tgt = numpy_helper.from_array(np.array([-1], dtype=np.int64), "tgt")
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["big"]),
             helper.make_node("Reshape", ["big", "tgt"], ["flat"]),
             helper.make_node("Relu", ["x"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                  [helper.make_tensor_value_info("flat", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape, tgt])


# ----- item 1: constant folding checks sizes before it allocates --------------------------------
def test_tiny_model_asking_for_terabytes_is_a_user_error(capsys, tmp_path):
    p = tmp_path / "bomb.onnx"
    onnx.save(constant_of_shape_model([100000, 100000, 100]), p)
    assert p.stat().st_size < 300
    code, _, err = run(capsys, "info", str(p))
    assert_user_error(code, err, "'big'", "1,000,000,000,000 elements", MAX_ELEMENTS_ENV)


def test_fold_of_unknown_shape_is_bounded_before_evaluation(monkeypatch):
    # 5,000 leading ones make the shape input too big for shape inference's data propagation, so the
    # output shape is unknown when the folder meets it: it must bound the size from the input values.
    monkeypatch.setenv(MAX_ELEMENTS_ENV, str(10**6))
    model = constant_of_shape_model([1] * 5000 + [4000, 4000])
    tracemalloc.start()
    try:
        with pytest.raises(TensorTooLargeError, match="16,000,000 elements"):
            from_onnx(model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"allocated {peak} bytes before refusing"


def test_limit_can_be_raised(monkeypatch):
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "10")
    with pytest.raises(TensorTooLargeError):
        from_onnx(constant_of_shape_model([4, 4]))
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "100")
    g = from_onnx(constant_of_shape_model([4, 4]))
    assert g.types["flat"].shape == (16,)


def test_bad_limit_is_a_user_error(monkeypatch):
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "lots")
    with pytest.raises(XrlError, match=MAX_ELEMENTS_ENV):
        from_onnx(constant_of_shape_model([4, 4]))


@pytest.fixture()
def relu_file(tmp_path: Path):
    def make(dims) -> Path:
        p = tmp_path / "relu.onnx"
        onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], []), p)
        return p
    return make


# ----- item 2: huge dimensions are user errors naming the input, before any allocation -------------
def test_huge_input_dim_in_file(capsys, relu_file, tmp_path):
    code, _, err = run(capsys, "optimize", str(relu_file([1000000000, 8])), "--search", "none",
                       "-o", str(tmp_path / "out.onnx"))
    assert_user_error(code, err, "input 'x'", "8,000,000,000 elements")


@pytest.mark.parametrize("shape", ["1000000000,8", "99999999999999999999999,8"])
def test_huge_input_shape_option(capsys, relu_file, shape):
    code, _, err = run(capsys, "info", str(relu_file(["n", 8])), "--input-shape", f"x={shape}")
    assert_user_error(code, err, "input 'x'", shape)


def test_huge_hlo_parameter(capsys, tmp_path):
    p = tmp_path / "huge.hlo"
    p.write_text("HloModule m\n\nENTRY main {\n  x = f32[1000000000] parameter(0)\n  c = f32[] constant(0)\n"
                 "  b = f32[1000000000] broadcast(c), dimensions={}\n  ROOT y = f32[1000000000] maximum(x, b)\n}\n")
    code, _, err = run(capsys, "optimize", str(p), "--search", "none", "-o", str(tmp_path / "o.onnx"))
    assert_user_error(code, err, "line 4", "parameter 'x'", "1,000,000,000 elements")


def test_hlo_dimension_with_thousands_of_digits(capsys, tmp_path):
    p = tmp_path / "digits.hlo"
    p.write_text("HloModule m\n\nENTRY main {\n  ROOT x = f32[" + "9" * 5000 + "] parameter(0)\n}\n")
    code, _, err = run(capsys, "info", str(p))
    assert_user_error(code, err, "line 4", "5000 digits")


def test_memory_error_is_a_user_error(capsys, monkeypatch, relu_file):
    import xrl.cli.commands as commands

    def boom(*a, **k):
        raise MemoryError("Unable to allocate 7.45 GiB")
    monkeypatch.setattr(commands, "load_model", boom, raising=False)
    monkeypatch.setattr("xrl.frontends.loader.load_model", boom)
    code, _, err = run(capsys, "info", str(relu_file([2])))
    assert_user_error(code, err, "out of memory")


# ----- item 3: HLO nesting and recursion ---------------------------------------------------------
def _hlo(tmp_path: Path, text: str) -> str:
    p = tmp_path / "m.hlo"
    p.write_text(text)
    return str(p)


def test_hlo_tuple_nested_5000_deep(capsys, tmp_path):
    d = 5000
    p = _hlo(tmp_path, "HloModule m\n\nENTRY main {\n  ROOT x = " + "(" * d + "f32[2]" + ")" * d + " parameter(0)\n}\n")
    code, _, err = run(capsys, "info", p)
    assert_user_error(code, err, "line 4", "nested more than")


def test_hlo_inline_bodies_nested_deep(capsys, tmp_path):
    d = 3000
    body = "".join(f"call(x), to_apply={{ a{i} = f32[2] parameter(0)\n ROOT b{i} = f32[2] " for i in range(d))
    p = _hlo(tmp_path, "HloModule m\n\nENTRY main {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] " + body
             + "negate(a)" + "}" * d + "\n}\n")
    code, _, err = run(capsys, "info", p)
    assert_user_error(code, err, "nested more than")


@pytest.mark.parametrize(("f_calls", "cycle"), [("f", "f -> f"), ("g", "f -> g -> f")])
def test_hlo_recursive_computation(capsys, tmp_path, f_calls, cycle):
    p = _hlo(tmp_path, f"""HloModule m

f {{
  a = f32[2] parameter(0)
  ROOT r = f32[2] call(a), to_apply={f_calls}
}}

g {{
  a = f32[2] parameter(0)
  ROOT r = f32[2] call(a), to_apply=f
}}

ENTRY main {{
  x = f32[2] parameter(0)
  ROOT y = f32[2] call(x), to_apply=f
}}
""")
    code, _, err = run(capsys, "info", p)
    assert_user_error(code, err, "recursive", cycle)


def test_hlo_call_chain_too_deep(capsys, tmp_path):
    n = 3000
    comps = [f"f{i} {{\n  a = f32[2] parameter(0)\n  ROOT r = f32[2] call(a), to_apply=f{i + 1}\n}}\n"
             for i in range(n - 1)]
    comps.append(f"f{n - 1} {{\n  a = f32[2] parameter(0)\n  ROOT r = f32[2] negate(a)\n}}\n")
    p = _hlo(tmp_path, "HloModule m\n\n" + "\n".join(comps)
             + "\nENTRY main {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] call(x), to_apply=f0\n}\n")
    code, _, err = run(capsys, "info", p)
    assert_user_error(code, err, "nested calls")


# ----- item 6: --json prints exactly one JSON document on stdout ----------------------------------
def two_matmul_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    ws = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), f"w{i}") for i in (1, 2)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ws)


def test_json_output_is_one_document_with_tensat(tmp_path):
    import json
    import subprocess
    import sys

    p = tmp_path / "m.onnx"
    onnx.save(two_matmul_model(), p)
    proc = subprocess.run([sys.executable, "-m", "xrl", "optimize", str(p), "--search", "tensat", "--cost", "analytic",
                           "--json", "--time-limit", "5", "-o", str(tmp_path / "o.onnx")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the HiGHS banner used to come first
    assert doc["verified"] is True
    assert "HiGHS" not in proc.stderr


def test_stdout_reserved_moves_native_writes_to_stderr(capfd):
    import os

    from xrl.quiet import native_stdout_silenced

    with native_stdout_silenced():
        os.write(1, b"banner\n")
    out, _ = capfd.readouterr()
    assert "banner" not in out


# ----- item 9: unknown HLO ops are named at load time and in verification failures -----------------
FROB_HLO = "HloModule m\n\nENTRY main {\n  x = f32[4] parameter(0)\n  y = f32[4] frobnicate(x)\n" \
           "  ROOT z = f32[4] add(y, x)\n}\n"


def test_unknown_hlo_op_warned_at_load(tmp_path):
    from xrl.errors import XrlWarning
    from xrl.frontends.hlo import parse_hlo

    with pytest.warns(XrlWarning, match=r"unknown HLO op 'frobnicate' \(line 5, %y\)"):
        parse_hlo(FROB_HLO)


def test_unknown_hlo_op_cli_warning_and_verification_error(capsys, tmp_path):
    p = _hlo(tmp_path, FROB_HLO)
    code, _, err = run(capsys, "cost", p)
    assert code == 0
    assert err.strip().startswith("xrl: warning:") and "frobnicate" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "optimize", p, "-o", str(tmp_path / "o.onnx"))
    assert code == 2
    assert "xrl: error:" in err and "node 'y' is op 'frobnicate'" in err


# ----- item 8: rule-file expressions are bounded and report file:line ------------------------------
@pytest.mark.parametrize(("condition", "problem"), [
    ("10 ** 10 ** 9 > 0", "bits"),
    ("sum(range(10**12)) > 0", "range of 1,000,000,000,000 items"),
    ("len((1,) * 10**12) > 0", "items"),
    ("prod(range(1, 99999)) > 0", "bits"),
])
def test_hostile_rule_condition_fails_fast(capsys, tmp_path, condition, problem):
    import time

    p = tmp_path / "hostile.rules"
    p.write_text("# hostile\nrule hostile family=algebraic\n  y = Relu(Relu(x))\n"
                 f"  where {condition}\n  =>\n  y = Relu(x)\n  example x=[2, 3]\n")
    t0 = time.perf_counter()
    code, _, err = run(capsys, "rules", "verify", str(p))
    assert time.perf_counter() - t0 < 10
    assert_user_error(code, err, f"{p}:4:", problem)


# ----- item 7: model and external weights change together; killed writes are cleaned up -----------
def _weights_model(value: float) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((64, 64), value, np.float32), "w")
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])


def test_crash_between_weights_and_model_keeps_the_old_pair(tmp_path, monkeypatch):
    from xrl.frontends import onnx_write

    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 100)
    path = tmp_path / "m.onnx"
    onnx_write.save_onnx(_weights_model(1.0), path)

    def killed(*a, **k):  # the process dies after the weights are in place, before the model is
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_write, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        onnx_write.save_onnx(_weights_model(2.0), path)
    loaded = onnx.load(str(path))
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), 1.0)


def test_rewrite_with_external_weights_leaves_one_data_file(tmp_path, monkeypatch):
    from xrl.frontends import onnx_write

    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 100)
    path = tmp_path / "m.onnx"
    for v in (1.0, 2.0, 3.0):
        onnx_write.save_onnx(_weights_model(v), path)
    assert len([p for p in os.listdir(tmp_path) if p.endswith(".data")]) == 1
    np.testing.assert_array_equal(numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0]), 3.0)
    monkeypatch.setattr(onnx_write, "EXTERNAL_DATA_THRESHOLD", 10**12)  # now inline: the old weights go
    onnx_write.save_onnx(_weights_model(4.0), path)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_killed_writers_temporaries_are_removed(tmp_path):
    import subprocess
    import sys
    import time

    from xrl.frontends.onnx_write import save_onnx

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".m.onnx.{dead_pid}.k2j3.tmp"
    stale_data = tmp_path / f".m.onnx.{dead_pid}.x9a1.data.tmp"
    legacy = tmp_path / ".m.onnx.ab3kd9_q.tmp"  # an older xrl's name, with no pid: removed once old
    live = tmp_path / f".m.onnx.{os.getpid()}.zz.tmp"  # a write in progress
    other = tmp_path / ".other.onnx.1.tmp"
    for p in (stale, stale_data, legacy, live, other):
        p.write_bytes(b"x" * 100)
    old = time.time() - 2 * 3600
    os.utime(legacy, (old, old))
    save_onnx(two_matmul_model(), tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == sorted(["m.onnx", live.name, other.name])


# ----- item 4: enumeration honours the time limit; a cap on matches per rule says when it cuts -----
def fan_graph(n: int):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}") for i in range(n)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(n)]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 8]) for i in range(n)]
    return from_onnx(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])], outs, inits))


def test_match_cap_per_rule_is_logged(caplog):
    import logging

    from xrl.rewrite import RewriteEngine

    engine = RewriteEngine.default(max_matches=40)
    with caplog.at_level(logging.INFO, logger="xrl.rewrite.engine"):
        cands = engine.candidates(fan_graph(30))  # C(30,2) + C(30,3) = 4,495 merges uncapped
    per_rule: dict[str, int] = {}
    for c in cands:
        per_rule[c.rule] = per_rule.get(c.rule, 0) + 1
    assert per_rule and max(per_rule.values()) <= 40
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "XRL_MAX_MATCHES" in r.getMessage()]
    assert warned and "merge_matmul" in warned[0].getMessage()


def test_enumeration_stops_at_the_search_time_limit(monkeypatch):
    import time

    from xrl.cost import get_cost_model
    from xrl.search.registry import run_search

    monkeypatch.setenv("XRL_MAX_MATCHES", "0")  # no cap: only the deadline bounds enumeration
    graph = fan_graph(80)  # 85,320 candidates: about 30 s to enumerate
    t0 = time.perf_counter()
    cost = get_cost_model("analytic", device="cpu")
    run_search("greedy", graph, cost, seed=0, steps=None, time_limit=1.0, options={})
    assert time.perf_counter() - t0 < 5


# ----- item 5: long searches show progress on a terminal and have a default time limit -------------
def test_progress_line_shows_step_speedup_and_elapsed():
    import io

    from xrl.cost import get_cost_model
    from xrl.rewrite import RewriteEngine
    from xrl.search.greedy import greedy_search
    from xrl.search.progress import search_progress

    graph, cost, out = fan_graph(4), get_cost_model("analytic", device="cpu"), io.StringIO()
    with search_progress("greedy", cost, graph, 300.0, stream=out, force=True):
        greedy_search(graph, cost, RewriteEngine.default())
    text = out.getvalue()
    assert "[greedy] step 1" in text and "speed-up 1.000x" in text and " s / 300 s" in text  # elapsed: load-dependent
    assert text.endswith("\r\033[K")  # erased at the end
    quiet = io.StringIO()  # not a terminal: nothing drawn
    with search_progress("greedy", cost, graph, 300.0, stream=quiet):
        greedy_search(graph, cost, RewriteEngine.default())
    assert quiet.getvalue() == ""


def test_searches_have_a_default_time_limit(monkeypatch):
    import time

    import xrl.search.progress as progress
    from xrl.cost import get_cost_model
    from xrl.search.registry import run_search

    monkeypatch.setattr(progress, "DEFAULT_TIME_LIMIT_S", 1.0)
    monkeypatch.setenv("XRL_MAX_MATCHES", "0")
    t0 = time.perf_counter()
    cost = get_cost_model("analytic", device="cpu")
    run_search("greedy", fan_graph(80), cost, seed=0, steps=None, time_limit=None, options={})
    assert time.perf_counter() - t0 < 5

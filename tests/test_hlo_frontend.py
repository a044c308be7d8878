"""The XLA HLO text front end: the committed jax fixtures (structure, FLOPs, numerics against jax's
own outputs) and the parser/lowering on hand-written snippets. No jax needed: the fixtures are files
(regenerate them with graphs/hlo/make_fixtures.py)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import xrl.graphs

from xrl.errors import ModelLoadError
from xrl.frontends.hlo import XLA_DOMAIN, load_hlo, looks_like_hlo, parse_hlo
from xrl.ir import Graph, TensorType
from xrl.ir.ops import graph_flops

FIXTURES = Path(xrl.graphs.__file__).resolve().parent / "hlo"


def fixture_io(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs (parameter order) and jax's outputs; the encoding is make_fixtures.decode_inputs'."""
    z = np.load(FIXTURES / f"{name}.npz")
    n_in = sum(1 for k in z.files if k.startswith("q"))
    n_out = sum(1 for k in z.files if k.startswith("out"))
    inputs = [z[f"q{i}"].astype(np.float32) * z[f"scale{i}"] + z[f"offset{i}"] for i in range(n_in)]
    return inputs, [z[f"out{j}"] for j in range(n_out)]


def run(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The graph's outputs under xrl's numpy reference executor."""
    execute = pytest.importorskip("xrl.ir.execute", reason="xrl.ir.execute (the reference executor) is missing").execute
    return execute(graph, dict(zip(graph.inputs, inputs, strict=True)))


def dense(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def conv(c_out: int, c_in: int, kh: int, kw: int, oh: int, ow: int) -> int:
    return 2 * c_out * oh * ow * c_in * kh * kw


# Per fixture: input shapes (x first, then weights, as jax passes them), output shapes, exact
# counts of some op types, and the hand-computed FLOPs of the matmuls/convs (the dominant terms).
D, S, F, H = 128, 32, 512, 4
EXPECTED = {
    "mlp": dict(
        inputs=[(8, 256), (256, 512), (512,), (512, 512), (512,), (512, 10), (10,)],
        outputs=[(8, 10)],
        ops={"MatMul": 3, "Conv": 0, "Relu": 2, "Add": 3},
        flops=dense(8, 256, 512) + dense(8, 512, 512) + dense(8, 512, 10),
    ),
    "transformer_block": dict(
        inputs=[(1, S, D), (D,), (D,), *[(D, D), (D,)] * 4, (D,), (D,), (D, F), (F,), (F, D), (D,)],
        outputs=[(1, S, D)],
        ops={"MatMul": 8, "Conv": 0, "Erf": 1, "Exp": 1, "ReduceMax": 1, "ReduceSum": 1, "ReduceMean": 4},
        flops=4 * dense(S, D, D) + 2 * H * dense(S, D // H, S) + dense(S, D, F) + dense(S, F, D),
    ),
    "convnet": dict(
        inputs=[(1, 3, 32, 32), (16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (32, 10), (10,)],
        outputs=[(1, 10)],
        ops={"MatMul": 1, "Conv": 2, "Relu": 2, "MaxPool": 1, "ReduceMean": 1},
        flops=conv(16, 3, 3, 3, 32, 32) + conv(32, 16, 3, 3, 16, 16) + dense(1, 32, 10),
    ),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def fixture(request) -> tuple[str, Graph]:
    return request.param, load_hlo(FIXTURES / f"{request.param}.hlo")


def test_fixture_structure(fixture):
    name, g = fixture
    want = EXPECTED[name]
    assert g.name == name
    assert [g.types[v].shape for v in g.inputs] == want["inputs"]  # every parameter, weights included
    assert all(g.types[v].dtype == "float32" for v in g.inputs)
    assert [g.types[v].shape for v in g.outputs] == want["outputs"]
    hist = g.op_histogram()
    assert {op: hist.get(op, 0) for op in want["ops"]} == want["ops"]
    assert not [n for n in g.nodes.values() if n.domain == XLA_DOMAIN], "no opaque ops in the fixtures"
    # matmul/conv FLOPs exactly, plus a few percent of elementwise work and reductions
    assert want["flops"] <= graph_flops(g) <= 1.03 * want["flops"]
    compute = sum(n.op in ("MatMul", "Conv") for n in g.nodes.values())
    assert compute == want["ops"]["MatMul"] + want["ops"]["Conv"]


def test_fixture_parameter_counts():
    inputs, _ = fixture_io("mlp")
    assert len(inputs) == 7 and sum(a.size for a in inputs[1:]) == 256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    inputs, _ = fixture_io("transformer_block")
    assert len(inputs) == 17 and sum(a.size for a in inputs[1:]) == 4 * (D * D + D) + 2 * D * F + F + D + 4 * D
    g = load_hlo(FIXTURES / "convnet.hlo")
    assert len(g.inputs) == 7  # jax passes weights as parameters: they are graph inputs here
    assert all(w.size <= 4 for w in g.initializers.values())  # the only initializers: shapes, scalars


def test_fixture_graph_shape():
    """The lowering's shape on the fixtures: bias adds broadcast without Expand, x @ W is one MatMul
    with no reshapes around it, attention's batched dots become Transpose + MatMul, and a mean
    (reduce-sum then divide) becomes ReduceMean."""
    mlp = load_hlo(FIXTURES / "mlp.hlo")
    assert sorted(mlp.op_histogram()) == ["Add", "MatMul", "Relu"]
    block = load_hlo(FIXTURES / "transformer_block.hlo").op_histogram()
    assert "Expand" not in block and "Max" not in block  # softmax's max(x, -inf) guard is dropped
    # Transposes: q and k^T for the scores, v and attn for the context, the context back to [b,s,h,d].
    # Reshapes: 3 head splits, 1 merge, 4 layer-norm and 2 softmax statistics kept 2-D by keepdims=0.
    assert (block["Transpose"], block["Reshape"]) == (5, 10)
    convnet = load_hlo(FIXTURES / "convnet.hlo")
    conv_nodes = [n for n in convnet.topological_order if n.op == "Conv"]
    assert [n.attrs["pads"] for n in conv_nodes] == [(1, 1, 1, 1)] * 2
    assert [convnet.types[n.inputs[0]].shape for n in conv_nodes] == [(1, 3, 32, 32), (1, 16, 16, 16)]


@pytest.mark.parametrize("name", [*sorted(EXPECTED), "op_coverage"])
def test_fixture_numerics_reference_executor(name):
    g = load_hlo(FIXTURES / f"{name}.hlo")
    inputs, outputs = fixture_io(name)
    got = run(g, inputs)
    assert len(got) == len(outputs)
    for j, (a, b) in enumerate(zip(got, outputs, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{name} output {j}")


@pytest.mark.parametrize("name", [*sorted(EXPECTED), "op_coverage"])
def test_fixture_numerics_onnxruntime(name):
    onnx_io = pytest.importorskip("xrl.frontends.onnx_io", reason="xrl.frontends.onnx_io.to_onnx is missing")
    ort = pytest.importorskip("onnxruntime")
    g = load_hlo(FIXTURES / f"{name}.hlo")
    inputs, outputs = fixture_io(name)
    session = ort.InferenceSession(onnx_io.to_onnx(g).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
    assert [i.name for i in session.get_inputs()] == list(g.inputs)
    for j, (a, b) in enumerate(zip(session.run(None, feeds), outputs, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{name} output {j}")


# ----- snippets --------------------------------------------------------------------------------
def hlo(body: str, header: str = "HloModule m") -> Graph:
    return parse_hlo(f"{header}\n\n{body}", name="snippet")


def test_tuple_shapes_and_get_tuple_element():
    g = hlo("""
ENTRY main {
  p = (f32[2,3]{1,0}, (s32[4], f32[])) parameter(0)
  a = f32[2,3]{1,0} get-tuple-element(p), index=0
  inner = (s32[4], f32[]) get-tuple-element(p), index=1
  i = s32[4] get-tuple-element(inner), index=0
  s = f32[] get-tuple-element(inner), index=1
  b = f32[2,3] broadcast(s), dimensions={}
  sum = f32[2,3] add(a, b)
  pair = (s32[4], f32[2,3]) tuple(i, sum)
  ROOT t = (f32[2,3], (s32[4], f32[2,3])) tuple(sum, pair)
}""")
    assert g.inputs == ("p#0", "p#1#0", "p#1#1")
    assert [g.types[v] for v in g.inputs] == [TensorType((2, 3)), TensorType((4,), "int32"), TensorType(())]
    assert [g.types[v].shape for v in g.outputs] == [(2, 3), (4,), (2, 3)]  # the nested ROOT tuple, flattened
    assert g.op_histogram() == {"Add": 1, "Identity": 2}  # an input as an output, and `sum` output twice


def test_new_style_typed_operands_signatures_and_metadata():
    text = """HloModule jit_f, entry_computation_layout={(f32[3,4]{1,0}, f32[4,5]{1,0})->f32[]}

FileNames
1 "/tmp/f.py"

FileLocations
1 {file_name_id=1 function_name_id=1 line=4 end_line=4 column=4 end_column=74}

%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.3 = f32[] parameter(0), metadata={op_name="reduce_sum"}
  %reduce_sum.4 = f32[] parameter(1), metadata={op_name="reduce_sum"}
  ROOT %reduce_sum.5 = f32[] add(f32[] %reduce_sum.3, f32[] %reduce_sum.4), metadata={op_name="a, {b}"}
}

ENTRY %main.2 (x.1: f32[3,4], y.1: f32[4,5]) -> f32[] {
  %x.1 = f32[3,4] parameter(0), metadata={op_name="x"}, sharding={replicated}
  %y.1 = f32[4,5]{1,0} parameter(1)
  %dot.1 = f32[3,5]{1,0} dot(f32[3,4]{1,0} %x.1, f32[4,5]{1,0} %y.1), lhs_contracting_dims={1}, /*x=1*/
      rhs_contracting_dims={0}, frontend_attributes={_xla_compute_type="host"}
  %constant.3 = f32[] constant(0)
  ROOT %r = f32[] reduce(f32[3,5] %dot.1, f32[] %constant.3), dimensions={0,1}, to_apply=%region_0.1
}
"""
    g = parse_hlo(text)
    assert g.name == "jit_f"
    assert g.inputs == ("x.1", "y.1")
    assert g.op_histogram() == {"MatMul": 1, "ReduceSum": 1}
    (r,) = [n for n in g.nodes.values() if n.op == "ReduceSum"]
    assert r.attrs == {"axes": (0, 1), "keepdims": 0} and g.outputs == ("r",)


def test_canonical_printer_inline_computations():
    g = hlo("""
ENTRY {
  tmp_0 = f32[3,4]{1,0} parameter(0)
  tmp_1 = f32[] constant(-inf)
  ROOT tmp_2 = f32[3] reduce(f32[3,4]{1,0} tmp_0, f32[] tmp_1), dimensions={1}, to_apply=
  {
    tmp_0 = f32[] parameter(0)
    tmp_1 = f32[] parameter(1)
    ROOT tmp_2 = f32[] maximum(f32[] tmp_0, f32[] tmp_1)
  }
}""")
    assert g.op_histogram() == {"ReduceMax": 1}


def test_constants_nested_braces_scalars_and_special_values():
    g = hlo("""
ENTRY main {
  x = f32[2,3] parameter(0)
  c = f32[2,3]{1,0} constant({ { 1, -2.5, 3e-2 }, { inf, -inf, 0 } })
  s = f32[] constant(0.5)
  p = pred[3] constant({true, false, 1})
  i = s32[2,1,2] constant({ { {1, 2} }, { {3, -4} } })
  h = bf16[2] constant({1.5, -2})
  e = f32[2] constant(f32[2] {7, 8})
  b = f32[2,3] broadcast(s), dimensions={}
  m = f32[2,3] multiply(x, c)
  ROOT t = (f32[2,3], pred[3], s32[2,1,2], bf16[2], f32[2], f32[2,3]) tuple(m, p, i, h, e, b)
}""")
    w = g.initializers
    (mul,) = [n for n in g.nodes.values() if n.op == "Mul"]
    np.testing.assert_array_equal(w[mul.inputs[1]], np.array([[1, -2.5, 3e-2], [np.inf, -np.inf, 0]], np.float32))
    values = {g.producer(v).inputs[0] if g.producer(v) else v: v for v in g.outputs}  # outputs via Identity
    consts = [w[v] for v in values if v in w]
    assert any(c.dtype == bool and c.tolist() == [True, False, True] for c in consts)
    assert any(c.dtype == np.int32 and c.shape == (2, 1, 2) and c.ravel().tolist() == [1, 2, 3, -4] for c in consts)
    assert any(c.dtype.name == "bfloat16" and c.astype(np.float32).tolist() == [1.5, -2.0] for c in consts)
    assert any(c.tolist() == [7.0, 8.0] for c in consts)
    # a broadcast scalar that is an output is stored folded, as a constant of its full shape
    assert any(c.shape == (2, 3) and np.all(c == 0.5) for c in consts)


def test_dot_with_batch_dims_becomes_transposes_and_matmul():
    # einsum('bqhd,bkhd->bhqk'): batch dims {0,2} in the middle of both operands
    g = hlo("""
ENTRY main {
  q = f32[2,5,3,4] parameter(0)
  k = f32[2,6,3,4] parameter(1)
  ROOT d = f32[2,3,5,6] dot(q, k), lhs_batch_dims={0,2}, lhs_contracting_dims={3},
                                    rhs_batch_dims={0,2}, rhs_contracting_dims={3}
}""")
    assert g.op_histogram() == {"Transpose": 2, "MatMul": 1}
    perms = sorted(n.attrs["perm"] for n in g.nodes.values() if n.op == "Transpose")
    assert perms == [(0, 2, 1, 3), (0, 2, 3, 1)]
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 5, 3, 4)), rng.standard_normal((2, 6, 3, 4))
    (out,) = run(g, [q, k])
    np.testing.assert_allclose(out, np.einsum("bqhd,bkhd->bhqk", q, k), rtol=1e-6)


def test_dot_common_cases_need_no_reshape():
    g = hlo("""
ENTRY main {
  x = f32[4,7,16] parameter(0)
  w = f32[32,16] parameter(1)
  xw = f32[4,7,32] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={1}
  v = f32[16] parameter(2)
  m = f32[32,16] parameter(3)
  mv = f32[32] dot(m, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[4,7,32], f32[32]) tuple(xw, mv)
}""")
    assert g.op_histogram() == {"MatMul": 2, "Transpose": 1}  # x @ W^T: one transpose of W
    (t,) = [n for n in g.nodes.values() if n.op == "Transpose"]
    assert t.inputs == ("w",) and t.attrs["perm"] == (1, 0)


def test_constant_weight_is_transposed_at_import():
    g = hlo("""
ENTRY main {
  x = f32[1,4,4,2] parameter(0)
  w = f32[1,1,2,3] constant({ { { {1, 2, 3}, {4, 5, 6} } } })
  ROOT y = f32[1,4,4,3] convolution(x, w), window={size=1x1}, dim_labels=b01f_01io->b01f
}""")
    conv = next(n for n in g.nodes.values() if n.op == "Conv")
    np.testing.assert_array_equal(g.initializers[conv.inputs[1]].reshape(3, 2), [[1, 4], [2, 5], [3, 6]])  # OIHW
    assert g.op_histogram() == {"Transpose": 2, "Conv": 1}  # NHWC in and out; the weight costs nothing
    x = np.random.default_rng(1).standard_normal((1, 4, 4, 2))
    (y,) = run(g, [x])
    np.testing.assert_allclose(y, x @ np.array([[1, 2, 3], [4, 5, 6]]), rtol=1e-6)


def test_reduce_to_apply_add_and_init():
    g = hlo("""
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(b, a)
}

mul {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] multiply(a, b)
}

ENTRY main {
  x = f32[4,5,6] parameter(0)
  zero = f32[] constant(0)
  one = f32[] constant(1)
  r = f32[4,6] reduce(x, zero), dimensions={1}, to_apply=add
  r1 = f32[6] reduce(x, one), dimensions={0,1}, to_apply=add
  p = f32[4] reduce(x, one), dimensions={1,2}, to_apply=mul
  ROOT t = (f32[4,6], f32[6], f32[4]) tuple(r, r1, p)
}""")
    sums = sorted((n.attrs["axes"], n.attrs["keepdims"]) for n in g.nodes.values() if n.op == "ReduceSum")
    assert sums == [((0, 1), 0), ((1,), 0)]
    assert g.op_histogram()["Add"] == 1  # the init 1 is added once; 0 is dropped
    assert not [n for n in g.nodes.values() if n.domain == XLA_DOMAIN]
    (prod,) = [n for n in g.nodes.values() if n.op == "ReduceProd"]  # init 1 is neutral: nothing folded in
    assert prod.attrs == {"axes": (1, 2), "keepdims": 0} and g.types[prod.outputs[0]] == TensorType((4,))


def test_mean_and_relu_patterns():
    g = hlo("""
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[2,8,3] parameter(0)
  zero = f32[] constant(0)
  s = f32[2,3] reduce(x, zero), dimensions={1}, to_apply=add
  n = f32[] constant(8)
  nb = f32[2,3] broadcast(n), dimensions={}
  mean = f32[2,3] divide(s, nb)
  zb = f32[2,3] broadcast(zero), dimensions={}
  ROOT relu = f32[2,3] maximum(mean, zb)
}""")
    assert g.op_histogram() == {"ReduceMean": 1, "Relu": 1}


def test_fusion_computations_are_inlined():
    g = hlo("""
%fused_computation (param_0: f32[8,32], param_1: f32[32]) -> f32[8,32] {
  %param_0 = f32[8,32]{1,0} parameter(0)
  %param_1 = f32[32]{0} parameter(1)
  %add.1 = f32[8,32]{1,0} broadcast(%param_1), dimensions={1}
  %add.0 = f32[8,32]{1,0} add(%param_0, %add.1)
  %constant.72 = f32[] constant(0)
  %max.6 = f32[8,32]{1,0} broadcast(%constant.72), dimensions={}
  ROOT %max.4 = f32[8,32]{1,0} maximum(%add.0, %max.6)
}

ENTRY %main.5 (x.1: f32[8,32], b1.1: f32[32]) -> f32[8,32] {
  %x.1 = f32[8,32]{1,0} parameter(0)
  %b1.1 = f32[32]{0} parameter(1)
  ROOT %fusion = f32[8,32]{1,0} fusion(%x.1, %b1.1), kind=kLoop, calls=%fused_computation,
      backend_config={"a":[1,{"b":"}"}]}
}""", header="HloModule jit_f, is_scheduled=true")
    assert g.op_histogram() == {"Add": 1, "Relu": 1}
    add = next(n for n in g.nodes.values() if n.op == "Add")
    assert add.inputs == ("x.1", "b1.1")  # the bias broadcasts numpy-style: no Expand
    assert g.outputs == ("fusion/max.4",)


def test_bitcast_reads_layouts():
    # after layout assignment a bitcast to a transposed layout is a transpose, to a default one a reshape
    g = hlo("""
ENTRY main {
  x = f32[2,3]{1,0} parameter(0)
  t = f32[3,2]{0,1} bitcast(x)
  r = f32[6]{0} bitcast(x)
  c = f32[] constant(-1)
  lo = f32[3,2] broadcast(c), dimensions={}
  k = f32[3,2]{1,0} clamp(lo, t, lo)
  ROOT o = (f32[3,2], f32[6], f32[3,2]) tuple(t, r, k)
}""")
    assert g.op_histogram() == {"Transpose": 1, "Reshape": 1, "Clip": 1}
    x = np.arange(6.0).reshape(2, 3)
    t, r, k = run(g, [x])
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(r, x.ravel())
    np.testing.assert_array_equal(k, np.full((3, 2), -1.0))


def test_unknown_op_is_opaque_and_keeps_its_type():
    g = hlo("""
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
}

ENTRY main {
  x = f32[4,8] parameter(0)
  s = f32[4,8] sort(x), dimensions={1}, is_stable=true, to_apply=cmp
  ROOT y = f32[4,8] exponential(s)
}""")
    (sort,) = [n for n in g.nodes.values() if n.domain == XLA_DOMAIN]
    assert sort.op == "sort" and sort.inputs == ("x",)
    assert g.validate() is g  # an opaque op passes through validation with its recorded type
    assert sort.attrs["dimensions"] == "{1}" and sort.attrs["to_apply"] == "cmp"
    assert g.types[sort.outputs[0]] == TensorType((4, 8))
    assert g.op_histogram() == {"sort": 1, "Exp": 1}


def test_elided_constant_is_opaque():
    g = hlo("""
ENTRY main {
  x = f32[16] parameter(0)
  c = f32[16] constant({...})
  ROOT y = f32[16] add(x, c)
}""")
    (c,) = [n for n in g.nodes.values() if n.domain == XLA_DOMAIN]
    assert c.op == "constant" and c.inputs == () and g.types[c.outputs[0]] == TensorType((16,))


def test_compare_directions_are_exact_with_nan():
    g = hlo("""
ENTRY main {
  a = f32[5] parameter(0)
  b = f32[5] parameter(1)
  le = pred[5] compare(a, b), direction=LE
  ge = pred[5] compare(a, b), direction=GE
  ne = pred[5] compare(a, b), direction=NE
  ROOT t = (pred[5], pred[5], pred[5]) tuple(le, ge, ne)
}""")
    a = np.array([1.0, 2.0, 3.0, np.nan, 1.0])
    b = np.array([2.0, 2.0, 1.0, 1.0, np.nan])
    le, ge, ne = run(g, [a, b])
    assert le.tolist() == (a <= b).tolist() and ge.tolist() == (a >= b).tolist() and ne.tolist() == (a != b).tolist()


def test_syntax_error_names_the_line_and_what_was_expected():
    text = "HloModule m\n\nENTRY main {\n  x = f32[2] parameter(0)\n  y = f32[2] add(x x)\n}\n"
    with pytest.raises(ModelLoadError, match=r"line 5: expected ',' or '\)' in the operand list, found 'x\)'"):
        parse_hlo(text)
    with pytest.raises(ModelLoadError, match=r"line 4: expected '\[' after element type 'f32'"):
        parse_hlo("HloModule m\nENTRY main {\n  x = f32[2] parameter(0)\n  ROOT y = f32 negate(x)\n}")
    with pytest.raises(ModelLoadError, match=r"line 4: %y \(add\): operand %z is not defined"):
        parse_hlo("HloModule m\nENTRY main {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] add(x, z)\n}")


def test_unsupported_element_type_is_a_load_error():
    with pytest.raises(ModelLoadError, match=r"line 3: %x \(parameter\).*element type u32"):
        parse_hlo("HloModule m\nENTRY main {\n  x = u32[2] parameter(0)\n  ROOT y = u32[2] negate(x)\n}")


def test_load_hlo_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_hlo(tmp_path / "missing.hlo")
    onnx_like = tmp_path / "model.onnx"
    onnx_like.write_bytes(b"\x08\x08\x12\x07pytorch\x1a\x03" + bytes(range(256)))
    with pytest.raises(ModelLoadError, match=r"model.onnx: not HLO text"):
        load_hlo(onnx_like)
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n")
    with pytest.raises(ModelLoadError, match="expected it to start with 'HloModule'"):
        load_hlo(text)
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n\nENTRY main {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] negate(x\n")
    with pytest.raises(ModelLoadError, match=r"bad.hlo: line 5: expected"):
        load_hlo(bad)


def test_looks_like_hlo():
    assert looks_like_hlo("HloModule jit_f, entry_computation_layout={()->f32[]}\n")
    assert looks_like_hlo("\ufeff// dumped by XLA\n  HloModule m\n")
    assert not looks_like_hlo("\x08\x07\x12\x07pytorch")
    assert not looks_like_hlo("HloModuleX")
    assert not looks_like_hlo("")


def test_import_is_fast():
    # a budget with a wide margin for slow CI machines (it takes ~20 ms); the report quotes timings
    start = time.perf_counter()
    load_hlo(FIXTURES / "transformer_block.hlo")
    assert time.perf_counter() - start < 2.0

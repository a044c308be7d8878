"""Regenerate the HLO fixtures in this folder from jax (a dev-only dependency: `pip install .[fixtures]`).

    python graphs/hlo/make_fixtures.py [--out graphs/hlo]

For each model below it writes
- `<name>.hlo`: `jax.jit(f).lower(*args).as_text(dialect="hlo")`, the text `xrl.frontends.hlo` imports;
- `<name>.npz`: seeded inputs for every HLO parameter (weights are parameters in jax) and jax's outputs.

Inputs are stored compactly and exactly: parameter i is `offset_i + q_i * scale_i` with `q_i` int8 and
`scale_i` a power of two, so every value is exact in float32 and the files stay small (the MLP has
0.4M parameters). Keys: `q{i}`, `scale{i}`, `offset{i}` for parameter i, `out{j}` (float32) for output j.
`decode_inputs` below is the reader; the tests carry a copy so that they need no jax.

Everything is deterministic: one seed per fixture, jax on CPU in float32.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Param:
    """One parameter's shape and value range: offset + U{-127..127} * 2**exp."""

    shape: tuple[int, ...]
    exp: int
    offset: float = 0.0


def dense(fan_in: int, fan_out: int) -> list[Param]:
    """A weight scaled ~1/sqrt(fan_in) (so activations stay O(1)) and a small bias."""
    exp = -7 - math.ceil(math.log2(math.sqrt(fan_in)))
    return [Param((fan_in, fan_out), exp), Param((fan_out,), -10)]


def conv(c_out: int, c_in: int, k: int) -> list[Param]:
    exp = -7 - math.ceil(math.log2(math.sqrt(c_in * k * k)))
    return [Param((c_out, c_in, k, k), exp), Param((c_out,), -10)]


def layer_norm(d: int) -> list[Param]:
    return [Param((d,), -10, 1.0), Param((d,), -10)]


# ----- the models (jax imported lazily: only regeneration needs it) ------------------------------
def mlp(x, w1, b1, w2, b2, w3, b3):
    """3-layer MLP, batch 8: 256 -> 512 -> 512 -> 10, relu."""
    import jax

    h = jax.nn.relu(x @ w1 + b1)
    h = jax.nn.relu(h @ w2 + b2)
    return h @ w3 + b3


def transformer_block(x, ln1_g, ln1_b, wq, bq, wk, bk, wv, bv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2):
    """Pre-LN encoder block: seq 32, d 128, 4 heads, FF 512, exact GELU via erf, jax's softmax."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    heads, seq, d = 4, x.shape[1], x.shape[2]
    dh = d // heads

    def ln(v, g, b):
        mu = jnp.mean(v, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(v - mu), axis=-1, keepdims=True)
        return (v - mu) * lax.rsqrt(var + 1e-5) * g + b

    h = ln(x, ln1_g, ln1_b)
    q = (h @ wq + bq).reshape(1, seq, heads, dh)
    k = (h @ wk + bk).reshape(1, seq, heads, dh)
    v = (h @ wv + bv).reshape(1, seq, heads, dh)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
    attn = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(1, seq, d)
    x = x + ctx @ wo + bo
    h = ln(x, ln2_g, ln2_b)
    f = h @ w1 + b1
    f = 0.5 * f * (1.0 + lax.erf(f / math.sqrt(2.0)))
    return x + f @ w2 + b2


def convnet(x, c1, c1b, c2, c2b, w, b):
    """NCHW 1x3x32x32: conv3x3(16)-relu-maxpool2 -> conv3x3(32)-relu -> global mean -> dense(10)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    dn = ("NCHW", "OIHW", "NCHW")
    y = lax.conv_general_dilated(x, c1, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
    y = jax.nn.relu(y + c1b[None, :, None, None])
    y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    y = lax.conv_general_dilated(y, c2, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
    y = jax.nn.relu(y + c2b[None, :, None, None])
    return jnp.mean(y, axis=(2, 3)) @ w + b


def op_coverage(x, k, kd, a, m, v):
    """Not a benchmark: one module exercising the lowering paths the three models do not, each
    checked numerically against jax (NHWC grouped/dilated/strided conv, depthwise conv, an NHWC max
    pool with padding, x @ W^T, a batched dot with batch dims in the middle, slices, reverse, pad,
    concatenate, clip, the compares jax emits (LE, GE, NE), select, rsqrt, power, log, abs, convert,
    iota, reductions with a non-neutral init)."""
    import jax.numpy as jnp
    from jax import lax

    y = lax.conv_general_dilated(x, k, (2, 1), ((1, 2), (2, 2)), rhs_dilation=(1, 2),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=2)
    dw = lax.conv_general_dilated(x, kd, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                  feature_group_count=x.shape[-1])
    pool = lax.reduce_window(dw, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    xt = a @ m.T  # [6, 10] @ [12, 10]^T
    bmm = jnp.einsum("ibj,jbk->bik", v, v.transpose(2, 1, 0))  # batch dim in the middle of both
    sl = jnp.concatenate([xt[1:5:2, ::-1], jnp.pad(xt[:2, 3:7], ((0, 0), (2, 1)), constant_values=0.5)], axis=1)
    c = jnp.clip(xt, -0.5, 0.75)
    sel = jnp.where(xt <= 0.1, c, jnp.where(xt >= 0.3, xt * 2.0, jnp.where(xt != 0.2, -xt, 1.0)))
    pos = jnp.abs(xt) + 0.5
    mixed = lax.rsqrt(pos) + jnp.power(pos, 1.5) + jnp.log(pos)
    ramp = jnp.arange(12, dtype=jnp.float32) * (xt.astype(jnp.int32).astype(jnp.float32)[:, :1] + 1.0)
    r_init = lax.reduce(xt, jnp.float32(1.0), lax.add, (1,))
    r_min = jnp.min(xt, axis=0)
    return y, pool, xt, bmm, sl, sel, mixed, ramp, r_init, r_min


@dataclass(frozen=True)
class Fixture:
    fn: Callable
    params: Sequence[Param]
    seed: int


FIXTURES: dict[str, Fixture] = {
    "mlp": Fixture(mlp, [Param((8, 256), -7), *dense(256, 512), *dense(512, 512), *dense(512, 10)], seed=1),
    "transformer_block": Fixture(transformer_block, [
        Param((1, 32, 128), -7), *layer_norm(128), *dense(128, 128), *dense(128, 128), *dense(128, 128),
        *dense(128, 128), *layer_norm(128), *dense(128, 512), *dense(512, 128)], seed=2),
    "convnet": Fixture(convnet, [Param((1, 3, 32, 32), -7), *conv(16, 3, 3), *conv(32, 16, 3), *dense(32, 10)],
                       seed=3),
    "op_coverage": Fixture(op_coverage, [
        Param((2, 9, 10, 4), -7), Param((3, 2, 2, 6), -9), Param((3, 3, 1, 4), -9), Param((6, 10), -7),
        Param((12, 10), -9), Param((3, 2, 5), -7)], seed=4),
}


def sample(params: Sequence[Param], seed: int) -> dict[str, np.ndarray]:
    """The encoded inputs of one fixture (see the module docstring)."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for i, p in enumerate(params):
        arrays[f"q{i}"] = rng.integers(-127, 128, size=p.shape, dtype=np.int8)
        arrays[f"scale{i}"] = np.float32(2.0 ** p.exp)
        arrays[f"offset{i}"] = np.float32(p.offset)
    return arrays


def decode_inputs(arrays) -> list[np.ndarray]:
    """Parameter values in order, as float32 (exact: int8 * power of two + a representable offset)."""
    n = sum(1 for k in arrays if k.startswith("q"))
    return [arrays[f"q{i}"].astype(np.float32) * arrays[f"scale{i}"] + arrays[f"offset{i}"] for i in range(n)]


def build(name: str, out_dir: Path) -> tuple[Path, Path]:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_default_matmul_precision", "highest")
    fixture = FIXTURES[name]
    arrays = sample(fixture.params, fixture.seed)
    inputs = decode_inputs(arrays)
    jitted = jax.jit(fixture.fn)
    text = jitted.lower(*inputs).as_text(dialect="hlo")
    outputs = jitted(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for j, o in enumerate(outputs):
        arrays[f"out{j}"] = np.asarray(o)
    hlo_path, npz_path = out_dir / f"{name}.hlo", out_dir / f"{name}.npz"
    hlo_path.write_text(text)
    np.savez_compressed(npz_path, **arrays)
    return hlo_path, npz_path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: next to this script)")
    parser.add_argument("names", nargs="*", default=list(FIXTURES), help=f"fixtures to build: {', '.join(FIXTURES)}")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        hlo_path, npz_path = build(name, args.out)
        n_params = sum(math.prod(p.shape) for p in FIXTURES[name].params)
        print(f"{name:18s} {len(FIXTURES[name].params):3d} parameters ({n_params:,} values)  "
              f"{hlo_path.stat().st_size / 1024:7.1f} KiB hlo  {npz_path.stat().st_size / 1024:7.1f} KiB npz")


if __name__ == "__main__":
    main()

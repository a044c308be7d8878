"""`python -m xrl.graphs [NAME ...] [--batch N]`: build the built-in graphs and print a table of their
size, build time and onnxruntime run time (CPU, default session options, best of 5 runs)."""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from . import build, names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xrl.graphs", description=__doc__)
    parser.add_argument("names", nargs="*", help="graphs to measure (default: all)")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"{'name':14} {'nodes':>6} {'params':>12} {'build s':>8} {'ORT ms':>8}  output")
    for name in args.names or names():
        start = time.perf_counter()
        model = build(name, batch=args.batch)
        build_s = time.perf_counter() - start
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32)
                 for i in model.graph.input}
        session.run(None, feeds)  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            (out, *_) = session.run(None, feeds)
            times.append(time.perf_counter() - start)
        params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        print(f"{name:14} {len(model.graph.node):6d} {params:12,d} {build_s:8.2f} "
              f"{1e3 * min(times):8.1f}  {out.shape} std {out.std():.2f}", flush=True)


if __name__ == "__main__":
    main()

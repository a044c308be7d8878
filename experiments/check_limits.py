"""Where does xrl's default optimisation of each deployment family member stand against its limit?

For each member and exporter: optimise the exported original and its limit (the same network merged /
re-parameterised in torch, `families.build_onnx(..., limit=True)`) with the same options, and print both
op histograms, their difference, and the rules xrl applied to the original. Both go through the same
pre-passes and search, so fusions that both get do not count (the check of tests/test_families*.py).

    .venv/bin/python experiments/check_limits.py --members repvgg,acnet,dbb,mobileone [--exporters ts,dynamo]
        [--size small|full] [--search greedy] [--time-limit 120] [--seed 0] [--measure ROUNDS]

The cost is xrl's default (the target's estimate); set XRL_TARGET_COST=roofline for the tests' one.
With --measure, xrl's output of the original is timed against xrl's output of the limit end to end
(onnxruntime CPU, one thread, ROUNDS interleaved rounds, a fresh session per graph and round, an A/A copy of
the limit's output as the noise floor): whether two different histograms are also different speeds.
Exit status 0 when every case reaches its limit's histogram, 1 when one does not, 2 on a bad option.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xrl.graphs import families as F  # noqa: E402


def histogram(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def show(h: Counter) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(h.items())) or "(empty)"


def difference(got: Counter, want: Counter) -> str:
    """Ops xrl's output of the original has more (+) or fewer (-) of than its output of the limit."""
    parts = [f"{op} {got[op] - want[op]:+d}" for op in sorted(set(got) | set(want)) if got[op] != want[op]]
    return ", ".join(parts) or "none"


def optimise(member: str, size: str, exporter: str, limit: bool, args: argparse.Namespace, tmp: Path):
    from xrl.api import optimize

    src = tmp / f"{member}-{size}-{exporter}-{'limit' if limit else 'orig'}.onnx"
    onnx.save(F.build_onnx(member, size, exporter, seed=args.seed, limit=limit), str(src))
    start = time.perf_counter()
    result = optimize(str(src), search=args.search, seed=args.seed, time_limit=args.time_limit)
    return result, time.perf_counter() - start


def check(member: str, size: str, exporter: str, args: argparse.Namespace, tmp: Path) -> bool:
    original = F.build_onnx(member, size, exporter, seed=args.seed)
    res, secs = optimise(member, size, exporter, False, args, tmp)
    lim, lim_secs = optimise(member, size, exporter, True, args, tmp)
    got, want = histogram(res.model), histogram(lim.model)
    reached = got == want
    steps = Counter(s.split("@")[0].split("(")[0].strip() for s in res.steps)
    print(f"== {member} {size} {exporter}: {'REACHED' if reached else 'NOT reached'}")
    print(f"  exported original  {len(original.graph.node):5d} nodes: {show(histogram(original))}")
    print(f"  xrl(original)      {len(res.model.graph.node):5d} nodes: {show(got)}")
    print(f"  xrl(limit)         {len(lim.model.graph.node):5d} nodes: {show(want)}")
    print(f"  difference (original - limit): {difference(got, want)}")
    print(f"  cost {res.cost_model}: estimated speed-up {res.speedup:.3f} (limit's own {lim.speedup:.3f}); "
          f"verified {res.verified} (max abs err {res.max_abs_err:.2g}); {secs:.1f} s + {lim_secs:.1f} s")
    if res.guard:  # measured defaults: which candidate the guard timed fastest, and its measured speed-up
        print(f"  guard chose {res.guard.get('chosen')} ({res.guard.get('reason')}); measured speed-up "
              f"{res.measured_speedup if res.measured_speedup is None else round(res.measured_speedup, 3)} "
              f"{res.measured_interval or ''} ({res.verdict})")
    print(f"  pre-passes: {', '.join(p.name for p in res.prepasses if p.applied) or 'none'}")
    print(f"  rules ({res.rewrites}): {', '.join(f'{r} {n}' for r, n in steps.most_common()) or 'none'}")
    if args.measure:
        print(f"  measured, xrl(original) against xrl(limit): {measure(res.model, lim.model, args.measure)}")
    sys.stdout.flush()
    return reached


def measure(model: onnx.ModelProto, limit: onnx.ModelProto, rounds: int) -> str:
    """xrl(original)'s speed-up over xrl(limit) with its 95% interval, and the A/A control's interval."""
    from xrl.api import measure_model
    from xrl.cost.guard import GuardCandidate, measure_guard
    from xrl.frontends.onnx_io import from_onnx

    timer = measure_model("ort", "cpu", repeats=5, warmup=2, threads=1)
    g = measure_guard(timer, from_onnx(limit, name="limit"), [GuardCandidate("xrl", from_onnx(model, name="xrl"))],
                      rounds=rounds, max_rounds=rounds)
    m = g.measured.get("xrl")
    if m is None:
        return "identical graphs"
    lo, hi = m.interval
    control = m.control
    aa = f"A/A [{control[0]:.3f}, {control[1]:.3f}]" if control else "no A/A"
    return f"{m.speedup:.3f} [{lo:.3f}, {hi:.3f}], {aa}, {g.rounds} rounds"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", default=",".join(m for m, f in F.MEMBERS.items() if f == "reparam"),
                   help="comma-separated members or families (default: the reparam family)")
    p.add_argument("--exporters", default="ts,dynamo")
    p.add_argument("--size", default="small", choices=F.SIZES)
    p.add_argument("--search", default="greedy")
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measure", type=int, default=0, metavar="ROUNDS",
                   help="time xrl's output of the original against its output of the limit (0: do not)")
    args = p.parse_args(argv)
    if args.measure < 0:
        p.error("--measure takes a number of rounds >= 0")
    members = []
    for name in filter(None, args.members.split(",")):
        if name in F.FAMILIES:
            members += [m for m, f in F.MEMBERS.items() if f == name]
        elif name in F.MEMBERS:
            members.append(name)
        else:
            p.error(f"unknown member or family {name!r}; choose from {', '.join([*F.FAMILIES, *F.MEMBERS])}")
    exporters = [e for e in args.exporters.split(",") if e]
    for e in exporters:
        if e not in F.EXPORTERS:
            p.error(f"unknown exporter {e!r}; choose from {', '.join(F.EXPORTERS)}")
    args.member_list, args.exporter_list = members, exporters
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    reached = []
    with tempfile.TemporaryDirectory(prefix="xrl-check-limits-") as tmp:
        for member in args.member_list:
            for exporter in args.exporter_list:
                reached.append((member, exporter, check(member, args.size, exporter, args, Path(tmp))))
    print("\nsummary: " + ", ".join(f"{m}/{e} {'ok' if ok else 'NOT'}" for m, e, ok in reached))
    return 0 if all(ok for *_, ok in reached) else 1


if __name__ == "__main__":
    sys.exit(main())

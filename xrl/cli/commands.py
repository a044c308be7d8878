"""Foundation commands: graphs, info, cost, optimize."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from xrl.cli.output import format_table, human_count, human_seconds, print_json

if TYPE_CHECKING:
    from xrl.cost.speedup import MeasuredSpeedup

COST_CHOICES = ("target", "roofline", "analytic", "ort", "op", "e2e", "cuda")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx file, an HLO text file, or a built-in graph name")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="fix the shape of a graph input with dynamic dimensions (repeatable)")
    p.add_argument("--batch", type=int, default=1, help="batch size of a built-in graph (default 1)")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    from xrl.cost.targets import TARGETS

    p.add_argument("--target", default=None, choices=(*TARGETS, "auto"),
                   help="what will run the model: ort-cpu, ort-cuda (onnxruntime on that provider; its own fusions "
                        "are applied before costing), or paper (the research setting of TASO/Tensat/X-RLflow: one "
                        "H100 kernel per op, unfused baseline). Default: ort-cuda with an NVIDIA GPU, else ort-cpu")
    p.add_argument("--cost", default="target", choices=COST_CHOICES,
                   help="cost backend (default target: the kernels the target runs, each timed alone on this "
                        "machine and cached; roofline: their roofline estimate)")
    p.add_argument("--device", default=None, help="device profile of the analytic model (h100, a100, v100, gtx1080, "
                   "cpu, or cuda: this machine's GPU), or cpu/cuda for measured backends; default: this machine "
                   "(the profile of its NVIDIA GPU, else cpu)")


def load(args: argparse.Namespace):
    from xrl.frontends.loader import load_model, parse_input_shapes

    if args.batch < 1:
        from xrl.errors import XrlError

        raise XrlError(f"--batch must be at least 1, not {args.batch}")
    return load_model(args.model, input_shapes=parse_input_shapes(args.input_shape), batch=args.batch,
                      seed=getattr(args, "seed", 0))


class SearchNamesHelp(str):
    """A help text whose {names} are the registered searches, filled in when the help is printed: listing
    them reads the xrl.searches entry points (a scan of the installed packages), which every other command
    would otherwise pay for when the parsers are built. Names in `skip` are left out."""

    def __new__(cls, text: str, skip: tuple[str, ...] = ()) -> SearchNamesHelp:
        help_text = super().__new__(cls, text)
        help_text.skip = skip
        return help_text

    def __mod__(self, params: object) -> str:  # argparse expands help with `help % params` when it prints
        from xrl.search.registry import search_names

        names = " | ".join(n for n in search_names() if n not in self.skip)
        return str.__mod__(str(self).replace("{names}", names), params)


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("graphs", help="the built-in benchmark graphs")
    gsub = g.add_subparsers(dest="graphs_command", metavar="{list,export}", parser_class=type(g))
    gsub.required = True
    p = gsub.add_parser("list", help="name, op count, parameters, FLOPs of every built-in graph")
    from xrl.graphs import SUITES

    p.add_argument("--suite", choices=SUITES, help="only this suite")
    p.add_argument("--no-sizes", action="store_true",
                   help="names, suites and descriptions only, at once (the sizes build each graph: the families' "
                        "torch exports take seconds each)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_graphs_list)
    p = gsub.add_parser("export", help="write a built-in graph as ONNX")
    p.add_argument("name")
    p.add_argument("-o", "--output", required=True, metavar="FILE.onnx")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.set_defaults(func=cmd_graphs_export)

    p = sub.add_parser("info", help="op histogram, node/edge counts, FLOPs and bytes of a model")
    add_model_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("cost", help="estimated or measured run time of a model")
    add_model_args(p)
    add_cost_args(p)
    p.add_argument("--repeats", type=int, help="timed runs of a measured backend")
    p.add_argument("--per-op", action="store_true", help="also list the most expensive ops")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("calibrate", help="measure this CPU's rates under onnxruntime for the ort-cpu target's estimate")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1, as the measured backends)")
    p.add_argument("--repeats", type=int, default=50, help="timed runs per measurement (default 50)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("optimize", help="rewrite a model to run faster and write the verified ONNX file")
    add_model_args(p)
    add_cost_args(p)
    p.add_argument("-o", "--output", metavar="OUT.onnx", help="where to write the optimised model")
    p.add_argument("--search", default="greedy", help=SearchNamesHelp(
        "{names} (default greedy; more with xrl.search.registry.register_search or the xrl.searches entry-point "
        "group)"))
    p.add_argument("--prepass", default=None, metavar="PASSES",
                   help="clean-up passes run before the search, comma-separated: onnxslim, ort-transformers, or none "
                        "(default: the target's: both for the onnxruntime targets, none for paper)")
    p.add_argument("--steps", type=int, help="rewrite budget (random: steps taken; greedy/rl: at most)")
    p.add_argument("--time-limit", type=float, help="seconds the search may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", help="policy checkpoint for --search rl, or a shipped policy's name: default "
                   "(the default), expert (expert iteration for ort-cpu)")
    p.add_argument("--rl-mode", choices=("guided", "argmax"),
                   help="--search rl: guided (default: the argmax rollout, then a beam over the policy's prior ranked "
                        "by its value head, within 60 s or --time-limit) or argmax (the policy's own choice each step)")
    p.add_argument("--prior", choices=("trained", "untrained", "uniform", "cost"),
                   help="--search rl, guided: what guides the search (default trained: the policy; untrained: its "
                        "network initialised from --seed; uniform; cost: a softmax over each rewrite's estimated gain)")
    p.add_argument("--samples", type=int, default=0, metavar="K",
                   help="--search rl --rl-mode argmax: also play K sampled rollouts and keep the best graph")
    add_value_args(p)
    p.add_argument("--max-cost-calls", type=int, metavar="N", help="stop the search after N cost-model calls (any "
                   "search; the search option max_cost_calls, beside --time-limit)")
    p.add_argument("--beam-width", type=int, metavar="K", help="--search beam: graphs kept per level (default 8)")
    p.add_argument("--beam-alpha", type=float, metavar="A",
                   help="--search beam: keep graphs up to A times the best cost so far (default 1.1)")
    p.add_argument("--max-states", type=int, metavar="N",
                   help="--search exhaustive: give up after N distinct graphs (default 20000)")
    p.add_argument("--measure", nargs="?", const="auto", choices=("auto", "ort", "torch"), metavar="ENGINE",
                   help="also time the original and the optimised model end to end on this machine (onnxruntime "
                        "or torch; default auto: onnxruntime where it runs on the device) and report the measured "
                        "speed-up and whether it is beyond the noise")
    p.add_argument("--measure-repeats", type=int, default=None, metavar="N",
                   help="timed runs per round of --measure and of the guard (6 to 20 alternating rounds of the "
                        "original, the optimised model and an A/A copy of the original; default 10 for --measure, "
                        "5 for the guard, whose fresh session per round is what varies most)")
    p.add_argument("--threads", default="1", metavar="N|all",
                   help="onnxruntime intra-op threads the model will run with (default 1; all: one per core, a plain "
                        "InferenceSession's default): kernel costs, the guard and --measure time at it, since "
                        "which rewrite pays depends on it")
    p.add_argument("--no-guard", dest="guard", action="store_false",
                   help="onnxruntime targets: skip the measured guard (by default the original, the pre-passes' "
                        "result and the search's best are timed end to end with an A/A control, and the fastest "
                        "that is not slower than the original is written); the result is then unmeasured")
    p.add_argument("--rules", default="all", metavar="SET",
                   help="rule set the search uses: all (default), elementary, composite, a rule file's stem "
                        "(lora, reparam, ...), or several joined with + (elementary+lora)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_optimize)


def cmd_graphs_list(args: argparse.Namespace) -> int:
    """The table streams: its header at once, then a row as each graph is built (building all of them takes
    minutes), or every row at once with --no-sizes."""
    from xrl import graphs

    names = graphs.names(args.suite)
    specs = [graphs.BUILTIN_GRAPHS[n] for n in names]
    if args.json:
        print_json([{"name": n, "suite": spec.suite, "family": spec.family, **_graph_sizes(n, args.no_sizes),
                     "description": spec.description} for n, spec in zip(names, specs, strict=True)])
        return 0
    widths = [max(len("name"), *map(len, names)), max(len("suite"), *(len(s.suite) for s in specs))]
    cols = ["name", "suite"] + ([] if args.no_sizes else ["ops", "params", "FLOPs"]) + ["description"]
    widths += [] if args.no_sizes else [5, 7, 7]

    def line(vals: list[str]) -> str:
        cells = [v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths, strict=False))]
        return "  ".join([*cells, vals[-1]]).rstrip()

    print(line(cols))
    print(line(["-" * w for w in widths] + ["-" * len("description")]), flush=True)
    for name, spec in zip(names, specs, strict=True):
        sizes = [] if args.no_sizes else _graph_sizes(name, False)
        row = [name, spec.suite] + ([] if args.no_sizes else [str(sizes["ops"]), human_count(sizes["parameters"]),
                                                              human_count(sizes["flops"])])
        print(line([*row, spec.description]), flush=True)
    return 0


def _graph_sizes(name: str, skip: bool) -> dict:
    """ops, parameters and FLOPs of a built-in graph (built now), or nothing when `skip`."""
    if skip:
        return {}
    from xrl import graphs
    from xrl.frontends.onnx_io import from_onnx
    from xrl.ir.ops import graph_flops

    graph = from_onnx(graphs.build(name), name=name)
    return {"ops": len(graph), "parameters": graph.num_parameters, "flops": graph_flops(graph)}


def cmd_graphs_export(args: argparse.Namespace) -> int:
    from xrl import graphs
    from xrl.api import check_output_path
    from xrl.frontends.onnx_write import save_onnx

    out = check_output_path(args.output, None, force=args.force)
    save_onnx(graphs.build(args.name, batch=args.batch, seed=args.seed), out)
    print(f"wrote {out}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from xrl.ir.ops import graph_bytes, graph_flops

    loaded = load(args)
    g = loaded.graph
    edges = sum(len([v for v in n.inputs if v]) for n in g.nodes.values())
    info = {
        "model": loaded.source, "kind": loaded.kind, "nodes": len(g), "edges": edges,
        "inputs": {v: list(g.types[v].shape) for v in g.inputs},
        "outputs": {name: list(g.types[v].shape) for name, v in zip(g.output_names, g.outputs)},
        "parameters": g.num_parameters, "weights": len(g.initializers),
        "flops": graph_flops(g), "bytes": graph_bytes(g), "ops": g.op_histogram(),
        "hash": g.canonical_hash,
    }
    if args.json:
        print_json(info)
        return 0
    print(f"{info['model']} ({info['kind']}): {info['nodes']} ops, {edges} edges, "
          f"{human_count(info['parameters'])} parameters, {human_count(info['flops'])}FLOPs, "
          f"{human_count(info['bytes'])}B moved")
    for v in info["inputs"]:
        print(f"  input  {v}: {g.types[v]}")
    for name, v in zip(g.output_names, g.outputs):
        print(f"  output {name}: {g.types[v]}")
    print(format_table(["op", "count"], list(info["ops"].items())))
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from xrl.cost import get_cost_model

    loaded = load(args)
    options = {"repeats": args.repeats} if args.repeats else {}
    # no --device: this machine (the factory's None is each backend's own default)
    model = get_cost_model(args.cost, device=args.device or "auto", target=args.target, **options)
    t0 = time.perf_counter()
    m = model.measure(loaded.graph)
    elapsed = time.perf_counter() - t0
    result = {"model": loaded.source, "cost_model": model.describe(), "cost_s": m.median_s, "repeats": m.repeats,
              "cv": m.cv, "min_s": m.min_s, "max_s": m.max_s, "nodes": len(loaded.graph), "time_s": elapsed}
    top = []
    if args.per_op and not model.measured:
        costs = model.op_costs(loaded.graph)
        top = sorted(costs.items(), key=lambda kv: -kv[1])[:15]
        result["top_ops"] = [{"node": n, "op": loaded.graph.nodes[n].op, "cost_s": c} for n, c in top]
    if args.json:
        print_json(result)
        return 0
    spread = f" (median of {m.repeats}, CV {m.cv:.1%})" if m.repeats > 1 else ""
    print(f"{loaded.source}: {human_seconds(m.median_s)} under {model.describe()}{spread}")
    if top:
        print(format_table(["node", "op", "cost"], [[n, loaded.graph.nodes[n].op, human_seconds(c)] for n, c in top]))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from xrl.cost import calibrate
    from xrl.errors import XrlError

    if args.threads < 1 or args.repeats < 5:
        raise XrlError("--threads must be at least 1 and --repeats at least 5")
    print("calibrating: onnxruntime on this CPU (about 30 s) ...", file=sys.stderr, flush=True)
    cal = calibrate.calibrate(threads=args.threads, repeats=args.repeats)
    path = calibrate.save(cal)
    if args.json:
        print_json({**asdict(cal), "path": str(path)})
        return 0
    print(f"{cal.machine}, onnxruntime {cal.onnxruntime}, {cal.threads} thread(s):")
    print(f"  per-kernel overhead {human_seconds(cal.launch_overhead_s)}, bandwidth {cal.bandwidth / 1e9:.1f} GB/s, "
          f"GEMM peak {cal.peak_flops / 1e9:.1f} GFLOP/s, saturation at {human_count(cal.saturation_flops)}FLOP")
    print(format_table(["MatMul MxKxN", "GFLOP/s"], [[k, f"{v / 1e9:.1f}"] for k, v in cal.gemm_rates.items()]))
    print(f"wrote {path}: the ort-cpu target now estimates with profile {calibrate.PROFILE_NAME}")
    return 0


def measured_line(m: MeasuredSpeedup) -> str:
    """One line for a measured speed-up: both medians, the ratio, the verdict, the rounds."""
    rounds = ", ".join(f"{r:.3f}" for r in m.round_speedups)
    control = m.control
    aa = f"; A/A control of the original [95% {control[0]:.3f}-{control[1]:.3f}]" if control else ""
    low, high = m.interval
    return (f"measured under {m.cost_model}: {human_seconds(m.before.median_s)} (CV {m.before.cv:.1%}) -> "
            f"{human_seconds(m.after.median_s)} (CV {m.after.cv:.1%}), {m.speedup:.3f}x "
            f"[95% {low:.3f}-{high:.3f}]{aa}: {m.verdict}"
            f"{' (the same graph)' if m.identical else ''} ({len(m.round_speedups)} rounds: {rounds})")


def parse_threads(text: str) -> int | None:
    """--threads: a count of at least 1, or "all" (None: one per core)."""
    if text.strip().lower() == "all":
        return None
    try:
        threads = int(text)
    except ValueError:
        threads = 0
    if threads < 1:
        from xrl.errors import ConfigError

        raise ConfigError(f"--threads takes a whole number of at least 1 or 'all', not {text!r}")
    return threads


def add_value_args(p: argparse.ArgumentParser) -> None:
    """The guided search's use of the policy's value head (xrl.rl.guided: value_weight, value_stop)."""
    p.add_argument("--value-weight", type=float, metavar="W",
                   help="--search rl, guided: rank the beam by the gain reached plus W times the value head's "
                        "estimate of the gain left (default 1; 0: by the gain reached alone)")
    p.add_argument("--value-stop", type=float, metavar="T",
                   help="--search rl, guided: do not expand a state the value head gives at most T%% of the input's "
                        "cost left, and end the search when no other state is left open (default: off)")


def value_options(args: argparse.Namespace) -> dict:
    """--value-weight / --value-stop as the search options of --search rl (checked there)."""
    return {k: v for k, v in (("value_weight", args.value_weight), ("value_stop", args.value_stop)) if v is not None}


def _stopped(details: dict) -> str:
    """Why the search ended, where it says (greedy): converged, or stopped by a limit."""
    why = details.get("stopped")
    return "" if not why else " (converged)" if why == "converged" else f" (the search stopped at {why})"


def cmd_optimize(args: argparse.Namespace) -> int:
    from xrl.api import check_output_path, check_search_options, optimize

    # every option is checked before the model is built or read: a bad name must not cost a load
    check_search_options(args.search, args.prepass, args.target, args.cost)
    from xrl.rewrite.rules import check_rule_set

    rules = check_rule_set(args.rules)
    threads = parse_threads(args.threads)
    from xrl.options import check_optimize_options  # numbers in range (--time-limit nan, --seed -1) before the load

    check_optimize_options({"seed": args.seed, "steps": args.steps, "time_limit": args.time_limit, "threads": threads})
    loaded = load(args)
    if args.output:  # fail before the search, not after it
        check_output_path(args.output, loaded.path, force=args.force)
    options: dict = {}
    values = value_options(args)
    if args.policy or args.samples or args.rl_mode or args.prior or values:
        if args.search != "rl":
            from xrl.errors import ConfigError

            raise ConfigError("--policy, --rl-mode, --prior, --samples, --value-weight and --value-stop apply to "
                              "--search rl only")
        options = {"policy": args.policy, **values} if args.policy else dict(values)
        if args.prior:
            options["prior"] = args.prior
        if args.samples:
            options["samples"] = args.samples
        if args.rl_mode:
            options["mode"] = args.rl_mode
    beam = {"width": args.beam_width, "alpha": args.beam_alpha, "max_states": args.max_states}
    beam = {k: v for k, v in beam.items() if v is not None}
    if beam:
        from xrl.errors import ConfigError

        allowed = {"beam": {"width", "alpha"}, "exhaustive": {"max_states"}}.get(args.search, set())
        if not set(beam) <= allowed:
            raise ConfigError("--beam-width and --beam-alpha apply to --search beam, "
                              "--max-states to --search exhaustive")
        options.update(beam)
    if args.max_cost_calls is not None:
        options["max_cost_calls"] = args.max_cost_calls  # checked (>= 1) by xrl.search.registry
    if args.measure_repeats is not None and args.measure_repeats < 1:
        from xrl.errors import ConfigError

        raise ConfigError(f"--measure-repeats must be at least 1, not {args.measure_repeats}")
    prepass = None if args.prepass is None else [p for p in args.prepass.split(",") if p and p != "none"]
    res = optimize(loaded, output=args.output, search=args.search, cost=args.cost, device=args.device,
                   target=args.target, prepass=prepass,
                   seed=args.seed, steps=args.steps, time_limit=args.time_limit, force=args.force,
                   search_options=options, measure=args.measure,
                   measure_options=None if args.measure_repeats is None else {"repeats": args.measure_repeats},
                   guard=None if args.guard else False,
                   threads=threads, rules=rules)
    # asked to measure, and the written model measured slower: say so in the exit code too
    status = 1 if args.measure and res.verdict == "slower" else 0
    if args.json:
        print_json(res.to_json())
        return status
    kind = "estimated" if res.estimate else "measured"
    print(f"{res.input}: {human_seconds(res.original_cost)} -> {human_seconds(res.optimized_cost)} "
          f"({res.speedup:.3f}x {kind}) for target {res.target} ({res.cost_model}); {res.rewrites} rewrites "
          f"by {res.search} in {res.time_s:.2f} s{_stopped(res.details)}; {res.original_nodes} -> "
          f"{res.optimized_nodes} ops in the written file")
    if res.searched_speedup is not None and abs(res.searched_speedup - res.speedup) > 5e-4:
        print(f"the searched graph: {res.searched_speedup:.3f}x estimated in the research setting, with fused "
              f"kernels the written file lowers back to plain ops")
    for r in res.prepasses:
        if r.applied:
            print(f"pre-pass {r.name}: {r.nodes_before} -> {r.nodes_after} ops{'; ' + r.detail if r.detail else ''}"
                  f"{f' ({r.seconds:.1f} s)' if r.seconds else ''}")
        elif r.detail and (r.detail.startswith("dropped") or r.timed_out):  # stopped by its limit
            print(f"pre-pass {r.name} {r.detail}{f' ({r.seconds:.1f} s)' if r.seconds else ''}")
    print(f"verified against the original with onnxruntime: max abs error {res.max_abs_err:.3g}")
    if res.guard is not None and not res.guard.measured:
        print(f"guard: nothing to time: {res.guard.reason}")
    elif res.guard is not None:
        timed = ", ".join(res.guard.measured)
        at = "all threads" if res.threads is None else f"{res.threads} thread{'s' if res.threads != 1 else ''}"
        print(f"guard: timed the original, an A/A copy and {timed} end to end at {at} ({res.guard.rounds} "
              f"rounds, {res.guard.time_s:.1f} s); {res.guard.reason}")
    elif res.target != "paper":
        print("guard: off (--no-guard): the written model was not measured against the original")
    from xrl.cost.speedup import MeasuredSpeedup

    # a timing of its own (not the original's report of the A/A control)
    timed_itself = res.measured if isinstance(res.measured, MeasuredSpeedup) else None
    if args.measure and res.guard is not None:  # every candidate the guard timed, with its interval
        for label, m in res.guard.measured.items():
            print(f"{label}: {measured_line(m)}")
    elif timed_itself is not None:
        print(measured_line(timed_itself))
    if timed_itself is not None:
        if timed_itself.verdict == "too noisy to tell":
            print(f"xrl: warning: this machine was too noisy to resolve a 3% effect: identical work measured up to "
                  f"{timed_itself.noise:.1%} apart in this run; measure again when it is quieter, or with "
                  f"more --measure-repeats", file=sys.stderr)
        if timed_itself.verdict == "slower":
            advice = ("search under measured cost (--cost e2e) instead" if args.cost in ("target", "analytic", "op")
                      else "the search's own timings did not hold up; keep the original model")
            if args.cost in ("target", "analytic") and args.device not in (None, "auto", "cuda"):
                from xrl.cost.devices import this_machine_profile

                if args.device != this_machine_profile():
                    advice = (f"it was optimised for the {args.device} profile, not this machine: leave out "
                              f"--device to optimise for this one, or {advice}")
            print(f"xrl: warning: the optimised model ran slower on this machine than the original "
                  f"({timed_itself.speedup:.3f}x) under {timed_itself.cost_model}; {advice}", file=sys.stderr)
    if res.stage_seconds:  # where the wall time went, one line
        print("stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in res.stage_seconds.items()))
    if res.output:
        print(f"wrote {Path(res.output)}")
    return status

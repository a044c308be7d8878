"""Rewrite-engine commands: `xrl rules list|verify` and `xrl candidates`."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from xrl.cli.commands import add_model_args, load
from xrl.cli.output import format_table, print_json

RULES_HELP = ("rule set: all (default), elementary, composite, a rule file's stem (lora, reparam, ...), or several "
              "joined with + (elementary+lora)")


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("rules", help="the rewrite rules: list them, verify them numerically")
    rsub = r.add_subparsers(dest="rules_command", metavar="{list,verify}", parser_class=type(r))
    rsub.required = True
    p = rsub.add_parser("list", help="name, family, source/target op counts, multi-output")
    p.add_argument("files", nargs="*", help="rule files or folders (default: the built-in rules)")
    p.add_argument("--rules", default="all", metavar="SET", help=RULES_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rules_list)
    p = rsub.add_parser("verify", help="check every rule on random shapes in float64; exit 1 if one fails")
    p.add_argument("files", nargs="*", help="rule files or folders (default: the built-in rules)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=3, help="random instantiations per rule (default 3)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rules_verify)

    p = sub.add_parser("candidates", help="every graph one rewrite away: count per rule, total, time")
    add_model_args(p)
    p.add_argument("--max-growth", type=float, default=2.0, help="drop candidates over this x the op count")
    p.add_argument("--rules", default="all", metavar="SET", help=RULES_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_candidates)


def cmd_rules_list(args: argparse.Namespace) -> int:
    from xrl.rewrite import load_rules

    rules = load_rules(args.files or None, verified_only=False, rule_set=args.rules)
    summary = rules.summary()
    if args.json:
        print_json(summary)
        return 0
    print(format_table(["rule", "family", "kind", "source ops", "target ops", "multi-output", "what it does"],
                       [[i["name"], i["family"], i["kind"], i["source_ops"], i["target_ops"],
                         "yes" if i["multi_output"] else "", i["comment"]] for i in summary["items"]]))
    fams = ", ".join(f"{k} {v}" for k, v in summary["families"].items())
    kinds = ", ".join(f"{k} {v}" for k, v in summary["kinds"].items())
    print(f"\n{summary['rules']} rules in set {args.rules} ({summary['multi_output']} multi-output; {kinds}): {fams}")
    return 0


def cmd_rules_verify(args: argparse.Namespace) -> int:
    from xrl.rewrite import parse_rule_files, verify_rules

    rules = parse_rule_files(args.files or None)
    t0 = time.perf_counter()
    checks = verify_rules(rules, seed=args.seed, trials=args.trials)
    elapsed = time.perf_counter() - t0
    failed = [c for c in checks if not c.ok]
    if args.json:
        print_json({"rules": len(checks), "verified": len(checks) - len(failed), "failed": len(failed),
                    "time_s": elapsed, "checks": [asdict(c) for c in checks]})
    else:
        print(format_table(["rule", "family", "result", "trials", "max rel err", "detail"],
                           [[c.name, c.family, "verified" if c.ok else "FAILED", c.trials, c.max_err, c.detail]
                            for c in checks]))
        print(f"\n{len(checks) - len(failed)}/{len(checks)} rules verified in {elapsed:.2f} s"
              + (f"; failed (never loaded): {', '.join(c.name for c in failed)}" if failed else ""))
    return 1 if failed else 0


def cmd_candidates(args: argparse.Namespace) -> int:
    from xrl.rewrite import RewriteEngine, load_rules
    from xrl.rewrite.rules import check_rule_set

    check_rule_set(args.rules)  # a bad name must not cost a load
    loaded = load(args)
    engine = RewriteEngine(load_rules(rule_set=args.rules), max_growth=args.max_growth)
    t0 = time.perf_counter()
    cands = engine.candidates(loaded.graph)
    elapsed = time.perf_counter() - t0
    per_rule: dict[str, int] = {}
    for c in cands:
        per_rule[c.rule] = per_rule.get(c.rule, 0) + 1
    result = {"model": loaded.source, "nodes": len(loaded.graph), "candidates": len(cands), "time_s": elapsed,
              "rules": args.rules, "per_rule": per_rule}
    if args.json:
        print_json(result)
        return 0
    if per_rule:
        print(format_table(["rule", "candidates"], sorted(per_rule.items(), key=lambda kv: (-kv[1], kv[0]))))
    print(f"\n{loaded.source}: {len(cands)} candidates from {len(per_rule)} rules in {elapsed * 1e3:.1f} ms "
          f"({len(loaded.graph)} ops)")
    return 0

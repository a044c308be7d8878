"""`xrl policy`: ship a trained policy without the training stack (MLGO's release mode).

    xrl policy export CKPT -o FILE.onnx     # then: xrl optimize G --search rl --policy FILE.onnx
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xrl.cli.output import print_json
from xrl.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="export a trained policy to run without the training stack")
    p_sub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    p_sub.required = True
    ex = p_sub.add_parser("export", help="write a policy checkpoint as an ONNX file that onnxruntime runs")
    ex.add_argument("checkpoint", metavar="CKPT",
                    help="a policy or training checkpoint (`xrl train`), or a shipped policy's name (default, expert)")
    ex.add_argument("-o", "--output", required=True, metavar="FILE.onnx", help="the exported policy")
    ex.add_argument("--check-graph", default="tiny_cnn", metavar="GRAPH",
                    help="built-in graph whose first state the export is checked on (default tiny_cnn)")
    ex.add_argument("--force", action="store_true", help="replace an existing output")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from xrl.policies.export import export_onnx

    out = Path(args.output)
    if out.suffix != ".onnx":
        raise ConfigError(f"the exported policy must be a .onnx file, not {out}")
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists; pass --force to replace it")
    ckpt = args.checkpoint
    if not str(ckpt).endswith(".onnx"):  # a shipped policy's name (`default`, `expert`) or a checkpoint path
        from xrl.rl.checkpoint import resolve_policy_path

        ckpt = resolve_policy_path(ckpt)
    info = export_onnx(ckpt, out, sample_graph=args.check_graph)
    if args.json:
        print_json({"output": str(out), **info})
        return 0
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); on {info['check_graph']}'s first state "
          f"({info['check_candidates']} actions) its logits are the checkpoint's within "
          f"{info['max_logit_error']:.1e}")
    print(f"run it: xrl optimize GRAPH --search rl --policy {out}")
    return 0

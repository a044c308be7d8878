"""Parser, dispatch and the error contract: a user error is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections.abc import Sequence

from xrl.errors import XrlError, XrlWarning


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line, like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    from xrl.cli import commands, rewrite_commands

    parser = _Parser(prog="xrl", description="Optimise deep-learning dataflow graphs by graph RL and search.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    commands.register(sub)
    rewrite_commands.register(sub)
    from xrl.cli import bench_commands, compare_commands, env_commands, policy_commands, rl_commands

    for extra in (rl_commands, compare_commands, env_commands, policy_commands, bench_commands):
        extra.register(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    if issubclass(category, XrlWarning):  # xrl's own warnings: one line, like its errors
        (file or sys.stderr).write(f"xrl: warning: {message}\n")
    else:
        _default(message, category, filename, lineno, file, line)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, systemd and docker send), raised where SIGINT would be: the same `finally`
    blocks end child processes and remove temporary files."""


def _on_sigterm(signum, frame) -> None:  # noqa: ANN001
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process at once
    raise Terminated()


def install_sigterm_handler() -> object:
    """Make SIGTERM unwind like Ctrl-C (only from the main thread, where Python runs signal handlers); the
    handler it replaced (None: left as it was), for `restore_sigterm_handler`."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous != signal.SIG_DFL:  # an embedding program's own handler: leave it
        return None
    signal.signal(signal.SIGTERM, _on_sigterm)
    return previous


def restore_sigterm_handler(previous: object) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    warnings.showwarning = _show_warning
    previous_sigterm = install_sigterm_handler()
    try:
        return _main(argv, debug)
    finally:
        restore_sigterm_handler(previous_sigterm)


def _main(argv: list[str], debug: bool) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        from xrl.cli import output
        from xrl.quiet import stdout_reserved

        # --json: stdout carries the one document; whatever else would print there goes to stderr.
        with stdout_reserved(bool(getattr(args, "json", False))) as out:
            output.JSON_OUT = out
            try:
                return int(args.func(args) or 0)
            finally:
                output.JSON_OUT = None
    except XrlError as e:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"xrl: error: {e}\n")
        return 2
    except Terminated:
        sys.stderr.write("xrl: terminated\n")
        return 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
    except KeyboardInterrupt:
        sys.stderr.write("xrl: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError as e:  # past every size check (a raised XRL_MAX_ELEMENTS): still the user's model
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"xrl: error: out of memory ({e or 'MemoryError'}); the model is too large for this "
                         f"machine: lower XRL_MAX_ELEMENTS or the input shapes\n")
        return 2
    except SystemExit:
        raise
    except Exception as e:  # a bug in xrl, not a user error: still one line unless --debug
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"xrl: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())

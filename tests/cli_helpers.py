"""Running the CLI in tests and checking its user-error contract."""

from __future__ import annotations

from xrl.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *needles: str) -> None:
    """Exit code 2, one line on stderr, no traceback, and each needle in the message."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"

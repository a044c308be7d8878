"""`xrl optimize` reads models only from regular files: a device or a FIFO is refused before it is read."""

from __future__ import annotations

import os

from cli_helpers import assert_user_error, run


def test_a_device_or_a_fifo_is_not_a_model(capsys, tmp_path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    for spec in ("/dev/zero", str(fifo)):
        code, _, err = run(capsys, "optimize", spec, "-o", str(tmp_path / "out.onnx"))
        assert_user_error(code, err, "not a regular file")

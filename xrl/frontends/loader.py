"""One entry point for every model a user can name: a built-in graph, an ONNX file, an HLO text file."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx

from xrl.errors import ModelLoadError
from xrl.ir import Graph


class LoadedModel:
    """A model in the IR, with the ONNX model that optimised versions are verified against.

    For ONNX input the reference is the user's own file; for a built-in graph, the model its builder
    made; for HLO text (which onnxruntime cannot run) the IR exported as is, which the HLO tests check
    against jax's own outputs.

    The reference is a second copy of every weight beside the IR's. `take_reference()` hands it over
    and lets go of it where it can be made again (`reload`: the file read again, the graph built again),
    so a caller that needs it once (`xrl.api.optimize`: the original's outputs, the pre-passes) does not
    keep it for the whole run; `reference` gives it (read again if it was taken) and keeps it.
    """

    __slots__ = ("graph", "source", "kind", "path", "_held", "_reload")

    def __init__(self, graph: Graph, reference: onnx.ModelProto | None, source: str, kind: str,
                 path: Path | None = None, *, reload: Callable[[], onnx.ModelProto] | None = None) -> None:
        if reference is None and reload is None:
            raise ValueError("a LoadedModel needs its reference model or a way to make it")
        self.graph = graph
        self.source = source
        self.kind = kind  # "builtin" | "onnx" | "hlo" | "graph"
        self.path = path
        self._held = reference
        self._reload = reload

    @property
    def reference(self) -> onnx.ModelProto:
        if self._held is None:
            self._held = self._reload()  # type: ignore[misc]
        return self._held

    @property
    def holds_reference(self) -> bool:
        return self._held is not None

    def reference_head(self) -> tuple[onnx.ModelProto, dict]:
        """The reference as a head and its big weights (`xrl.frontends.onnx_weights.split_model`), each weight whose
        bytes equal the IR's being the IR's array. For an ONNX file it is read one weight at a time, so no model
        holding every weight is built beside the IR (bert-base: the peak 3.7x -> 1.7x the weights); the reference
        is not held here afterwards where it can be made again."""
        from xrl.frontends.onnx_weights import split_model

        if self.kind == "onnx" and self.path is not None and self._held is None:
            from xrl.frontends.onnx_io import read_model_head

            head = read_model_head(self.path, like=self.graph.initializers)
            if head is not None:
                return head
        return split_model(self.take_reference(), like=self.graph.initializers)

    def take_reference(self) -> onnx.ModelProto:
        """The reference, no longer held here when it can be made again (the caller's is then the only one)."""
        ref = self.reference
        if self._reload is not None:
            self._held = None
        return ref

    def __repr__(self) -> str:
        return f"LoadedModel({self.source!r}, kind={self.kind!r}, {len(self.graph)} nodes)"


def names_a_file(spec: str) -> bool:
    """Whether `spec` names a file (it has a suffix or a slash, or exists) rather than a built-in graph."""
    path = Path(spec)
    return path.suffix != "" or "/" in spec or path.exists()


def check_regular_file(path: Path, what: str) -> None:
    """Refuse a path that is not a regular file: a device (/dev/zero) would be read until memory runs out,
    a FIFO would block for good. `what` names it in the message."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ModelLoadError(f"{what}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(f"{what} is not a regular file (a device, pipe or directory); xrl reads models "
                             "only from files")


def load_model(spec: str, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
               batch: int = 1, seed: int = 0) -> LoadedModel:
    """Load `spec`: a path to an .onnx or HLO text file, or the name of a built-in graph."""
    from xrl import graphs
    from xrl.frontends.hlo import load_hlo, looks_like_hlo
    from xrl.frontends.model_limits import check_declared_sizes
    from xrl.frontends.onnx_io import from_onnx, load_onnx, to_onnx

    if not names_a_file(spec):
        model = graphs.build(spec, batch=batch, seed=seed)
        return LoadedModel(from_onnx(model, input_shapes, name=spec), model, spec, "builtin",
                           reload=lambda: graphs.build(spec, batch=batch, seed=seed))
    path = Path(spec)
    if not path.exists():
        raise ModelLoadError(f"{spec}: no such file (give an .onnx file, an HLO text file, or a built-in graph "
                             f"name from `xrl graphs list`)")
    if path.is_dir():
        raise ModelLoadError(f"{spec} is a directory, not a model file")
    check_regular_file(path, spec)
    with path.open("rb") as f:
        head = f.read(4096)
    if looks_like_hlo(head.decode("utf-8", errors="replace")):
        if input_shapes:
            raise ModelLoadError("--input-shape applies to ONNX models; HLO modules have static shapes")
        graph = load_hlo(path)
        return LoadedModel(graph, None, spec, "hlo", path, reload=lambda: to_onnx(graph))
    # every weight's declared size (dims, external data's length) against XRL_MAX_ELEMENTS before onnx.load
    # reads any of it: a 3 GiB sparse external file must be refused, not read
    check_declared_sizes(path)
    graph = load_onnx(path, input_shapes)
    # the file is read again when the reference is wanted (onnx.load): the IR holds the weights meanwhile
    return LoadedModel(graph, None, spec, "onnx", path, reload=lambda: _read_again(path))


def _read_again(path: Path) -> onnx.ModelProto:
    from xrl.frontends.onnx_weights import read_head

    try:
        try:  # one weight at a time into the model: no copy of the file's bytes beside it
            model, _ = read_head(str(path), whole=True)
            if model.HasField("graph") and not any(t.data_location == onnx.TensorProto.EXTERNAL
                                                   for t in model.graph.initializer):
                return model
        except ValueError:
            pass
        return onnx.load(str(path))
    except Exception as e:  # the file changed or went away since it was loaded
        raise ModelLoadError(f"{path} could not be read again ({type(e).__name__}: {e}); "
                             f"keep the model file in place while xrl runs") from e


def parse_input_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse repeated `name=1,3,224,224` options."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
            if not shape or min(shape) <= 0:
                raise ValueError
        except ValueError:
            raise ModelLoadError(f"--input-shape {item!r}: expected NAME=D1,D2,... with positive integers, "
                                 f"e.g. input=1,3,224,224") from None
        shapes[name] = shape
    return shapes

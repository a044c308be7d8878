"""Built-in benchmark graphs (imported as xrl.graphs).

Each built-in graph is a builder that returns a valid float32 ONNX model (opset 17) with seeded
weights: `build("bert", batch=1, seed=0)`. The same name, batch and seed always give a
byte-identical model. Suites: "xrlflow" (X-RLflow's evaluation graphs), "taso" (the extra TASO and
Tensat benchmarks), "small" (tiny graphs for fast tests and demos), "headroom" (graphs where the
best rewrite sequence starts with steps greedy search does not take: `graphs/headroom.py`), and the
deployment families of issue 23 (`graphs/families/`): torch modules exported with both torch exporters,
"families" at small size (`fam_<member>_<ts|dynamo>`) and "families_full" at deployment size
(`fam_<member>_full_<ts|dynamo>`), and "families_xl" (`fam_<member>_xl_ts`: the families that have an "xl"
size, TorchScript export only; 12-layer transformers and 27-block CNNs, the graphs of issue 24 that search
cannot exhaust). A family graph is an exporter's output: its opset is the exporter's
(17 for TorchScript, 18 for dynamo), its inputs may be int64 masks, and it needs torch (and onnxscript
for dynamo) to build; dynamo's output is value-deterministic for a seed (see tests/test_families.py).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import onnx

from xrl.errors import ConfigError, UnknownGraphError

from . import cnns, headroom, rnns, small, transformers


@dataclass(frozen=True)
class BuiltinGraph:
    name: str
    family: str  # "transformer" | "cnn" | "rnn" | "small"
    description: str
    suite: str  # "xrlflow" | "taso" | "small" | "headroom"
    build: Callable[..., onnx.ModelProto]  # build(batch: int = 1, seed: int = 0)


SUITES = ("xrlflow", "taso", "small", "headroom", "families", "families_full", "families_xl")

_GRAPHS = [
    BuiltinGraph("bert", "transformer", transformers.BERT_DOC, "xrlflow", transformers.bert),
    BuiltinGraph("vit", "transformer", transformers.VIT_DOC, "xrlflow", transformers.vit),
    BuiltinGraph("dalle", "transformer", transformers.DALLE_DOC, "xrlflow", transformers.dalle),
    BuiltinGraph("tt", "transformer", transformers.TT_DOC, "xrlflow", transformers.tt),
    BuiltinGraph("inception_v3", "cnn", cnns.INCEPTION_DOC, "xrlflow", cnns.inception_v3),
    BuiltinGraph("resnext50", "cnn", cnns.RESNEXT50_DOC, "xrlflow", cnns.resnext50),
    BuiltinGraph("squeezenet", "cnn", cnns.SQUEEZENET_DOC, "xrlflow", cnns.squeezenet),
    BuiltinGraph("nasrnn", "rnn", rnns.NASRNN_DOC, "taso", rnns.nasrnn),
    BuiltinGraph("nasnet_a", "cnn", cnns.NASNET_DOC, "taso", cnns.nasnet_a),
    BuiltinGraph("resnet50", "cnn", cnns.RESNET50_DOC, "taso", cnns.resnet50),
    BuiltinGraph("vgg19", "cnn", cnns.VGG19_DOC, "taso", cnns.vgg19),
    BuiltinGraph("mlp", "small", small.MLP_DOC, "small", small.mlp),
    BuiltinGraph("tiny_cnn", "small", small.TINY_CNN_DOC, "small", small.tiny_cnn),
    BuiltinGraph("lora_mlp", "transformer", headroom.LORA_MLP_DOC, "headroom", headroom.lora_mlp),
    BuiltinGraph("lora_tiny", "transformer", headroom.LORA_TINY_DOC, "headroom", headroom.lora_tiny),
    BuiltinGraph("lora_decode", "transformer", headroom.LORA_DECODE_DOC, "headroom", headroom.lora_decode),
    BuiltinGraph("multi_lora", "transformer", headroom.MULTI_LORA_DOC, "headroom", headroom.multi_lora),
    BuiltinGraph("lora_qkv", "transformer", headroom.LORA_QKV_DOC, "headroom", headroom.lora_qkv),
    BuiltinGraph("lora_ffn", "transformer", headroom.LORA_FFN_DOC, "headroom", headroom.lora_ffn),
    BuiltinGraph("lora_attention", "transformer", headroom.LORA_ATTENTION_DOC, "headroom", headroom.lora_attention),
    BuiltinGraph("lora_attention_all", "transformer", headroom.LORA_ATTENTION_ALL_DOC, "headroom",
                 headroom.lora_attention_all),
    BuiltinGraph("fire_small", "cnn", headroom.FIRE_SMALL_DOC, "headroom", headroom.fire_small),
    BuiltinGraph("inception_a_small", "cnn", headroom.INCEPTION_A_SMALL_DOC, "headroom", headroom.inception_a_small),
]


def _family_builder(name: str, member: str, size: str, exporter: str,
                    description: str) -> Callable[..., onnx.ModelProto]:
    def build(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
        from . import families  # torch: imported only when a family graph is built

        model = families.build_onnx(member, size, exporter, seed=seed, batch=batch)
        model.graph.name, model.doc_string = name, description
        return model

    return build


def _family_graphs() -> list[BuiltinGraph]:
    from .families import DESCRIPTIONS, FAMILY_SIZES, KINDS, MEMBERS

    out = []
    sizes = (("small", "families", ""), ("full", "families_full", "_full"), ("xl", "families_xl", "_xl"))
    for size, suite, tag in sizes:
        for member, text in DESCRIPTIONS.items():
            if size not in FAMILY_SIZES[MEMBERS[member]]:  # xl: some families; the deployment models: none
                continue
            for exporter in ("ts",) if size == "xl" else ("ts", "dynamo"):
                name = f"fam_{member}{tag}_{exporter}"
                desc = f"{text} ({size} size, {'TorchScript' if exporter == 'ts' else 'dynamo'} export)"
                out.append(BuiltinGraph(name, KINDS[member], desc, suite,
                                        _family_builder(name, member, size, exporter, desc)))
    return out


_GRAPHS += _family_graphs()
BUILTIN_GRAPHS: dict[str, BuiltinGraph] = {g.name: g for g in _GRAPHS}


def names(suite: str | None = None) -> list[str]:
    """Built-in graph names in registry order (xrlflow, taso, small, headroom, families, families_full, families_xl),
    optionally of one suite."""
    if suite is not None and suite not in SUITES:
        raise UnknownGraphError(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    return [g.name for g in _GRAPHS if suite is None or g.suite == suite]


def _conflict_source(name: str) -> tuple[str, int] | None:
    """(kind, seed) of a generated conflict graph's name `gen_<kind>_<seed>` (`graphs/conflicts.py`), else None."""
    from .conflicts import KINDS

    kind, _, seed = name.rpartition("_")
    return (kind, int(seed)) if kind in KINDS and seed.isdigit() else None


def build(name: str, *, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Build the built-in graph `name` as an ONNX model with batch size `batch` and weights from `seed`. The
    research suite's generated conflict graphs resolve too, by their names `gen_<kind>_<seed>` (not listed)."""
    graph = BUILTIN_GRAPHS.get(name)
    conflict = _conflict_source(name) if graph is None else None
    if graph is None and conflict is None:
        close = difflib.get_close_matches(name, BUILTIN_GRAPHS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownGraphError(f"unknown built-in graph {name!r}; {hint}valid names: {', '.join(BUILTIN_GRAPHS)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch!r}")
    if conflict is not None:
        from .conflicts import conflict_graph

        # the research suite's generated graphs: the seed in the name draws the graph itself (its sizes and
        # motifs), so `seed` does not apply
        return conflict_graph(*conflict, batch=batch)
    return graph.build(batch=batch, seed=seed)

"""Deployment families (issue 23): torch modules written as their libraries write them, exported with
both torch exporters, each with its limit (the same network merged / re-parameterised in torch).

    from xrl.graphs import families
    model = families.build_onnx("lora_encoder", "small", "ts", seed=0)          # onnx.ModelProto
    limit = families.build_onnx("lora_encoder", "small", "ts", seed=0, limit=True)
    feeds = families.input_feeds("lora_encoder", "small")                       # name -> np.ndarray
    families.verify_limit("repvgg", "small", "dynamo")                          # max abs error, checked

Families and members (modules `lora`, `reparam`, `llama`, `attention`; sizes "small" for tests, "full"
for the benchmark, "xl" for graphs search cannot exhaust (issue 24: 12-layer LoRA encoders and decoders
with adapters on every projection, 12-layer LLaMA decoders, RepVGG-B-layout reparam networks of 27
blocks; the families that have it: XL_FAMILIES); exporters "ts" (TorchScript, opset 17) and "dynamo" (opset 18)).
The family `deploy` (module `deploy`: the deployment benchmark's BERT, GPT, ViT, ResNet-50 and EfficientNet,
issue 10) has sizes "tiny" and "base" and no limit (limit_kind "none"); it is benchmarked, not registered
as built-in graphs (`xrl.graphs` registers the sizes small, full and xl only):
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:
    from .export import Built

# Nothing here imports torch: the family modules are imported when a member is built.
LIMIT_FAMILIES = ("lora", "reparam", "llama", "attention")  # the families with a limit
FAMILIES = (*LIMIT_FAMILIES, "deploy")
EXPORTERS = ("ts", "dynamo")
# one name per exporter; the deployment benchmark's old spelling of TorchScript is read as "ts"
EXPORTER_ALIASES = {"ts": "ts", "torchscript": "ts", "dynamo": "dynamo"}
# each family's sizes, the smallest first (the rows of its DIMS)
FAMILY_SIZES = {"lora": ("small", "full", "xl"), "reparam": ("small", "full", "xl"), "llama": ("small", "full", "xl"),
                "attention": ("small", "full"), "deploy": ("tiny", "base")}
SIZES = tuple(dict.fromkeys(s for sizes in FAMILY_SIZES.values() for s in sizes))
XL_FAMILIES = tuple(f for f in FAMILIES if "xl" in FAMILY_SIZES[f])
# member -> (family, kind for the registry, one-line description)
_TABLE = {
    "lora_encoder": ("lora", "transformer", "BERT-style post-LN encoder layers with PEFT LoRA (r 16) on q/k/v/o and "
                     "the MLP, unmerged"),
    "lora_decoder": ("lora", "transformer", "OPT-style pre-LN causal decoder layers with PEFT LoRA (r 8) on q/k/v/o "
                     "and the MLP, unmerged"),
    "lora_vit": ("lora", "transformer", "ViT with PEFT LoRA (r 32) on q/k/v/o and the MLP, unmerged"),
    "lora_server": ("lora", "transformer", "BERT-style encoder with q/v LoRA adapters (r 8) as graph inputs (a "
                    "multi-LoRA server: nothing may be merged)"),
    "lora_dora": ("lora", "transformer", "BERT-style encoder layers with PEFT DoRA (use_dora, r 16) on q/k/v/o and "
                  "the MLP, unmerged"),
    "repvgg": ("reparam", "cnn", "RepVGG-A0-layout CNN in training form (3x3+BN, 1x1+BN, identity BN per block)"),
    "acnet": ("reparam", "cnn", "ACNet CNN in training form (3x3, 1x3, 3x1 conv+BN per block)"),
    "dbb": ("reparam", "cnn", "Diverse Branch Block CNN in training form (3x3, 1x1, 1x1-avg, 1x1-3x3 branches)"),
    "mobileone": ("reparam", "cnn", "MobileOne-style CNN in training form (over-parameterised dw/pw branches)"),
    "llama": ("llama", "transformer", "LLaMA-style decoder: RMSNorm, rotate-half RoPE, SwiGLU, GQA, causal SDPA"),
    "llama_eager": ("llama", "transformer", "LLaMA-style decoder: RMSNorm, interleaved RoPE, SwiGLU, GQA, explicit "
                    "softmax with an additive causal mask"),
    "attn_mha": ("attention", "transformer", "post-LN encoder layers with nn.MultiheadAttention and a key padding "
                 "mask"),
    "attn_mha_causal": ("attention", "transformer", "pre-LN layers with bias-free nn.MultiheadAttention and a "
                        "boolean causal mask"),
    "attn_sdpa": ("attention", "transformer", "pre-LN layers, bias-free separate q/k/v, F.scaled_dot_product_attention "
                  "with a boolean padding mask"),
    "attn_packed": ("attention", "transformer", "pre-LN layers with timm's packed-QKV attention, explicit softmax"),
    "attn_bert": ("attention", "transformer", "post-LN layers with HF BertSelfAttention (separate biased q/k/v, "
                  "additive mask)"),
    "bert": ("deploy", "transformer", "BERT-style post-LN encoder (nn.TransformerEncoderLayer, GELU) with token and "
             "position embeddings and a padding mask"),
    "gpt": ("deploy", "transformer", "GPT-2-style pre-LN causal decoder with packed QKV and tanh GELU"),
    "vit": ("deploy", "transformer", "ViT-B/16: conv patch embedding, cls token, pre-LN encoder layers, linear head"),
    "resnet": ("deploy", "cnn", "ResNet-50 (torchvision's v1.5 layout) with seeded BatchNorm statistics"),
    "effnet": ("deploy", "cnn", "EfficientNet-B0-style CNN: MBConv, SiLU, squeeze-excite, explicit TF-'same' "
               "ZeroPad2d padding"),
}
MEMBERS: dict[str, str] = {m: fam for m, (fam, _, _) in _TABLE.items()}  # member -> family
KINDS: dict[str, str] = {m: kind for m, (_, kind, _) in _TABLE.items()}
DESCRIPTIONS: dict[str, str] = {m: text for m, (_, _, text) in _TABLE.items()}
# one member per family with a size small (the limit families) that the fast tests build with both exporters
REPRESENTATIVE = {"lora": "lora_encoder", "reparam": "repvgg", "llama": "llama", "attention": "attn_bert"}
# what onnxruntime's transformers optimizer is told (None: not a transformer, the peer does not apply)
ORT_MODEL_TYPE = {"lora_encoder": "bert", "lora_server": "bert", "lora_dora": "bert", "lora_decoder": "gpt2",
                  "lora_vit": "vit", "llama": "gpt2", "llama_eager": "gpt2", "attn_mha": "bert",
                  "attn_mha_causal": "gpt2", "attn_sdpa": "bert", "attn_packed": "vit", "attn_bert": "bert",
                  "bert": "bert", "gpt": "gpt2", "vit": "vit"}

__doc__ += "\n".join(f"- {fam}: {', '.join(m for m, f in MEMBERS.items() if f == fam)}" for fam in FAMILIES) + "\n"


def family_module(family: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{family}")


def members(size: str | None = None, families: tuple[str, ...] = FAMILIES) -> list[str]:
    """The members of `families` in table order, those that have `size` where one is given."""
    return [m for m, f in MEMBERS.items() if f in families and (size is None or size in FAMILY_SIZES[f])]


def check(member: str, size: str) -> None:
    if member not in MEMBERS:
        raise ValueError(f"unknown family member {member!r}; choose from {', '.join(MEMBERS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    family = MEMBERS[member]
    if size not in FAMILY_SIZES[family]:
        have = [f for f in FAMILIES if size in FAMILY_SIZES[f]]
        raise ValueError(f"{member} ({family}) has no size {size}; its sizes: {', '.join(FAMILY_SIZES[family])}; "
                         f"the families that have {size}: {', '.join(have)}")


def build_module(member: str, size: str = "small", seed: int = 0, batch: int = 1) -> Built:
    """The seeded torch module (eval mode), its inputs, outputs and limit maker."""
    check(member, size)
    return family_module(MEMBERS[member]).build(member, size, seed=seed, batch=batch)


def model_info(member: str, size: str) -> tuple[str | None, int, int]:
    """(onnxruntime transformers model_type, num_heads, hidden_size) for the transformers optimizer."""
    check(member, size)
    d = family_module(MEMBERS[member]).DIMS[size]
    return ORT_MODEL_TYPE.get(member), getattr(d, "heads", 0), getattr(d, "hidden", 0)


def build_onnx(member: str, size: str = "small", exporter: str = "ts", seed: int = 0, batch: int = 1,
               limit: bool = False) -> onnx.ModelProto:
    """The member exported (or its limit, with `limit=True`): a fresh ModelProto."""
    from .export import exporter_key

    return onnx.load_from_string(_exported(member, size, exporter_key(exporter), seed, batch, limit))


@functools.lru_cache(maxsize=32)
def _exported(member: str, size: str, exporter: str, seed: int, batch: int, limit: bool) -> bytes:
    from .export import export

    built = build_module(member, size, seed, batch)
    return export(_module(built, member, limit), built.inputs, built.outputs, exporter).SerializeToString()


def _module(built: Built, member: str, limit: bool):
    """The network to export: the member itself, or its limit."""
    if not limit:
        return built.module
    if built.limit is None:
        raise ValueError(f"{member} has no limit (limit_kind {built.limit_kind!r}: a hand-written reference model)")
    return built.limit()


def input_feeds(member: str, size: str = "small", seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded values for every graph input (adapters of lora_server included)."""
    from .export import feeds

    return feeds(build_module(member, size, 0, batch).inputs, seed)


def limit_kind(member: str) -> str:
    """"exact" where the limit is a re-parameterisation of the network, "plain" where it is the export itself,
    "none" where the member has no limit."""
    size = FAMILY_SIZES[MEMBERS[member]][0] if member in MEMBERS else "small"  # the smallest: cheap to build
    return build_module(member, size).limit_kind


def run(model: onnx.ModelProto | bytes | str | Path, feeds_: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(data) if isinstance(data, Path) else data, opts,
                                providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds_.items() if k in names})


def verify_limit(member: str, size: str = "small", exporter: str = "ts", seed: int = 0, rtol: float = 1e-4,
                 atol: float = 1e-4) -> float:
    """The limit's outputs against the original's under onnxruntime; returns the max abs error, raises
    AssertionError beyond rtol/atol."""
    original = build_onnx(member, size, exporter, seed)
    merged = build_onnx(member, size, exporter, seed, limit=True)
    f = input_feeds(member, size, seed=1)
    err = 0.0
    for a, b in zip(run(original, f), run(merged, f), strict=True):
        err = max(err, float(np.max(np.abs(a.astype(np.float64) - b))))
        scale = float(np.max(np.abs(a)))
        if not np.allclose(b, a, rtol=rtol, atol=atol * max(1.0, scale)):
            raise AssertionError(f"{member}/{size}/{exporter}: the limit differs from the original "
                                 f"(max abs error {err:.3g}, output scale {scale:.3g})")
    return err


def cache_path(cache_dir: Path, member: str, size: str, exporter: str, seed: int = 0, limit: bool = False) -> Path:
    import torch

    from .export import exporter_key

    version = torch.__version__.replace("+", "_")
    tag = "-limit" if limit else ""
    return (Path(cache_dir).expanduser()
            / f"{member}-{size}-{exporter_key(exporter)}-seed{seed}{tag}-torch{version}-{source_hash()}.onnx")


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """A short hash of this package's sources: a cached export is remade when the modules change."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:10]


def cached_export(member: str, size: str, exporter: str, cache_dir: Path, seed: int = 0, limit: bool = False) -> Path:
    """The exported file, made once per member/size/exporter/seed/limit/torch version (the benchmark's cache)."""
    from .export import export

    path = cache_path(cache_dir, member, size, exporter, seed, limit)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        built = build_module(member, size, seed)
        onnx.save(export(_module(built, member, limit), built.inputs, built.outputs, exporter), str(tmp))
        tmp.replace(path)
    return path


__all__ = ["DESCRIPTIONS", "EXPORTER_ALIASES", "EXPORTERS", "FAMILIES", "FAMILY_SIZES", "KINDS", "LIMIT_FAMILIES",
           "MEMBERS", "REPRESENTATIVE", "SIZES", "XL_FAMILIES", "build_module", "build_onnx", "cache_path",
           "cached_export", "input_feeds", "limit_kind", "members", "model_info", "verify_limit"]

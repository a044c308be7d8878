"""Tiny Hugging Face LLaMA exports with PEFT LoRA, as the libraries themselves write them (issue 35, item 5).

Builds `transformers.LlamaForCausalLM` from a `LlamaConfig` written here (no weights are downloaded:
the weights are seeded and made to look trained, RMSNorm scales not 1), wraps it with
`peft.get_peft_model(LoraConfig(r=8, ...))` on every projection (non-zero B, so the adapters change the
output), and exports it with both torch exporters (TorchScript `dynamo=False`, opset 17; dynamo, opset 18):
fixed sequence length, no KV cache, inputs `input_ids` and `attention_mask` (int64, as the model takes
them), output `logits`. The fixtures under tests/fixtures/ are the `tiny` size, which tests use without
transformers installed (tests/test_hf_llama_forms.py), of both attention implementations: SDPA (transformers'
default; hf_llama_lora_tiny_*) and eager (`--attn eager`; hf_llama_lora_eager_tiny_*).

Needs transformers and peft (experiments/requirements-libraries.txt), e.g. installed beside the venv:

    .venv/bin/pip install --no-deps --target /tmp/hfdeps -r experiments/requirements-libraries.txt
    PYTHONPATH=/tmp/hfdeps .venv/bin/python experiments/make_hf_llama_fixtures.py

experiments/bench_hf_llama.py imports `build` and `export_hf` from here for its larger size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
EXPORTERS = ("ts", "dynamo")


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int


SIZES = {
    "tiny": Size(hidden=64, layers=1, heads=4, kv_heads=2, ffn=128, vocab=128, seq=16),  # the test fixtures
    "small": Size(hidden=256, layers=2, heads=4, kv_heads=2, ffn=688, vocab=1024, seq=64),  # the benchmark
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class CausalLM(nn.Module):
    """input_ids, attention_mask -> logits, with the cache off (one prompt, no past)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def build(size: str, seed: int = 0, merged: bool = False, attn: str = "sdpa") -> nn.Module:
    """The PEFT-wrapped LLaMA (adapters unmerged) or, with `merged`, peft's merge_and_unload of the same;
    `attn`: transformers' attention implementation, "sdpa" (its default) or "eager"."""
    import peft
    import transformers

    d = SIZES[size]
    cfg = transformers.LlamaConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.ffn, num_hidden_layers=d.layers,
        num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, max_position_embeddings=max(128, d.seq),
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_cache=False,
        attn_implementation=attn)
    torch.manual_seed(seed)
    base = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm scales that look trained
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
    lcfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
    model = peft.get_peft_model(base, lcfg).eval()
    with torch.no_grad():  # adapters of a trained size (init_lora_weights=False draws B far too large)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    if merged:
        return CausalLM(model.merge_and_unload().eval()).eval()
    return CausalLM(model).eval()


def example_inputs(size: str, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    d = SIZES[size]
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, d.vocab, size=(batch, d.seq), dtype=np.int64),
            "attention_mask": np.ones((batch, d.seq), dtype=np.int64)}


def export_hf(module: nn.Module, size: str, exporter: str) -> onnx.ModelProto:
    """One static-shape export (self-contained ModelProto) of `module` with the given torch exporter."""
    args = tuple(torch.from_numpy(v) for v in example_inputs(size).values())
    names = ["input_ids", "attention_mask"]
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "ts":
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, input_names=names, output_names=["logits"], opset_version=17,
                              do_constant_folding=True, dynamo=False)
            return onnx.load_from_string(buf.getvalue())
        program = torch.onnx.export(module, args, input_names=names, output_names=["logits"], opset_version=18,
                                    dynamo=True, verbose=False)
        with tempfile.TemporaryDirectory(prefix="xrl-hf-") as tmp:
            path = Path(tmp) / "model.onnx"
            program.save(str(path), external_data=False)
            return onnx.load(str(path))


def check(model: onnx.ModelProto, module: nn.Module, size: str) -> float:
    """Max abs difference between onnxruntime on the export and torch on the module."""
    import onnxruntime as ort

    feeds = example_inputs(size, seed=1)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    with torch.no_grad():
        want = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    return float(np.abs(got - want).max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--out", type=Path, default=FIXTURES, help="folder for hf_llama_lora_<size>_<exporter>.onnx")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                    help="transformers' attention implementation (eager: files named hf_llama_lora_eager_...)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    module = build(args.size, args.seed, attn=args.attn)
    stem = "hf_llama_lora" if args.attn == "sdpa" else "hf_llama_lora_eager"
    for exporter in args.exporters.split(","):
        model = export_hf(module, args.size, exporter)
        err = check(model, module, args.size)
        path = args.out / f"{stem}_{args.size}_{exporter}.onnx"
        onnx.save(model, str(path))
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(model.graph.node)} nodes, "
              f"{path.stat().st_size / 1024:.0f} KiB, max |onnxruntime - torch| {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

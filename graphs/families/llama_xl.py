"""A LLaMA-style decoder at deployment scale with unmerged PEFT LoRA adapters (issue 35, item 4).

The body of `llama.LlamaModel` (RMSNorm, rotate-half rotary embeddings, SDPA attention with grouped
key/value heads, SwiGLU MLP, no biases: LLaMA has none) with weights that look trained (non-unit RMSNorm
scales, `export.look_trained`) and PEFT `lora.Linear` adapters (x A^T B^T s beside the base projection,
B non-zero) on q/k/v/o and the MLP's gate/up/down. Its limit is the same network with every adapter
merged in torch (`lora.merge_and_unload`) before export.

Sizes: "1b" is TinyLlama-1.1B's body without its embedding and head (hidden 2048, 32 heads, 4 key/value
heads, SwiGLU 5632, 22 layers: 0.97e9 parameters, 3.9 GB float32); "half" the same with 11 layers
(0.49e9); "tiny" the same structure with a few thousand parameters, for tests.

`export_to` writes the model (or its limit) with its weights as external data, one export per call; a 1e9
model needs about three times its weights in memory while torch exports it, so callers run it in a process
of its own.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
from torch import nn

from . import llama, lora
from .export import Spec, example_args, exporter_key, look_trained, seeded

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SIZES = {
    "tiny": llama.Dims(hidden=16, heads=2, kv_heads=1, ffn=32, seq=4, layers=1),
    "small": llama.Dims(hidden=256, heads=8, kv_heads=2, ffn=704, seq=32, layers=2),
    "half": llama.Dims(hidden=2048, heads=32, kv_heads=4, ffn=5632, seq=128, layers=11),
    "1b": llama.Dims(hidden=2048, heads=32, kv_heads=4, ffn=5632, seq=128, layers=22),
}
RANK = 8


def build(size: str, seed: int = 0, merged: bool = False, rank: int = RANK,
          targets: tuple[str, ...] = TARGETS) -> nn.Module:
    """The decoder with LoRA (rank `rank`, alpha 2 r) on `targets`; merged: the adapters folded in (the limit).

    The same seed gives the same base and adapter weights whether merged or not.
    """
    d = SIZES[size]
    with seeded(seed), torch.no_grad():
        model = llama.LlamaModel(d, sdpa=True, interleaved=False)
        look_trained(model, seed)
        lora.add_lora(model, rank, seed, targets=targets)
    return (lora.merge_and_unload(model) if merged else model).eval()


def inputs(size: str, batch: int = 1) -> list[Spec]:
    d = SIZES[size]
    return [Spec("hidden_states", (batch, d.seq, d.hidden))]


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def export_to(model: nn.Module, size: str, path: Path, exporter: str) -> None:
    """Export `model` to `path` with its weights in one external-data file beside it (`path.name + '.data'`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = example_args(inputs(size))
    names, outputs = ["hidden_states"], ["last_hidden_state"]
    with torch.no_grad():
        if exporter_key(exporter) == "ts":
            # torchscript's exporter writes one file per tensor above 2 GB; re-saved below as one data file
            raw = path.parent / "ts-raw"
            raw.mkdir(exist_ok=True)
            torch.onnx.export(model, args, str(raw / "model.onnx"), input_names=names, output_names=outputs,
                              opset_version=17, do_constant_folding=True, dynamo=False)
            proto = onnx.load(str(raw / "model.onnx"))
            onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=path.name + ".data", size_threshold=1024)
            del proto
            for f in raw.iterdir():
                f.unlink()
            raw.rmdir()
        else:
            program = torch.onnx.export(model, args, input_names=names, output_names=outputs, opset_version=18,
                                        dynamo=True, verbose=False)
            program.save(str(path), external_data=True)

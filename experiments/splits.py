"""The train / validation / held-out split by family, one place for every learning experiment (issue 24).

Families are what a graph is built from, not its size or exporter: LoRA adapters, reparameterised
convolutions (RepVGG, ACNet, DBB, MobileOne), attention blocks, llama blocks, CNN modules (inception,
fire). A policy is trained on TRAIN (members of the training families), its checkpoint selected on VAL
(other members of the same families, never trained on), and evaluated on HELD_OUT, whose families no
training or validation graph comes from.

Used by experiments/expert_iteration.py, experiments/train_default_policy.py (what the policy learns
and is selected on) and experiments/rl_ablation.py (which graphs it reports apart, from the policy's
metadata: its train_graphs and val_graphs).
"""

from __future__ import annotations

FAMILIES = {
    "lora": ("lora_qkv", "lora_ffn", "multi_lora", "lora_tiny", "lora_attention", "lora_decode", "lora_mlp",
             "lora_attention_all"),
    "reparam": ("fam_repvgg_ts", "fam_dbb_ts", "fam_acnet_ts", "fam_mobileone_ts"),
    "attention": ("fam_attn_mha_ts", "fam_attn_sdpa_ts", "fam_attn_packed_ts", "fam_attn_bert_ts"),
    "llama": ("fam_llama_ts",),
    "cnn": ("inception_a_small", "fire_small"),
}
TRAIN_FAMILIES = ("lora", "reparam")
TRAIN = ("lora_qkv", "lora_ffn", "multi_lora", "lora_tiny", "lora_attention", "lora_decode", "fam_repvgg_ts",
         "fam_dbb_ts")
VAL = ("lora_mlp", "fam_acnet_ts")
HELD_OUT = ("inception_a_small", "fire_small", "fam_attn_mha_ts", "fam_attn_sdpa_ts", "fam_llama_ts")


def family_of(graph: str) -> str | None:
    return next((f for f, members in FAMILIES.items() if graph in members), None)


def check() -> None:
    """The split's promises: train and validation from the training families, held-out from none of them."""
    for g in (*TRAIN, *VAL):
        assert family_of(g) in TRAIN_FAMILIES, g
    for g in HELD_OUT:
        assert family_of(g) not in (None, *TRAIN_FAMILIES), g
    assert not set(TRAIN) & set(VAL) and not set(HELD_OUT) & {*TRAIN, *VAL}


check()

"""Issue 24, item 2: the families' "xl" size (graphs search cannot exhaust), registered as the suite
families_xl. Building an xl member takes minutes on this machine, so only the registry and the sizes are
checked here; experiments/xl_graphs.py builds and searches them."""

from __future__ import annotations

import pytest
from xrl.graphs import families as F

from xrl import graphs
from xrl.search.compare import resolve_graphs


def test_families_xl_lists_the_xl_members_of_the_families_that_have_the_size():
    xl = graphs.names("families_xl")
    assert xl == [f"fam_{m}_xl_ts" for m, f in F.MEMBERS.items() if f in F.XL_FAMILIES]
    assert {"fam_lora_encoder_xl_ts", "fam_lora_decoder_xl_ts", "fam_repvgg_xl_ts", "fam_acnet_xl_ts"} <= set(xl)
    assert resolve_graphs("families_xl") == tuple(xl)
    for family in F.XL_FAMILIES:  # 12 layers, or 20+ blocks
        d = F.family_module(family).DIMS["xl"]
        assert getattr(d, "layers", 0) >= 12 or sum(getattr(d, "blocks", ())) >= 20


def test_a_family_without_the_xl_size_says_so():
    with pytest.raises(ValueError, match="no size xl"):
        F.check("attn_bert", "xl")
    F.check("repvgg", "xl")

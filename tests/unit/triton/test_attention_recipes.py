"""Extend, lean, MLA decode and HSTU attention: their gfx942 files are derived and their launch arithmetic follows
the host. That their configs compile for gfx90a is read from the committed proofs and a sample recompiled
(test_committed.py)."""

from __future__ import annotations

import pytest

from cdna2.triton import proof, recipes

TARGETS = {"MI300X-EXTEND_ATTENTION.json": "MI200-EXTEND_ATTENTION.json",
           "MI300X-LEANATTN-DEFAULT.json": "MI200-LEANATTN-DEFAULT.json",
           "MI300X-MLA_DECODE_ROPE-DEFAULT.json": "MI200-MLA_DECODE_ROPE-DEFAULT.json",
           "hstu_attn/MI300X-HSTU_ATTN_FWD.json": "hstu_attn/MI200-HSTU_ATTN_FWD.json",
           "hstu_attn/MI300X-HSTU_ATTN_BWD.json": "hstu_attn/MI200-HSTU_ATTN_BWD.json"}


def test_the_attention_files_of_the_017_tree_are_to_be_derived(aiter_017_tree):
    by_file = {entry.file: entry for entry in proof.classify(aiter_017_tree / proof.CONFIGS, proof.load_rules())}
    assert {name: by_file[name].target for name in TARGETS} == TARGETS
    assert all(by_file[name].status == "pending" for name in TARGETS)


@pytest.mark.parametrize("host", ["MI210", "MI250X"])
def test_lean_attention_launches_as_aiter_does_on_the_host(host):
    """persistent_lean_attention: get_num_sms() * SM_CNT_FACTOR programs (the host's CUs), no XCD remapping on one
    die, and NUM_XCDS 8 as get_num_xcds() returns on every part."""
    rules = proof.load_rules()
    gfx942 = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "XCD_REMAP": True, "SM_CNT_FACTOR": 3, "num_warps": 4,
              "num_stages": 1, "waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    config = proof._with_host(gfx942, rules, host)
    op = next(op for op in rules["ops"] if op["name"] == "lean_attention")
    inputs = {name: rules["hosts"][host][value] for name, value in op["host_inputs"].items()}
    paths = dict(recipes.attention.lean_attention(config, "any", None, **inputs))
    decode = paths["bf16 decode, batch 8"]["values"]  # far more tiles than programs: the grid is every program
    assert decode["total_programs"] == rules["hosts"][host]["compute_units"] * 3
    assert decode["XCD_REMAP"] is False and decode["NUM_XCDS"] == 8 and decode["HEADS_PER_XCD"] == 32 // 8
    prefill = paths["bf16 causal prefill"]["values"]
    assert prefill["causal"] and prefill["MASKED_BLOCKS"] == 2 and prefill["max_output_tile_cnt"] >= 1

"""Extend, lean, MLA decode and HSTU attention: their gfx942 files are derived, their launch arithmetic follows the
host, and the committed gfx90a configs compile, one path per kernel, on 0.1.7 and on v0.1.20.post1 (main's kernels):
one worker call per tree."""

from __future__ import annotations

import json

import pytest

from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.triton import proof, recipes
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.toolchain import triton_python
from releases import coverage

DATA = PACKAGE_DIR / "data" / "triton-configs"
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


def _one_path_per_kernel(variant: str, arch: str) -> list[dict]:
    """The committed configs of one variant, one path of each kernel whose gfx942 kernel spills no VGPR (the
    whole-tree proof compares the others): the widest head of extend, causal with every mask input for HSTU."""
    def derived(name):
        return json.loads((DATA / variant / proof.CONFIGS / name.format(arch=arch)).read_text())
    mla = derived("{arch}-MLA_DECODE_ROPE-DEFAULT.json")
    lean_inputs = {"num_sms": proof.load_rules()["hosts"]["MI210"]["compute_units"]}
    chosen = {
        "extend head 576": recipes.attention.extend_attention(
            derived("{arch}-EXTEND_ATTENTION.json")["large_head_or_fp32"], "large_head_or_fp32", None)[0],
        "lean decode": recipes.attention.lean_attention(
            derived("{arch}-LEANATTN-DEFAULT.json")["any"], "any", None, **lean_inputs)[1],
        "mla stage 1": recipes.attention.mla_decode_rope(
            mla["fwd_grouped_kernel_stage1_rope"], "fwd_grouped_kernel_stage1_rope", None)[0],
        "hstu fwd": recipes.attention.hstu_attention_fwd(
            derived("hstu_attn/{arch}-HSTU_ATTN_FWD.json")["batch_512"], "batch_512", None)[0],
        "hstu bwd": recipes.attention.hstu_attention_bwd(
            derived("hstu_attn/{arch}-HSTU_ATTN_BWD.json")["small_batch"], "small_batch", None)[0],
    }
    return [{**request, "id": name} for name, (path, request) in chosen.items()]


@pytest.fixture(scope="module", params=["0.1.7", "v0.1.20.post1"])
def compiled(request, aiter_017_tree):
    """One worker call per tree: 0.1.7's flat kernels, and v0.1.20.post1's (main's) rewritten ones."""
    if request.param == "0.1.7":
        tree, variant, arch = aiter_017_tree, "0.1.7", "MI200"
    else:
        tree = coverage.aiter_triton_tree(request.getfixturevalue("aiter_git_dir"), request.param)
        variant, arch = "0.1.17-main", "gfx90a"
    requests = _one_path_per_kernel(variant, arch)
    return proof._run_worker(triton_python(DEFAULT_TRITON), tree, requests, "gfx90a", lambda line: None)


@pytest.mark.slow
def test_the_committed_attention_configs_compile_for_gfx90a(compiled):
    assert len(compiled) == 5
    for name, result in compiled.items():
        assert result["ok"], (name, result)
        assert result["lds_bytes"] <= proof.load_rules()["lds_limit_bytes"], (name, result)
        assert any(mfma.startswith("v_mfma_f32_") for mfma in result["mfma"]), (name, result)  # every one dots
        assert not result["vgpr_spills"], (name, result)  # as gfx942's kernels of these paths

"""The ops vLLM calls whose config AITER's wrapper picks in code (unified attention, rope, fused add-rmsnorm-pad): the
wrapper's arithmetic repeated per case, which trees hold them, and what the committed proofs of 0.1.7 and
v0.1.20.post1 found compiling every call for gfx90a."""

from __future__ import annotations

import pytest

from cdna2.triton import proof, recipes
from cdna2.triton.recipes import norm, rope, unified_attention
from releases import coverage
from tests.unit.triton.conftest import committed_entries

LIMIT = 65536
MI210_CUS = 104


def _has(case: dict, **expected) -> bool:
    return {key: case[key] for key in expected} == expected


def test_unified_attention_cases_repeat_the_wrappers_choice():
    cases = unified_attention.cases(MI210_CUS)
    # decode of 8 sequences: (8 // BLOCK_Q 4 + 8) x 8 KV heads = 80 programs < 4 x 104, so the split-KV 3d kernel;
    # segments: next_power_of_2(ceil(416 / 80)) = 8, raised to the 16 a 16-wide tile needs, reduced with 1 warp
    assert _has(cases["3d decode hd128 bs16"], kernel="3d", NUM_SEGMENTS_PER_SEQ=16, TILE_SIZE=16, reduce_num_warps=1)
    assert cases["3d decode hd128 bs32"]["NUM_SEGMENTS_PER_SEQ"] == 8
    assert _has(cases["2d decode hd128 bs32"], BLOCK_M=16, BLOCK_Q=4, TILE_SIZE=32, num_warps=2, num_stages=3)
    assert _has(cases["2d prefill hd64 bs16"], BLOCK_M=128, BLOCK_Q=32, TILE_SIZE=64, num_warps=4, num_stages=1)
    assert cases["2d chunked prefill hd128 bs16"]["BLOCK_M"] == 16
    assert all(case["kernel"] == "2d" and case["window"] == 4097 for key, case in cases.items() if "sliding" in key)
    # a window always takes the 2d kernel; so does short KV or a grid over 4 programs per CU
    assert unified_attention.uses_2d(4097, 8192, 1, MI210_CUS)
    assert unified_attention.uses_2d(0, 512, 1, MI210_CUS) and not unified_attention.uses_2d(0, 513, 1, MI210_CUS)
    assert unified_attention.uses_2d(0, 4096, 417, MI210_CUS) and not unified_attention.uses_2d(0, 4096, 416, MI210_CUS)


def test_rope_cases_repeat_the_wrappers_choice():
    cases = rope.cases(MI210_CUS)
    # 2048 tokens, 32 heads each with its KV head: 64 token splits; heads halved until 1,024 workgroups: 2 a split
    assert _has(cases["mha neox prefill hd128"], SPLIT_H_SIZE=2, num_stages=2, kernel="_rope_kernel_thd_cached_2c_fwd")
    assert cases["gqa gptj prefill hd64"]["kernel"] == "_rope_kernel_cached_thd_2c_gqa_fwd"
    assert cases["gqa gptj prefill hd64"]["QH_per_G"] == 4
    assert _has(cases["gqa neox decode hd64"], BLOCK_T=16, G=8, kernel="_rope_kernel_cached_thd_2c_gqa_onehead_fwd")
    (path, request), = recipes.RECIPES["rope_cached_2c_inplace"](cases["gqa neox prefill hd64"], "", None)
    assert request["values"]["HAVE_OFFS"] and request["values"]["BLOCK_D_HALF"] == 32 and "head" not in request["values"]


def test_rmsnorm_pad_cases_repeat_the_wrappers_choice():
    cases = norm.cases(MI210_CUS)
    # gpt-oss: 2880 padded to a multiple of 256 is 3072, one program per row over next_power_of_2(3072) = 4096
    assert cases["hidden 2880 pad to 256"] == {"N": 2880, "N_OUT": 3072, "BLOCK_SIZE_N": 4096}
    assert cases["hidden 5120"]["BLOCK_SIZE_N"] == 8192


def test_in_code_ops_by_release(aiter_017_tree, aiter_git_dir):
    rules = proof.load_rules()
    on_017 = {entry.op: entry for entry in proof.in_code(aiter_017_tree, rules, "MI210")}
    # 0.1.7 has aiter/ops/triton/rope.py, not the rope/rope.py vLLM imports: no rope entry there
    assert set(on_017) == {"unified_attention", "fused_add_rmsnorm_pad"}
    assert on_017["unified_attention"].file == "aiter/ops/triton/unified_attention.py"
    tree = coverage.aiter_triton_tree(aiter_git_dir, "v0.1.20.post1")
    on_020 = {entry.op: entry for entry in proof.in_code(tree, rules, "MI210")}
    assert on_020["unified_attention"].file == "aiter/ops/triton/attention/unified_attention.py"
    assert on_020["rope"].file == "aiter/ops/triton/rope/rope.py"
    assert on_020["fused_add_rmsnorm_pad"].file == "aiter/ops/triton/normalization/fused_add_rmsnorm_pad.py"
    assert all(entry.status == "in-code" and entry.target is None and entry.configs for entry in on_020.values())


@pytest.mark.parametrize("release, ops", [
    ("0.1.7.post2.dev18", {"unified_attention", "fused_add_rmsnorm_pad"}),
    ("0.1.20.post1", {"unified_attention", "rope", "fused_add_rmsnorm_pad"})])
def test_every_call_the_committed_proofs_compiled_fits_gfx90a_and_a_new_spill_is_named(release, ops):
    entries = committed_entries(release, {"unified_attention", "rope", "fused_add_rmsnorm_pad"})
    assert set(entries) == ops and all(entry["status"] == "in-code" for entry in entries.values())
    for op, entry in entries.items():
        for config in entry["configs"]:
            for path, result in config["paths"].items():
                where = (release, op, config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT, where
                assert bool(result["mfma"]) == (path in ("2d", "3d")), where  # attention dots; the rest do not
            new_spill = config["spills"] and not config["gfx942_spills"]
            assert (f"{config['key']}: " in entry["reason"]) == bool(new_spill), (release, op, config["key"])

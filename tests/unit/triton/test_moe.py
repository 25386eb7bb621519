"""AITER's fused MoE and top-1 routing on gfx90a: the files the rules prove or refuse on the real 0.1.7 tree, the
kernels each recipe names, and what the committed 0.1.7 proof found compiling every path for gfx90a."""

from __future__ import annotations

from cdna2.triton import proof
from cdna2.triton.recipes import moe
from cdna2.triton.recipes.sizes import GEMM_K_UNEVEN
from tests.unit.triton.conftest import committed_entries

LIMIT = 65536


def test_moe_files_of_the_017_tree_are_proven_or_refused_by_name(aiter_017_tree):
    by_file = {entry.file: entry for entry in proof.classify(aiter_017_tree / proof.CONFIGS, proof.load_rules())}
    for name in ("DEFAULT", "INT8_W8A16", "INT4_W4A16"):
        assert by_file[f"moe/MI300X-MOE-{name}.json"].status == "pending"
        assert by_file[f"moe/MI300X-MOE-{name}.json"].target == f"moe/MI200-MOE-{name}.json"
    assert by_file["moe/MI300X-MOE_ROUTING_SIGMOID_TOPK1.json"].op == "moe_routing_sigmoid_top1"
    int8_w8a8 = by_file["moe/MI300X-MOE-INT8_W8A8.json"]
    assert int8_w8a8.status == "refused" and "use_fp8_w8a8" in int8_w8a8.reason
    assert by_file["moe/MI300X-MOE-FP8_W8A8.json"].status == "refused"


def test_each_moe_recipe_names_every_kernel_its_wrapper_launches():
    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4}
    bf16 = dict(moe.moe_bf16(config, "small_M", None))
    assert {request["kernel"] for request in bf16.values()} == {
        "_fused_moe_kernel", "_fused_moe_persistent_kernel", "_fused_moe_silu_kernel"}
    assert {request["modules"][0].rsplit(".", 1)[1] for request in bf16.values()} == {
        "moe_op", "moe_op_silu_fused", "moe_op_gelu"}
    assert sorted(request["values"]["K"] % 64 for request in bf16.values()) == [0, 0, 0, 0, GEMM_K_UNEVEN % 64]  # EVEN_K, not
    int4 = dict(moe.moe_int4_w4a16(config, "large_M", None))
    assert all(request["tensors"]["b_ptr"] == "uint8" and request["values"]["use_int4_w4a16"]
               for request in int4.values())
    int8 = dict(moe.moe_int8_w8a16(config, "large_M", None))
    assert {request["kernel"] for request in int8.values()} == {
        "_fused_moe_kernel", "_fused_moe_kernel_gptq_awq", "_fused_moe_silu_kernel"}
    assert all(request["tensors"]["b_ptr"] == "int8" for request in int8.values())
    routing = dict(moe.moe_routing_sigmoid_top1({"BLOCK_M": 16, "BLOCK_K": 256}, "N16.small", None))
    assert {request["values"]["BLOCK_N"] for request in routing.values()} == {16}
    assert {request["values"]["FUSED_SHARED_EXPERTS"] for request in routing.values()} == {True, False}


def test_every_moe_path_the_017_proof_compiled_is_a_bf16_mfma_kernel_within_lds_without_spills():
    entries = committed_entries("0.1.7.post2.dev18", {"moe", "moe_int8_w8a16", "moe_int4_w4a16",
                                                      "moe_routing_sigmoid_top1"})
    assert len(entries) == 4 and all(entry["status"] in ("derived", "stepped-down") for entry in entries.values())
    for op, entry in entries.items():
        for config in entry["configs"]:
            for path, result in config["paths"].items():
                where = (op, config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT and result["vgpr_spills"] == 0, where
                assert any(name.endswith("bf16_1k") for name in result["mfma"]), where

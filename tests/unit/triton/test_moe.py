"""AITER's fused MoE and top-1 routing on gfx90a: the files the rules prove or refuse on the real 0.1.7 tree, the
kernels each recipe names, and the configs the set ships compiled for gfx90a once (one worker call, every path)."""

from __future__ import annotations

import json

import pytest

from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.recipes import moe
from cdna2.triton.toolchain import triton_python

SHIPPED = PACKAGE_DIR / "data" / "triton-configs" / "0.1.7" / proof.CONFIGS / "moe"
LIMIT = 65536
# the shipped file, the recipe, and the bucket compiled: the largest tiles of each file
COMPILED = (("MI200-MOE-DEFAULT.json", moe.moe_bf16, "large_M"),
            ("MI200-MOE-INT8_W8A16.json", moe.moe_int8_w8a16, "large_M"),
            ("MI200-MOE-INT4_W4A16.json", moe.moe_int4_w4a16, "large_M"),
            ("MI200-MOE_ROUTING_SIGMOID_TOPK1.json", moe.moe_routing_sigmoid_top1, "N128.xlarge"))


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
    assert sorted(request["values"]["K"] % 64 for request in bf16.values()) == [0, 0, 0, 0, 32]  # EVEN_K and not
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


@pytest.fixture(scope="module")
def shipped_compiled(aiter_017_tree):
    """The shipped gfx90a configs, every path of one bucket per file, compiled for gfx90a: one worker call."""
    requests = []
    for name, recipe, key in COMPILED:
        document = json.loads((SHIPPED / name).read_text())
        config = document
        for part in key.split("."):
            config = config[part]
        requests += [{**request, "id": f"{name} {key} {path}"} for path, request in recipe(config, key, None)]
    return proof._run_worker(triton_python(DEFAULT_TRITON), aiter_017_tree, requests, "gfx90a", lambda line: None)


@pytest.mark.slow
def test_shipped_moe_configs_compile_for_gfx90a_within_lds_without_spills(shipped_compiled):
    assert len(shipped_compiled) == 14  # 5 bf16, 4 int8, 3 int4, 2 routing paths
    for identifier, result in shipped_compiled.items():
        assert result["ok"], (identifier, result)
        assert result["lds_bytes"] <= LIMIT, (identifier, result["lds_bytes"])
        assert any(name.endswith("bf16_1k") for name in result["mfma"]), (identifier, result["mfma"])
        # the whole-tree proof stepped each config down until gfx90a spills no more than gfx942 (which spills none)
        assert result["vgpr_spills"] == 0, (identifier, result["vgpr_spills"])

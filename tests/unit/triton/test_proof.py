"""The Triton compile proof: gfx90a configs derived from gfx942's, each compiled for gfx90a with the real triton
wheel in its own venv; the whole 0.1.7 tree's proof (committed: tests/unit/triton/test_committed.py proves it is
today's and recompiles a sample of it)."""

from __future__ import annotations

import pytest

from cdna2.triton import proof, recipes
from cdna2.triton.cli import table

LIMIT = 65536


def test_rules_load_and_every_op_names_a_recipe():
    rules = proof.load_rules()
    assert rules["lds_limit_bytes"] == LIMIT
    assert {op["recipe"] for op in rules["ops"]} <= set(recipes.RECIPES)
    assert rules["hosts"]["MI210"] == {"compute_units": 104, "xcds": 1}


def test_classification_of_the_017_tree(aiter_017_tree):
    configs = aiter_017_tree / proof.CONFIGS
    assert proof.arch_names(configs, proof.load_rules()) == ("MI300X", "MI200")
    by_file = {entry.file: entry for entry in proof.classify(configs, proof.load_rules())}
    assert by_file["gemm/MI300X-GEMM-A16W16.json"].status == "pending"
    assert by_file["gemm/MI300X-GEMM-A16W16.json"].target == "gemm/MI200-GEMM-A16W16.json"
    assert by_file["MI300X-MHA-DEFAULT.json"].target == "MI200-MHA-DEFAULT.json"
    assert by_file["moe/MI300X-MOE-FP8_W8A8.json"].status == "refused"
    assert "FP8" in by_file["gemm/MI300X-GEMM-A8W8_BLOCKSCALE.json"].reason
    assert by_file["MI300X-GMM.json"].target == "MI200-GMM.json"  # flat, outside gemm/
    assert not any(name.startswith("MI350X") for name in by_file)


def test_host_values_replace_mi300x_ones():
    rules = proof.load_rules()
    config = {"GRID_DIM": 304, "XCD_REMAP": True, "BLOCK_SIZE_M": 256}
    assert proof._with_host(config, rules, "MI210") == {"GRID_DIM": 104, "XCD_REMAP": False, "BLOCK_SIZE_M": 256}
    assert proof._with_host(config, rules, "MI250X")["GRID_DIM"] == 110


@pytest.mark.slow
def test_whole_017_tree_every_derived_config_compiles_within_lds(proof_017):
    derived = [entry for entry in proof_017["entries"] if entry["status"] in ("derived", "stepped-down")]
    assert {entry["op"] for entry in derived} == {
        "gemm_a16w16", "mha", "extend_attention", "lean_attention", "mla_decode_rope", "hstu_attn_fwd", "hstu_attn_bwd",
        "moe", "moe_int8_w8a16", "moe_int4_w4a16", "moe_routing_sigmoid_top1", "batched_gemm_a16w16",
        "gemm_a16w16_atomic", "gemm_a16w16_gated", "ff_a16w16_fused", "gmm"}
    assert not [entry for entry in proof_017["entries"] if entry["status"] == "failed"]
    for entry in derived:
        for config in entry["configs"]:
            assert config["compiled"] and config["paths"], (entry["file"], config["key"])
            for path, result in config["paths"].items():
                assert result["ok"] and result["lds_bytes"] <= LIMIT, (entry["file"], config["key"], path)
                if (entry["op"], config["key"]) != ("mla_decode_rope", "fwd_kernel_stage2"):  # a reduction, no dot
                    assert result["mfma"], (entry["file"], config["key"], path)  # the dots became MFMA
                if not config["gfx942"][path]["vgpr_spills"]:
                    assert not result["vgpr_spills"], (entry["file"], config["key"], path)
    gemm = next(entry for entry in derived if entry["op"] == "gemm_a16w16")
    assert len(gemm["configs"]) == 6 and all(len(config["paths"]) == 2 for config in gemm["configs"])  # EVEN_K or not
    stepped = {config["key"]: config for config in gemm["configs"] if config["stepped_down"]}
    assert set(stepped) == {"M_LEQ_2048", "any"}
    assert stepped["any"]["original"]["BLOCK_SIZE_N"] == 256 and stepped["any"]["config"]["BLOCK_SIZE_N"] == 128
    # unified attention, its config chosen in code: each call vLLM makes compiled; a spill gfx942 lacks is named
    in_code = {entry["op"]: entry for entry in proof_017["entries"] if entry["status"] == "in-code"}
    assert set(in_code) == {"unified_attention", "fused_add_rmsnorm_pad"}  # 0.1.7 has no rope/rope.py
    unified = in_code["unified_attention"]
    assert unified["target"] is None and len(unified["configs"]) == 18
    for config in unified["configs"]:
        assert config["compiled"] and all(r["lds_bytes"] <= LIMIT for r in config["paths"].values()), config["key"]
        assert (f"{config['key']}: " in unified["reason"]) == bool(config["spills"] and not config["gfx942_spills"])
    refused = [entry for entry in proof_017["entries"] if entry["status"] == "refused"]
    assert refused and all(entry["reason"] and entry["target"] is None for entry in refused)
    assert "compiled" in table(proof_017)


def test_a_lookup_file_is_named_by_the_release_layout(tmp_path):
    (tmp_path / "gemm").mkdir()
    (tmp_path / "gemm" / "gfx942-GEMM-A16W16.json").write_text("{}")
    assert proof.arch_names(tmp_path, proof.load_rules()) == ("gfx942", "gfx90a")
    (tmp_path / "gfx942-NO_RECIPE.json").write_text("{}")
    first, unknown = proof.classify(tmp_path, proof.load_rules())
    assert first.target == "gemm/gfx90a-GEMM-A16W16.json"
    assert (unknown.status, unknown.target) == ("unproven", None)  # no config is written for an op without a recipe

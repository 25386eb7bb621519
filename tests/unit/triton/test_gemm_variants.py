"""AITER's GEMM variants on gfx90a (batched, atomic, gated, fused feed-forward, GMM): their files classified, their
launch recipes' arithmetic, and what the committed proofs of 0.1.7 and v0.1.20.post1 found compiling every path of
their configs with the real kernels."""

from __future__ import annotations

import pytest

from cdna2.triton import proof
from cdna2.triton.recipes import gemm
from tests.unit.triton.conftest import committed_entries

LIMIT = 65536
OPS = {"BATCHED_GEMM-A16W16": "batched_gemm_a16w16", "GEMM-A16W16-ATOMIC": "gemm_a16w16_atomic",
       "GEMM-A16W16-gated": "gemm_a16w16_gated", "FF-A16W16-fused": "ff_a16w16_fused", "GMM": "gmm"}
# Paths each config of the op must have been compiled on: each flag at least once
COVERING = {"batched_gemm_a16w16": ("EVEN_K", "K % BLOCK_SIZE_K != 0 +bias"),
            "gemm_a16w16_atomic": ("EVEN_K", "K % BLOCK_SIZE_K != 0"),
            "gemm_a16w16_gated": ("EVEN_K", "K % BLOCK_SIZE_K != 0 +gelu_tanh"),
            "ff_a16w16_fused": ("gated K % BLOCK_SIZE_K != 0 +silu", "ungated EVEN_K"),
            "gmm": ("base", "all")}


def test_the_017_files_of_the_gemm_variants_are_proven(aiter_017_tree):
    by_file = {entry.file: entry for entry in proof.classify(aiter_017_tree / proof.CONFIGS, proof.load_rules())}
    for name, op in OPS.items():
        entry = by_file[f"{'' if name == 'GMM' else 'gemm/'}MI300X-{name}.json"]
        assert (entry.status, entry.op) == ("pending", op)
        assert entry.target == entry.file.replace("MI300X-", "MI200-")


def test_the_uneven_k_is_uneven_for_every_block_k_from_32():
    assert all(gemm.GEMM_K_UNEVEN % block for block in (32, 64, 128, 256)) and gemm.GEMM_K_UNEVEN % 16 == 0


def test_gmm_grid_is_the_hosts_and_every_flag_is_compiled():
    config = {"BLOCK_SIZE_M": 256, "BLOCK_SIZE_K": 64, "BLOCK_SIZE_N": 256, "GROUP_SIZE": 1, "GRID_DIM": 304,
              "num_warps": 8, "num_stages": 1}
    paths = dict(gemm.gmm(proof._with_host(config, proof.load_rules(), "MI210"), "gmm.default", None))
    assert {request["values"]["GRID_DIM"] for request in paths.values()} == {104}
    assert paths["all"]["values"]["TRANS_RHS"] and paths["all"]["values"]["USE_BIAS"]
    assert paths["all"]["values"]["WORK_STEALING"] and paths["all"]["tensors"]["group_sizes_ptr"] == "int32"
    assert paths["all"]["values"]["K"] % config["BLOCK_SIZE_K"] and not paths["base"]["values"]["K"] % 64
    accumulate = dict(gemm.gmm(config, "nptgmm.accumulate", None))
    assert accumulate["base"]["kernel"] == "tgmm_non_persistent_kernel" and accumulate["base"]["values"]["ACCUMULATE"]
    assert set(accumulate) == {"base", "TRANS_LHS", "COMPUTE_BIAS_GRAD", "all"}


def test_recipes_repeat_the_wrappers_arithmetic():
    config = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "NUM_KSPLIT": 32}
    # batched: split-K block cdiv(K, NUM_KSPLIT) = 128 cuts BLOCK_SIZE_K to it; fp32 partial sums
    batched = dict(gemm.batched_gemm_a16w16(config, "small", None))["EVEN_K"]
    assert batched["values"]["SPLITK_BLOCK_SIZE"] == 128 and batched["values"]["BLOCK_SIZE_K"] == 128
    assert batched["values"]["M"] == 512 and batched["tensors"] == {"c_ptr": "fp32"}
    # atomic: the wrapper leaves BLOCK_SIZE_K as the file says
    atomic = dict(gemm.gemm_a16w16_atomic(config, "any", None))["EVEN_K"]["values"]
    assert atomic["SPLITK_BLOCK_SIZE"] == 128 and atomic["BLOCK_SIZE_K"] == 256
    # gated: y is (M, N // 2); a specialised file is compiled for its own N and K only
    gated = gemm.gemm_a16w16_gated(config, "M_LEQ_64", (1024, 4096))
    assert [path for path, _ in gated] == ["N=1024 K=4096", "N=1024 K=4096 +silu", "N=1024 K=4096 +gelu_tanh"]
    assert gated[0][1]["values"]["stride_cm"] == 512 and gated[0][1]["values"]["M"] == 64
    assert gated[1][1]["values"]["activation"]["args"] == ["silu"] and gated[0][1]["values"]["activation"] == ""


@pytest.mark.parametrize("release", ["0.1.7.post2.dev18", "0.1.20.post1"])
def test_every_gemm_variant_path_the_committed_proofs_compiled_dots_within_lds(release):
    """Every path of every config, with the releases' own kernels (v0.1.20.post1's batched takes split-K, its GMM
    bias, work stealing and accumulate): MFMA, LDS within gfx90a's, spills only where gfx942's kernel spills."""
    entries = committed_entries(release, set(OPS.values()))
    assert set(entries) == set(OPS.values())
    for op, entry in entries.items():
        for config in entry["configs"]:
            assert set(COVERING[op]) <= set(config["paths"]) or op == "gmm", (op, config["key"], list(config["paths"]))
            for path, result in config["paths"].items():
                where = (release, op, config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT and result["mfma"], where
                if not config["gfx942"][path]["vgpr_spills"]:
                    assert not result["vgpr_spills"], where

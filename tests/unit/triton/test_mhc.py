"""AITER's mHC fusions (v0.1.16 on) on gfx90a: the recipe launches every kernel of both wrappers that read
MHC_FUSED_SINKHORN's configs (mhc, fused or split-K; mhc_post_pre) and mhc_post's, at the bucket's M and the file's
C; and what the committed proofs found compiling every path of every config for gfx90a."""

from __future__ import annotations

import json

import pytest

from cdna2.triton import proof
from cdna2.triton.recipes import mhc
from releases import coverage

LIMIT = 65536
FUSED = ["MHC_FUSED_SINKHORN", *(f"MHC_FUSED_SINKHORN-C={c}" for c in (128, 512, 1024, 4096))]
LARGE_C = ["MHC_FUSED_SINKHORN-C=32768"]  # left unproven by the rules: compile cost
RELEASES = ("0.1.16", "0.1.20.post1", "main")


def test_the_file_name_gives_the_c_an_mhc_config_is_compiled_at():
    assert proof._shape("gfx942-MHC_FUSED_SINKHORN-C=4096.json") == (4096,)
    assert proof._shape("gemm/gfx942-GEMM-A16W16-N=1024-K=4096.json") == (1024, 4096)
    assert proof._shape("gfx942-MHC_FUSED_SINKHORN.json") is None


def test_the_recipe_launches_what_each_wrapper_launches_with_the_config():
    config = {"BLOCK_M": 64, "BLOCK_K": 256, "BLOCK_C": 64, "NUM_KSPLIT": 1, "num_warps": 4, "num_stages": 1,
              "waves_per_eu": 2}
    whole = dict(mhc.mhc_fused_sinkhorn(config, "M_LEQ_1024", (4096,)))
    assert {request["kernel"] for request in whole.values()} == {
        "_mhc_fused_kernel", "_mhc_post_pre_split_kernel", "_mhc_post_pre_reduce_apply_kernel"}
    fused = whole["mhc fused"]["values"]
    assert (fused["M"], fused["C"], fused["K"], fused["BLOCK_N"], fused["num_warps"]) == (1024, 4096, 16384, 16, 4)
    # mhc_post_pre splits K into BLOCK_K // n channels per program; its reduce-apply sums cdiv(C, that) partials
    assert whole["mhc_post_pre split"]["values"]["BLOCK_C"] == 64
    assert whole["mhc_post_pre reduce-apply"]["values"]["ACTUAL_KSPLIT"] == 64
    split = dict(mhc.mhc_fused_sinkhorn({**config, "NUM_KSPLIT": 8}, "any", None))
    assert {request["kernel"] for request in split.values()} == {
        "_mhc_fused_split_kernel", "_mhc_reduce_apply_kernel", "_mhc_post_pre_split_kernel",
        "_mhc_post_pre_reduce_apply_kernel"}
    values = split["mhc split-K GEMM"]["values"]  # the plain file serves C below 128; "any" is taken from M = 1
    assert (values["M"], values["C"], values["SPLITK_BLOCK_SIZE"], values["BLOCK_K"]) == (1, 64, 32, 256)
    assert split["mhc reduce-apply"]["values"]["ACTUAL_KSPLIT"] == 8
    post = dict(mhc.mhc_post({"BLOCK_M": 64, "BLOCK_C": 256, "num_warps": 4}, "default", None))
    assert {request["values"]["M"] for request in post.values()} == {1, 4096}
    assert all(request["tensors"] == {"post_mix_ptr": "fp32", "comb_mix_ptr": "fp32"} for request in post.values())


@pytest.mark.slow
def test_every_mhc_file_of_v0_1_16_has_its_recipe(aiter_git_dir):
    tree = coverage.aiter_triton_tree(aiter_git_dir, "v0.1.16")
    by_file = {entry.file: entry for entry in proof.classify(tree / proof.CONFIGS, proof.load_rules())}
    for name in [*FUSED, "MHC_POST"]:
        entry = by_file[f"gfx942-{name}.json"]
        assert entry.status == "pending" and entry.target == f"gfx90a-{name}.json", entry
        assert entry.op == ("mhc_post" if name == "MHC_POST" else "mhc_fused_sinkhorn"), entry
    assert all(by_file[f"gfx942-{name}.json"].status == "unproven" for name in LARGE_C)


@pytest.mark.parametrize("release", RELEASES)
def test_every_mhc_path_the_committed_proofs_compiled_fits_gfx90a(release):
    found = json.loads((proof.COMMITTED / f"{release}.json").read_text())
    entries = [entry for entry in found["entries"] if entry["op"] in ("mhc_fused_sinkhorn", "mhc_post")]
    assert sorted(entry["file"] for entry in entries) == sorted(f"gfx942-{name}.json" for name in [*FUSED, "MHC_POST"])
    for entry in entries:
        assert entry["status"] in ("derived", "stepped-down"), (release, entry["file"], entry["reason"])
        assert entry["configs"], entry["file"]
        for config in entry["configs"]:
            for path, result in config["paths"].items():
                where = (release, entry["file"], config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT, where
                # every GEMM kernel is a bf16 MFMA; the apply and post kernels have no dot
                dots = "GEMM" in path or path in ("mhc fused", "mhc_post_pre split")
                assert any(name.endswith("bf16_1k") for name in result["mfma"]) == dots, where

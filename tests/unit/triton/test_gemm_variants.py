"""AITER's GEMM variants on gfx90a (batched, atomic, gated, fused feed-forward, GMM): their files classified, their
launch recipes' arithmetic, and the gfx90a configs the set installs compiled with the real kernels: per tree one
worker call for the module, on the paths that cover every flag (the whole-tree proof compiles each path)."""

from __future__ import annotations

import json

import pytest

from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.triton import proof, recipes
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.recipes import gemm
from cdna2.triton.toolchain import triton_python
from releases import coverage

DATA = PACKAGE_DIR / "data" / "triton-configs"
LIMIT = 65536
OPS = {"BATCHED_GEMM-A16W16": "batched_gemm_a16w16", "GEMM-A16W16-ATOMIC": "gemm_a16w16_atomic",
       "GEMM-A16W16-gated": "gemm_a16w16_gated", "FF-A16W16-fused": "ff_a16w16_fused", "GMM": "gmm"}
# Paths the test compiles: each flag of each op at least once (every path: `triton-configs`)
COVERING = {"batched_gemm_a16w16": ("EVEN_K", "K % BLOCK_SIZE_K != 0 +bias"),
            "gemm_a16w16_atomic": ("EVEN_K", "K % BLOCK_SIZE_K != 0"),
            "gemm_a16w16_gated": ("EVEN_K", "K % BLOCK_SIZE_K != 0 +gelu_tanh"),
            "ff_a16w16_fused": ("gated K % BLOCK_SIZE_K != 0 +silu", "ungated EVEN_K"),
            "gmm": ("base", "all")}


def _file(release_dir: str, name: str) -> dict:
    arch = "MI200" if release_dir == "0.1.7" else "gfx90a"
    folder = "" if name == "GMM" else "gemm/"
    return json.loads((DATA / release_dir / proof.CONFIGS / f"{folder}{arch}-{name}.json").read_text())


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


def _requests(files: list[tuple[str, str]], paths: tuple[str, ...] | None = None) -> list[dict]:
    """Compiles of the committed configs ``files`` ((release dir, name)) for gfx90a and gfx942: one config of a GEMM
    file, each of GMM's (gmm, ptgmm, nptgmm; default, accumulate), on the covering paths (or ``paths``)."""
    requests = []
    for release_dir, name in files:
        op = OPS[name]
        for key, config in proof._leaves(_file(release_dir, name)):
            for path, request in recipes.RECIPES[op](config, key, None):
                if path in (paths or COVERING[op]):
                    for arch in ("gfx90a", "gfx942"):
                        requests.append({**request, "id": f"{name}|{key}|{path}|{arch}", "arch": arch})
            if name != "GMM":
                break
    return requests


@pytest.fixture(scope="module")
def compiled(aiter_017_tree, aiter_git_dir):
    """The committed gfx90a configs compiled: all five ops on 0.1.7; on v0.1.20.post1 the two whose kernels
    changed (batched takes split-K, GMM bias, work stealing and accumulate)."""
    python = triton_python(DEFAULT_TRITON)
    first = _requests([("0.1.7", name) for name in OPS])
    results = proof._run_worker(python, aiter_017_tree, first, "gfx90a", lambda line: None)
    tree = coverage.aiter_triton_tree(aiter_git_dir, "v0.1.20.post1")
    every_flag = _requests([("0.1.17-main", "BATCHED_GEMM-A16W16"), ("0.1.17-main", "GMM")],
                           ("K % BLOCK_SIZE_K != 0 +bias", "all"))
    later = proof._run_worker(python, tree, every_flag, "gfx90a", lambda line: None)
    return {**results, **{f"v0.1.20.post1 {key}": value for key, value in later.items()}}


@pytest.mark.slow
def test_the_committed_configs_compile_for_gfx90a_within_lds(compiled):
    gfx90a = {key.removesuffix("|gfx90a"): result for key, result in compiled.items() if key.endswith("|gfx90a")}
    # 0.1.7: 2 paths each of batched, atomic, gated, FF and GMM's 3 kernels; v0.1.20.post1: every flag on, of batched
    # and GMM's 5 configs
    assert len(gfx90a) == 2 * 7 + 6, sorted(gfx90a)
    for key, result in gfx90a.items():
        assert result["ok"] and result["lds_bytes"] <= LIMIT, (key, result)
        assert result["mfma"], key  # every one of these kernels dots
        baseline = compiled[f"{key}|gfx942"]
        if baseline["ok"] and not baseline["vgpr_spills"]:
            assert not result["vgpr_spills"], (key, result["vgpr_spills"])

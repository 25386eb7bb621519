"""AITER's own config lookups, run as on a gfx90a host, find gemm_a16w16's and MHA's configs on every AITER release
once the aiter-triton-gfx90a set is applied, and fail by name without it."""

from __future__ import annotations

import json
import shutil

import pytest

from cdna2.patches import load_catalog
from cdna2.patches.cli import apply_in_place
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.proof import look_up
from lab import wheelhouse
from releases import coverage, discovery

pytestmark = pytest.mark.slow
SET = "aiter-triton-gfx90a"
GEMM_VARIANTS = ("batched_gemm_a16w16", "batched_gemm_a16w16 N=1024 K=4096", "gemm_a16w16_atomic",
                 "gemm_a16w16_gated", "ff_a16w16_fused", "gmm")


def _patched(catalog, tree, scratch):
    """The release's tree (RECORD and the catalog's files) with the set applied, as on a host."""
    root = scratch / "patched"
    shutil.copytree(tree, root)
    plan = coverage._plan(catalog, "amd-aiter", root, [SET])
    assert plan.status == "apply" and SET in plan.sets, plan.reasons
    assert apply_in_place(root, plan, scratch / "state")["ok"]
    return root


def _whole(triton_tree, patched, scratch):
    """AITER's whole Triton package with the patched and added files over it: what a host imports."""
    root = scratch / "whole"
    shutil.copytree(triton_tree / "aiter", root / "aiter")
    for path in (patched / "aiter" / "ops" / "triton").rglob("*"):
        if path.is_file():
            target = root / path.relative_to(patched)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    return root


def _releases(git_dir):
    return ["0.1.7"] + discovery.aiter_releases(git_dir).releases


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_lookups_find_the_gfx90a_configs_on_every_release(catalog, aiter_git_dir, tmp_path):
    files = catalog.target_files("amd-aiter")
    checked, specialised_found = [], []
    for release in _releases(aiter_git_dir):
        scratch = tmp_path / release
        if release == "0.1.7":
            tree, whole_tree = coverage.wheel_tree(wheelhouse.AITER, files), wheelhouse.installed_tree(wheelhouse.AITER)
        else:
            tree = coverage.aiter_tree(aiter_git_dir, release, files)
            whole_tree = coverage.aiter_triton_tree(aiter_git_dir, release)
        root = _whole(whole_tree, _patched(catalog, tree, scratch), scratch)
        found = look_up(root, DEFAULT_TRITON, "gfx90a")
        assert found["gemm_a16w16"]["ok"] and found["mha"]["ok"], (release, found)
        # M = 4096 reads the "any" bucket, stepped down for gfx90a: the derived config, not gfx942's
        assert found["gemm_a16w16"]["config"]["BLOCK_SIZE_N"] == 128, (release, found)
        assert found["mha"]["config"]["BLOCK_M"] == 128, (release, found)
        for op in GEMM_VARIANTS:
            assert found[op]["ok"], (release, op, found[op])
        assert found["gmm"]["config"]["GRID_DIM"] == 104, (release, found["gmm"])  # an MI210's CUs, not MI300X's 304
        specialised = root / "aiter/ops/triton/configs/gemm/gfx90a-BATCHED_GEMM-A16W16-N=1024-K=4096.json"
        if specialised.exists():  # from v0.1.19: N=1024, K=4096 reads it (M = 64: its M_LEQ_64 bucket)
            expected = json.loads(specialised.read_text())["M_LEQ_64"]
            assert found["batched_gemm_a16w16 N=1024 K=4096"]["config"]["BLOCK_SIZE_N"] == expected["BLOCK_SIZE_N"]
            specialised_found.append(release)
        checked.append(release)
    assert len(checked) == 16, checked
    assert specialised_found == ["v0.1.19", "v0.1.19.post1", "v0.1.19.post2", "v0.1.20", "v0.1.20.post1", "main"]


@pytest.mark.parametrize("release", ["0.1.7", "v0.1.19.post2", "v0.1.20.post1"])
def test_without_the_set_the_lookups_fail_on_gfx90a(aiter_git_dir, release, aiter_017_tree):
    tree = aiter_017_tree if release == "0.1.7" else coverage.aiter_triton_tree(aiter_git_dir, release)
    found = look_up(tree, DEFAULT_TRITON, "gfx90a")
    assert not found["gemm_a16w16"]["ok"] and not found["mha"]["ok"], found
    expected = "KeyError" if release == "0.1.7" else "FileNotFoundError"  # 0.1.7: no gfx90a device name
    assert found["mha"]["error"].startswith(expected), found

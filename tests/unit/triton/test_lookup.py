"""AITER's own config lookups, run as on a gfx90a host, find the configs of every op the aiter-triton-gfx90a set gives
one (gemm_a16w16, MHA, extend, lean, MLA decode, HSTU, the fused MoE and its top-1 routing, conv from 0.1.18, mHC)
on every AITER release once the set is applied, and fail by name without it (the MoE lookup falls back to a default
written in code, mHC's pre step to gfx942's files, chunked delta attention, v0.1.20 on, to the fallback written beside
its kernel; with the set, it reads the derived file the set adds under configs/gfx90a/)."""

from __future__ import annotations

import json
import shutil

import pytest

from cdna2.patches import load_catalog
from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.patches.cli import apply_in_place
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.proof import CONFIGS, LOOKUPS, look_up
from cdna2.triton.recipes import delta_attention
from lab import wheelhouse
from releases import coverage, discovery

pytestmark = pytest.mark.slow
SET = "aiter-triton-gfx90a"
DATA = PACKAGE_DIR / "data" / "triton-configs"
# LOOKUPS id -> (its derived file under the configs directory, the section the lookup returns; None: the whole file)
ATTENTION = {"extend_attention": ("*-EXTEND_ATTENTION.json", "large_head_or_fp32"),
             "lean_attention": ("*-LEANATTN-DEFAULT.json", "any"),
             "mla_decode_rope": ("*-MLA_DECODE_ROPE-DEFAULT.json", None),
             "hstu_attn_fwd": ("hstu_attn/*-HSTU_ATTN_FWD.json", "batch_512"),
             "hstu_attn_bwd": ("hstu_attn/*-HSTU_ATTN_BWD.json", "large_batch")}
GEMM_VARIANTS = ("batched_gemm_a16w16", "batched_gemm_a16w16 N=1024 K=4096", "gemm_a16w16_atomic",
                 "gemm_a16w16_gated", "ff_a16w16_fused", "gmm")
CONV = [lookup["id"] for lookup in LOOKUPS if lookup["id"].startswith("conv ")]
CONV_FROM = ["v0.1.18", "v0.1.19", "v0.1.19.post1", "v0.1.19.post2", "v0.1.20", "v0.1.20.post1", "main"]
DELTA_ATTENTION = "gfx90a/triton/attention/chunk_delta_attn/DEFAULT.json"


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


def _shipped(release, name):
    """The shipped gfx90a MoE file ``name`` (after ``moe/<arch>-``) of ``release``, as a dict."""
    arch = "MI200" if release == "0.1.7" else "gfx90a"
    return json.loads((DATA / shipped_directory(release) / CONFIGS / "moe" / f"{arch}-{name}.json").read_text())


def shipped_directory(release: str) -> str:
    """The directory under cdna2/data/triton-configs/ whose files the set adds on ``release``."""
    return "0.1.7" if release == "0.1.7" else "0.1.16" if release.startswith("v0.1.16") else "0.1.17-main"


def _releases(git_dir):
    return ["0.1.7"] + discovery.aiter_releases(git_dir).releases


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_lookups_find_the_gfx90a_configs_on_every_release(catalog, aiter_git_dir, tmp_path):
    files = catalog.target_files("amd-aiter")
    checked, specialised_found, conv_found, delta_found = [], [], [], []
    for release in _releases(aiter_git_dir):
        scratch = tmp_path / release
        if release == "0.1.7":
            tree, whole_tree = coverage.wheel_tree(wheelhouse.AITER, files), wheelhouse.installed_tree(wheelhouse.AITER)
        else:
            tree = coverage.aiter_tree(aiter_git_dir, release, files)
            whole_tree = coverage.aiter_triton_tree(aiter_git_dir, release)
        root = _whole(whole_tree, _patched(catalog, tree, scratch), scratch)
        # without gfx942's mHC files (AITER's fallback where the arch has none), only the gfx90a ones can answer
        gfx942_mhc = sorted((root / CONFIGS).glob("gfx942-MHC_*.json"))
        for path in gfx942_mhc:
            path.unlink()
        found = look_up(root, DEFAULT_TRITON, "gfx90a")
        assert found["gemm_a16w16"]["ok"] and found["mha"]["ok"], (release, found)
        # M = 4096 reads the "any" bucket, stepped down for gfx90a: the derived config, not gfx942's
        assert found["gemm_a16w16"]["config"]["BLOCK_SIZE_N"] == 128, (release, found)
        assert found["mha"]["config"]["BLOCK_M"] == 128, (release, found)
        # the attention lookups return the committed gfx90a configs (extend: a 576-wide head; HSTU: 512 sequences)
        derived = DATA / shipped_directory(release) / CONFIGS
        for op, (name, section) in ATTENTION.items():
            expected = json.loads(next(derived.glob(name)).read_text())
            assert found[op]["ok"], (release, op, found[op])
            assert found[op]["config"] == (expected[section] if section else expected), (release, op, found[op])
        # MoE (M = 4096: large_M) and top-1 routing (N128.large): the shipped gfx90a files, not the code's default
        for dtype, lookup in (("DEFAULT", "bf16"), ("INT8_W8A16", "int8_w8a16"), ("INT4_W4A16", "int4_w4a16")):
            expected = _shipped(release, f"MOE-{dtype}")["large_M"]
            assert found[f"moe {lookup}"]["config"] == expected, (release, dtype, found)
        routing = _shipped(release, "MOE_ROUTING_SIGMOID_TOPK1")["N128"]["large"]
        assert found["moe_routing_sigmoid_top1"]["config"] == routing, (release, found)
        for op in GEMM_VARIANTS:
            assert found[op]["ok"], (release, op, found[op])
        assert found["gmm"]["config"]["GRID_DIM"] == 104, (release, found["gmm"])  # an MI210's CUs, not MI300X's 304
        specialised = root / "aiter/ops/triton/configs/gemm/gfx90a-BATCHED_GEMM-A16W16-N=1024-K=4096.json"
        if specialised.exists():  # from v0.1.19: N=1024, K=4096 reads it (M = 64: its M_LEQ_64 bucket)
            expected = json.loads(specialised.read_text())["M_LEQ_64"]
            assert found["batched_gemm_a16w16 N=1024 K=4096"]["config"]["BLOCK_SIZE_N"] == expected["BLOCK_SIZE_N"]
            specialised_found.append(release)
        # conv (M = 56 * 56): each kernel's lookup reads its own shipped gfx90a file (only "any"); none before 0.1.18
        if (root / CONFIGS / "conv").is_dir():
            for lookup in CONV:
                shipped = json.loads((derived / "conv" / f"gfx90a-{lookup.split()[1]}.json").read_text())
                assert found[lookup].get("config") == shipped["any"], (release, lookup, found[lookup])
            conv_found.append(release)
        else:
            assert all(found[lookup]["error"].startswith("LookupError") for lookup in CONV), (release, found)
        # chunked delta attention (v0.1.20 on): the set adds its file, and the directories AITER's tree lacks, so
        # gla_output.py registers the derived entry, not the fallback written beside its kernel
        if (root / CONFIGS / "gfx942" / "triton" / "attention" / "chunk_delta_attn").is_dir():
            expected = json.loads((derived / DELTA_ATTENTION).read_text())[delta_attention.KERNEL]
            assert expected != delta_attention.FALLBACK
            assert found["chunk_delta_attn"].get("config") == expected, (release, found["chunk_delta_attn"])
            delta_found.append(release)
        else:
            assert found["chunk_delta_attn"]["error"].startswith("LookupError"), (release, found["chunk_delta_attn"])
        mhc_added = sorted((root / CONFIGS).glob("gfx90a-MHC_*.json"))
        if release == "0.1.7":
            assert not gfx942_mhc and found["mhc_post"]["error"].startswith("LookupError"), found["mhc_post"]
        else:  # M = 4096 tokens, C = 2048 and 7168: the -C=1024 and -C=4096 files' M_LEQ_4096; mhc_post's "default"
            assert len(gfx942_mhc) == 7 and len(mhc_added) == 6, mhc_added  # not -C=32768: unproven
            for lookup, file in (("mhc_fused_sinkhorn", "C=1024"), ("mhc_fused_sinkhorn C=4096", "C=4096")):
                expected = json.loads((derived / f"gfx90a-MHC_FUSED_SINKHORN-{file}.json").read_text())["M_LEQ_4096"]
                assert found[lookup]["config"] == expected, (release, found[lookup])
            expected = json.loads((derived / "gfx90a-MHC_POST.json").read_text())["default"]
            assert found["mhc_post"]["config"] == expected, (release, found["mhc_post"])
        checked.append(release)
    assert len(checked) == 16, checked
    assert specialised_found == ["v0.1.19", "v0.1.19.post1", "v0.1.19.post2", "v0.1.20", "v0.1.20.post1", "main"]
    assert conv_found == CONV_FROM and len(CONV) == 7
    assert delta_found == ["v0.1.20", "v0.1.20.post1", "main"]


@pytest.mark.parametrize("release", ["0.1.7", "v0.1.19.post2", "v0.1.20.post1"])
def test_without_the_set_the_lookups_fail_on_gfx90a(aiter_git_dir, release, aiter_017_tree):
    tree = aiter_017_tree if release == "0.1.7" else coverage.aiter_triton_tree(aiter_git_dir, release)
    found = look_up(tree, DEFAULT_TRITON, "gfx90a")
    expected = "KeyError" if release == "0.1.7" else "FileNotFoundError"  # 0.1.7: no gfx90a device name
    # MoE's lookup falls back to a default written in code from 0.1.16 on, mHC's to gfx942's files (0.1.7 has no
    # mHC: its lookups find no module); every other one fails by name
    mhc_pre = {"mhc_fused_sinkhorn", "mhc_fused_sinkhorn C=4096"}
    falls_back = {op for op in found if op.startswith("moe ")} | mhc_pre if release != "0.1.7" else set()
    absent = mhc_pre | {"mhc_post"} if release == "0.1.7" else set()
    if release == "v0.1.20.post1":  # chunked delta attention registers the fallback written beside its kernel
        falls_back.add("chunk_delta_attn")
        assert found["chunk_delta_attn"]["config"] == delta_attention.FALLBACK, found["chunk_delta_attn"]
    else:  # it comes with v0.1.20
        absent.add("chunk_delta_attn")
    assert len(found) == len(LOOKUPS) and not any(found[op]["ok"] for op in set(found) - falls_back), found
    absent |= set(CONV) if release == "0.1.7" else set()  # conv comes with 0.1.18
    assert all(found[op]["error"].startswith("LookupError") for op in absent), found
    falls_back |= absent
    # each fails by name: no file (FileNotFoundError; KeyError on 0.1.7's device name, or 'default' from the second
    # call where the lookup bug is), or the GEMMs', GMM's and (up to 0.1.19) conv's own assertion that the file exists
    assert all(result["error"].startswith(("FileNotFoundError", "KeyError", "AssertionError"))
               for op, result in found.items() if op not in falls_back | absent), found
    assert found["mha"]["error"].startswith(expected), found["mha"]
    if release == "0.1.7":
        assert found["moe bf16"]["error"].startswith("KeyError"), found
    else:  # no file: get_optimal_moe_config's default in code, gfx942's large_M tiles, never compiled for gfx90a
        assert found["moe bf16"]["config"]["BLOCK_SIZE_N"] == 256, found
        # mHC's pre step reads gfx942's file unproven; its post step has no fallback
        for lookup, file in (("mhc_fused_sinkhorn", "C=1024"), ("mhc_fused_sinkhorn C=4096", "C=4096")):
            gfx942 = json.loads((tree / CONFIGS / f"gfx942-MHC_FUSED_SINKHORN-{file}.json").read_text())["M_LEQ_4096"]
            assert found[lookup]["config"] == gfx942, found[lookup]
        assert found["mhc_post"]["error"].startswith("FileNotFoundError"), found["mhc_post"]

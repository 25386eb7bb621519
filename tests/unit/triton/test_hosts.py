"""The proof of a host's own AITER Triton tree as the deploy takes it (cdna2.triton.hosts): a served tree from the
committed proofs without fetching anything, fetched sources checked against the probe's digest, the set refused by
name where the proof does not derive the files it adds; and sets requiring a set of another package."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile

import pytest

from cdna2.patches import PatchDataError, load_catalog
from cdna2.patches.catalog import _check_references
from cdna2.patches.planner import PackagePlan
from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.hosts import (REGENERATE, SET, adds_refusal, fetched_tree, opened_ops_refusal, proven_tree,
                                 triton_after)
from releases import triton_proofs

RELEASE_017 = triton_proofs.TREES[0][0]


def committed_017() -> dict:
    return json.loads((proof.COMMITTED / f"{RELEASE_017}.json").read_text())


def variant(name: str):
    return next(v for v in load_catalog().by_name(SET).variants if v.id == name)


def no_fetch(archive):
    raise AssertionError("a tree the committed proofs hold must not be fetched")


def test_a_served_tree_is_proven_from_its_committed_proof_without_a_fetch():
    found = proven_tree(DEFAULT_TRITON, committed_017()["tree_digest"], no_fetch)
    assert found["source"] == f"committed ({RELEASE_017}.json)" and found["files"]
    assert adds_refusal(found, variant("0.1.7")) is None


def test_fetched_sources_unlike_the_probed_digest_are_refused_and_not_kept(tmp_path):
    def fetch(archive):  # what a host's tar of aiter/ops/triton holds, made here
        with tarfile.open(archive, "w:gz") as packed:
            data = b"# edited on the host\n"
            info = tarfile.TarInfo("triton/utils/core.py")
            info.size = len(data)
            packed.addfile(info, io.BytesIO(data))

    digest = "0" * 64
    with pytest.raises(proof.ProofError, match="differs from what its RECORD lists .* roll it back"):
        fetched_tree(digest, fetch)
    assert not (proof.cache_root() / "triton-trees" / digest).exists()


def test_a_proof_that_does_not_derive_the_added_files_refuses_the_set_by_file():
    found = committed_017()
    gemm = "aiter/ops/triton/configs/gemm/MI200-GEMM-A16W16.json"
    changed = {**found, "files": {**found["files"], gemm: found["files"][gemm].replace("128", "64", 1)}}
    refusal = adds_refusal(changed, variant("0.1.7"))
    assert f"{gemm}: derived differently" in refusal
    assert "optional_patch_sets" in refusal and REGENERATE in refusal
    missing = {**found, "files": {}}
    assert f"{gemm}: not derived" in adds_refusal(missing, variant("0.1.7"))


def test_the_triton_proven_is_the_one_the_wheels_step_leaves():
    assert triton_after("3.7.0", ["amd-aiter==0.1.7.post2.dev18", "triton==3.7.1"]) == "3.7.1"
    assert triton_after("3.7.0", ["/wheels/triton-3.7.1-cp311-cp311-manylinux_2_27_x86_64.whl"]) == "3.7.1"
    assert triton_after("3.7.0", []) == "3.7.0"
    assert triton_after(None, []) is None


def test_a_set_requiring_one_of_another_package_is_unmet_until_both_are_enabled():
    catalog = load_catalog()
    assert catalog.by_name("vllm-aiter-triton-ops").requires == (SET,)
    assert catalog.unmet_requirements(["vllm-aiter-triton-ops"]) == [
        f"vllm-aiter-triton-ops (vllm) requires {SET} (amd-aiter), which is not enabled"]
    assert catalog.unmet_requirements(["vllm-aiter-triton-ops", SET]) == []
    assert catalog.unmet_requirements([SET]) == []


def test_only_an_optional_set_may_require_an_optional_set_of_another_package():
    catalog = load_catalog()
    required = next(s for s in catalog.sets if not s.optional and s.package == "vllm")
    sets = [dataclasses.replace(s, requires=(SET,)) if s is required else s for s in catalog.sets]
    with pytest.raises(PatchDataError, match=rf"\$.requires\[0\]: '{SET}' patches amd-aiter, not vllm: only an "
                                             "optional set"):
        _check_references(sets)


def vllm_set_plan():
    """The vLLM plan a host with vllm-aiter-triton-ops takes (the sites' text is not read here: the plan's sets)."""
    (variant,) = load_catalog().by_name("vllm-aiter-triton-ops").variants
    return PackagePlan(package="vllm", installed_version="0.34.0", status="apply", sets=["vllm-aiter-triton-ops"],
                       variants={"vllm-aiter-triton-ops": variant.id})


def test_every_site_naming_a_triton_op_names_an_op_the_proof_proves_in_code():
    in_code = {op["name"] for op in proof.load_rules()["in_code"]}
    named = {site.id: site.triton_op for patch_set in load_catalog().sets for variant in patch_set.variants
             for site in variant.sites if site.triton_op}
    assert named == {"triton-rope-gate": "rope", "unified-attention-candidate": "unified_attention",
                     "unified-attention-sliding-window-guard": "unified_attention"}
    assert set(named.values()) <= in_code


def test_the_vllm_set_is_refused_per_site_where_the_proof_failed_an_op_it_opens():
    catalog, plan = load_catalog(), vllm_set_plan()
    found = committed_017()
    assert opened_ops_refusal("mi210-a", found, catalog, plan) is None  # unified attention proven there
    failed = {**found, "entries": [dict(entry, status="failed", reason="2d prefill hd128 bs16: LDS 73728 B > 65536 B")
                                   if entry["op"] == "unified_attention" else entry for entry in found["entries"]]}
    refusal = opened_ops_refusal("mi210-a", failed, catalog, plan)
    sites = [part.split(" site ")[1].split(" ")[0] for part in refusal.split("; remove ")[:-1]]
    assert sites == ["unified-attention-candidate", "unified-attention-sliding-window-guard"]
    assert refusal.count("opens AITER's Triton unified_attention, whose kernels failed the compile proof of "
                         f"mi210-a's AITER Triton tree {found['tree_digest'][:12]}") == 2
    assert "LDS 73728 B > 65536 B" in refusal
    assert refusal.endswith("remove vllm-aiter-triton-ops from mi210-a's optional_patch_sets")
    # A failed op no site opens (a config file's), and no proof this run, refuse nothing.
    gemm_failed = {**found, "entries": [dict(entry, status="failed") if entry["file"].endswith(".json") else entry
                                        for entry in found["entries"]]}
    assert opened_ops_refusal("mi210-a", gemm_failed, catalog, plan) is None
    assert opened_ops_refusal("mi210-a", None, catalog, plan) is None

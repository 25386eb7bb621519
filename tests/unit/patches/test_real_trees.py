"""The patch engine end to end on real PyPI sources: plan, stage, apply (cdna2.host.txn), check, revert."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import py_compile

import pytest

from cdna2.host import txn
from cdna2.patches import plan_package, record_hash
from cdna2.patches.cli import apply_in_place, probe

ALL_OPTIONAL = {
    "vllm": ["vllm-prefer-aiter-fa", "vllm-ck-int8-gemm", "vllm-fast-fp8-dequant"],
    "amd-aiter": [],
}


def optional_for(package, version):
    return ALL_OPTIONAL[package]


def snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".cdna2-patch-state" not in p.parts}


def plan_for(catalog, package, root, optional):
    version, files, record = probe(root, catalog, package)
    return plan_package(catalog, package, version, files, record, optional)


def record_of(root):
    dist_info = next(root.glob("*.dist-info"))
    return {row[0]: row[1] for row in csv.reader((dist_info / "RECORD").read_text().splitlines()) if len(row) > 1}


def test_apply_check_revert_round_trip(catalog, real_tree, tmp_path):
    package, version, root, _ = real_tree
    optional = optional_for(package, version)
    before = snapshot(root)
    plan = plan_for(catalog, package, root, optional)
    assert plan.status == "apply", plan.reasons
    assert all(change.diff.startswith(f"--- a/{change.path}\n+++ b/{change.path}\n") for change in plan.changes)
    assert snapshot(root) == before, "planning must not write"

    result = apply_in_place(root, plan, tmp_path / "backup")
    assert result["ok"] and sorted(result["changed"]) == sorted(c.path for c in plan.changes)
    for change in plan.changes:
        if change.path.endswith(".py"):
            py_compile.compile(str(root / change.path), cfile=str(tmp_path / "compiled.pyc"), doraise=True)

    check = plan_for(catalog, package, root, optional)
    assert check.status == "patched", check.reasons
    assert check.changes == [], "a second apply must change nothing"
    assert all(site.state == "patched" for site in check.sites)

    txn.revert(tmp_path / "backup", root)
    assert snapshot(root) == before, "revert must give back byte-identical files"
    record = record_of(root)
    for change in plan.changes:
        assert record_hash((root / change.path).read_bytes()) == record[change.path]
    assert not (tmp_path / "backup" / "state.json").exists()


def test_edited_anchor_is_refused_and_nothing_changes(catalog, real_tree):
    package, version, root, _ = real_tree
    plan = plan_for(catalog, package, root, optional_for(package, version))
    site = next(state for state in plan.sites if state.file.endswith(".py") or state.file.endswith(".cu"))
    path = root / site.file
    anchor = next(s for ps in catalog.sets_for(package) for v in ps.variants for s in v.sites
                  if v.id == plan.variants[site.set_name] and s.id == site.site)
    # A change to code (spacing or comments alone would still match).
    path.write_text(path.read_text().replace(anchor.anchor, anchor.anchor.replace("(", "(0 or ", 1)))
    before = snapshot(root)
    refused = plan_for(catalog, package, root, optional_for(package, version))
    assert refused.status == "refused"
    assert refused.changes == []
    text = "\n".join(refused.reasons)
    assert f"{package} {version}" in text and f"{site.file}: site {site.site}: expected the anchor" in text, text
    assert snapshot(root) == before


def test_one_site_patched_by_hand_is_recognised(catalog, real_tree, tmp_path):
    package, version, root, _ = real_tree
    optional = optional_for(package, version)
    plan = plan_for(catalog, package, root, optional)
    first = plan.sites[0]
    site = next(s for ps in catalog.sets_for(package) for v in ps.variants for s in v.sites
                if ps.name == first.set_name and v.id == first.variant and s.id == first.site)
    path = root / site.file
    path.write_text(path.read_text().replace(site.anchor, site.replacement))

    replanned = plan_for(catalog, package, root, optional)
    assert replanned.status == "apply", replanned.reasons
    assert [s.state for s in replanned.sites if s.site == site.id and s.file == site.file] == ["patched"]
    apply_in_place(root, replanned, tmp_path / "backup")
    assert plan_for(catalog, package, root, optional).status == "patched"


def test_file_edited_elsewhere_is_refused_not_overwritten(catalog, real_tree):
    package, version, root, _ = real_tree
    optional = optional_for(package, version)
    target = plan_for(catalog, package, root, optional).changes[0].path
    with open(root / target, "a") as handle:
        handle.write("\n# a local edit outside every patch site\n")
    before = snapshot(root)
    refused = plan_for(catalog, package, root, optional)
    assert refused.status == "refused" and refused.changes == []
    assert any(reason.startswith(f"{target}: edited outside our patch sites") for reason in refused.reasons)
    assert snapshot(root) == before


def test_vllm_033_ck_int8_gemm_takes_the_reshaped_gate_variant(catalog, tmp_path):
    from tests.unit.patches.conftest import copy_real_subset
    root = copy_real_subset(catalog, "vllm==0.33.0", "vllm", tmp_path)
    plan = plan_for(catalog, "vllm", root, ["vllm-ck-int8-gemm"])
    assert plan.status == "apply", plan.reasons
    assert plan.variants == {"vllm-attention-gate": "0.33", "vllm-ck-int8-gemm": "0.28-0.33"}
    ops = next(change for change in plan.changes if change.path == "vllm/_aiter_ops.py").new_bytes.decode()
    assert "        or is_aiter_attention_supported()\n" in ops


def vllm_026_host(catalog, tmp_path) -> tuple:
    """(version, files, RECORD) of a host holding vLLM 0.26.0's patch targets, as the deploy probes them."""
    from tests.unit.patches.conftest import copy_real_subset

    return probe(copy_real_subset(catalog, "vllm==0.26.0", "vllm", tmp_path / "host"), catalog, "vllm")


def with_changes(files: dict, plan) -> dict:
    """The files once ``plan`` is applied."""
    return dict(files, **{change.path: change.new_bytes for change in plan.changes})


@pytest.fixture
def counted_plans(monkeypatch, tmp_path) -> list:
    """plan_memo with an empty memo in this process and its own empty cache directory; the plans it makes."""
    from cdna2.patches import plan_memo

    made = []
    monkeypatch.setattr(plan_memo, "cache_root", lambda: tmp_path / "controller-cache")  # the wheels' stays
    monkeypatch.setattr(plan_memo, "_plans", {})
    monkeypatch.setattr(plan_memo, "plan_package", lambda *args: made.append(args) or plan_package(*args))
    return made


def test_identical_hosts_are_planned_once_and_each_gets_its_own_copy(catalog, tmp_path, counted_plans):
    from cdna2.patches.plan_memo import plan_package_once
    from tests.unit.patches.conftest import copy_real_subset

    inputs = [probe(copy_real_subset(catalog, "vllm==0.23.0", "vllm", tmp_path / host), catalog, "vllm")
              for host in ("host-a", "host-b")]
    first, second = (plan_package_once(catalog, "vllm", version, files, record, [])
                     for version, files, record in inputs)
    assert len(counted_plans) == 1 and first == second and first is not second
    first.changes.clear()  # a caller's copy is its own
    version, files, record = inputs[1]
    assert plan_package_once(catalog, "vllm", version, files, record, []).changes
    edited = dict(files, **{path: data + b"\n# edited\n" for path, data in files.items() if path.endswith("rocm.py")})
    plan_package_once(catalog, "vllm", version, edited, record, [])
    assert len(counted_plans) == 2, "a host whose files differ is planned anew"


def test_a_plan_that_writes_nothing_is_read_back_by_the_next_run_and_only_for_the_same_inputs(
        catalog, tmp_path, monkeypatch, counted_plans):
    from cdna2.patches import plan_memo

    version, files, record = vllm_026_host(catalog, tmp_path)
    applied = plan_memo.plan_package_once(catalog, "vllm", version, files, record, [])
    assert applied.status == "apply" and not list((tmp_path / "controller-cache").rglob("*.json")), \
        "a plan that writes files is not kept: it carries their new bytes"
    patched = with_changes(files, applied)
    first = plan_memo.plan_package_once(catalog, "vllm", version, patched, record, [])
    assert first.status == "patched" and len(counted_plans) == 2
    [stored] = (tmp_path / "controller-cache" / "patch-plans").glob("*.json")

    monkeypatch.setattr(plan_memo, "_plans", {})  # the next controller run
    again = plan_memo.plan_package_once(catalog, "vllm", version, patched, record, [])
    assert again == first and len(counted_plans) == 2, "read back, not planned"
    for changed in ({"catalog": dataclasses.replace(catalog, digest="other")}, {"optional": ["vllm-ck-int8-gemm"]},
                    {"record": dict(record, **{"vllm/platforms/rocm.py": "sha256=other"})}):
        monkeypatch.setattr(plan_memo, "_plans", {})
        plan_memo.plan_package_once(changed.get("catalog", catalog), "vllm", version, patched,
                                    changed.get("record", record), changed.get("optional", []))
    assert len(counted_plans) == 5, "another catalog, optional set or RECORD is planned anew"

    stored.write_text("{truncated")
    monkeypatch.setattr(plan_memo, "_plans", {})
    assert plan_memo.plan_package_once(catalog, "vllm", version, patched, record, []) == first
    assert len(counted_plans) == 6 and json.loads(stored.read_text())["status"] == "patched", \
        "an unreadable entry is planned again and written anew"


def test_the_stored_plans_are_bounded_and_the_ones_used_last_are_kept(catalog, tmp_path, monkeypatch, counted_plans):
    from cdna2.patches import plan_memo

    monkeypatch.setattr(plan_memo, "PLANS_KEPT", 2)
    version, files, record = vllm_026_host(catalog, tmp_path)
    applied = plan_memo.plan_package_once(catalog, "vllm", version, files, record, [])
    patched = with_changes(files, applied)
    stored = tmp_path / "controller-cache" / "patch-plans"
    catalogs = [dataclasses.replace(catalog, digest=f"catalog-{n}") for n in range(3)]
    plan_memo.plan_package_once(catalogs[0], "vllm", version, patched, record, [])
    [first] = stored.glob("*.json")
    plan_memo.plan_package_once(catalogs[1], "vllm", version, patched, record, [])
    os.utime(first, ns=(1, 1))  # the oldest: used long ago...
    monkeypatch.setattr(plan_memo, "_plans", {})
    plan_memo.plan_package_once(catalogs[0], "vllm", version, patched, record, [])  # ...and read back now
    assert first.stat().st_mtime_ns > 1 and len(counted_plans) == 3, "read back, not planned, and marked used"
    plan_memo.plan_package_once(catalogs[2], "vllm", version, patched, record, [])
    assert len(list(stored.glob("*.json"))) == 2 and first.exists(), "the plan used least recently went"


def test_a_catalog_built_in_code_keeps_no_plan_on_disk(catalog, tmp_path, counted_plans):
    from cdna2.patches import plan_memo

    version, files, record = vllm_026_host(catalog, tmp_path)
    plan_memo.plan_package_once(dataclasses.replace(catalog, digest=""), "vllm", version, files, record, [])
    assert not (tmp_path / "controller-cache" / "patch-plans").exists()

"""Every AITER tag from v0.1.16 with main, every vLLM from 0.23.0 to the newest on the index: each set, the whole cycle.

The releases are discovered (releases/discovery.py: the index, the tags), the trees built once (cached under
$CDNA2_CACHE/release-trees) from the real AITER git history and the real wheels, and each release's row kept in
$CDNA2_CACHE/coverage-results; the results are computed once per session and shared by every test here.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from cdna2.patches import plan_package, record_hash
from cdna2.patches.cli import apply_in_place, probe
from releases import coverage
from releases.discovery import named_versions

pytestmark = pytest.mark.slow
DOCS = Path(__file__).resolve().parents[3] / "docs" / "release-qualification.md"


@pytest.fixture(scope="session")
def discovered(catalog):
    try:
        return coverage.discover(catalog)
    except coverage.SourceMissing as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def trees(catalog, discovered):
    return coverage.release_trees(catalog, discovered)


@pytest.fixture(scope="session")
def results(catalog, discovered, trees):
    return coverage.results(catalog, discovered)


def by_release(results, release):
    return next(result for result in results if result.release == release)


def test_every_release_from_the_floor_to_the_newest_is_there(catalog, results, discovered):
    aiter, vllm = discovered
    tags = [release for release in aiter.releases if release != "main"]
    assert tags == sorted(tags, key=lambda tag: Version(tag)) and tags[0] == "v0.1.16" and aiter.releases[-1] == "main"
    rows = [result.release for result in results if result.package == "amd-aiter"]
    assert rows.pop(0) == "0.1.7.post2.dev18 (wheel)" and rows == aiter.releases
    assert len(rows) >= 15, rows  # 0.1.16 + 6 posts, 0.1.17, 0.1.18, 0.1.19 + 2 posts, 0.1.20 + 1 post, main
    assert [result.release for result in results if result.package == "vllm"] == vllm.releases
    assert vllm.releases[0] == "0.23.0" and vllm.releases == sorted(vllm.releases, key=Version)
    assert named_versions(catalog, "vllm") <= set(vllm.releases), "a qualified release is missing from the list"
    assert "0.34.0" in vllm.releases and "0.22.1" not in vllm.releases  # the index served 0.34.0 at qualification


def test_every_release_is_qualified_with_every_set_or_refused_by_name(results, discovered):
    for result in results:
        assert result.status in ("qualified", "main", "refused"), (result.release, result.status, result.cells)
    assert {result.release for result in results if result.status == "refused"} == {
        release for found in discovered for release in found.refused}


def test_every_set_patches_every_release_and_the_cycle_holds(results):
    for result in results:
        if result.status == "refused":
            continue  # refused by name: nothing is laid out for it
        assert result.cycle == "ok", (result.release, result.cycle)
        if result.release.endswith("(wheel)"):
            continue  # test_aiter_wheel_declines_optional_sets_whose_feature_it_lacks_by_name
        assert set(result.cells.values()) == {"patched"}, (result.release, result.cells)


def test_vllm_027_028_get_the_fp8_scaled_mm_narrowing(catalog, results, trees, tmp_path):
    for release in ("0.27.0", "0.27.1", "0.28.0"):
        assert by_release(results, release).variants["vllm-attention-gate"] == "0.27-0.28"
        tree = next(tree for _, name, tree in trees if name == release)
        root = tmp_path / release
        shutil.copytree(tree, root)
        plan = plan_package(catalog, "vllm", *probe(root, catalog, "vllm"), [])
        torch_file = "vllm/model_executor/kernels/linear/scaled_mm/pytorch.py"
        narrowed = next(change for change in plan.changes if change.path == torch_file).new_bytes.decode()
        assert "if on_gfx9() and not on_mi3xx():\n" in narrowed
    for release in ("0.29.0", "0.33.0"):  # upstream refuses gfx90a there itself (_rocm_torch_fp8_scaled_mm_supported)
        assert by_release(results, release).variants["vllm-attention-gate"] == "0.33"
    assert by_release(results, "0.34.0").variants["vllm-attention-gate"] == "0.34"  # + muse-glimmer-backend


def test_variant_0_33_is_not_taken_where_the_fp8_gate_is_still_open(catalog, trees, tmp_path):
    tree = next(tree for _, name, tree in trees if name == "0.27.0")
    version, files, record = probe(tree, catalog, "vllm")
    only_033 = replace(catalog, sets=tuple(
        patch_set if patch_set.name != "vllm-attention-gate" else
        replace(patch_set, variants=tuple(v for v in patch_set.variants if v.id != "0.27-0.28"))
        for patch_set in catalog.sets))
    plan = plan_package(only_033, "vllm", version, files, record, [])
    assert plan.status == "refused" and plan.changes == []
    assert ("vllm/model_executor/kernels/linear/scaled_mm/pytorch.py: leaves gate torch-fp8-scaled-mm-narrowing "
            "(patched by variant 0.23-0.26) unpatched") in "\n".join(plan.reasons)


def test_aiter_lint_commit_releases_patch_because_only_a_comment_changed(results, trees):
    for release in ("v0.1.19.post1", "v0.1.19.post2", "v0.1.20", "v0.1.20.post1", "main"):
        tree = next(tree for _, name, tree in trees if name == release)
        text = (tree / "aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py").read_text()
        assert "from gemm_a8w8_common import (\n" in text and "from gemm_a8w8_common import (  # noqa" not in text
        assert by_release(results, release).cells["aiter-asm-paths"] == "patched"


def test_versions_no_variant_was_written_for_are_said(results):
    main = by_release(results, "main")
    assert f"set aiter-asm-paths: matched by text; no variant written for {main.version}" in main.notes
    assert not by_release(results, "v0.1.19").notes


def test_comments_and_blank_lines_added_inside_anchors_still_patch_and_round_trip(catalog, trees, tmp_path):
    """vLLM 0.26.0 with a comment dropped, one reworded and blank lines added inside three sites' anchors."""
    root = tmp_path / "site-packages"
    shutil.copytree(next(tree for _, name, tree in trees if name == "0.26.0"), root)
    ops = root / "vllm/_aiter_ops.py"
    text = ops.read_text()
    edits = [("    @classmethod\n    @if_aiter_supported\n    def is_mha_enabled(cls) -> bool:\n",
              "    @classmethod\n    # attention\n\n    @if_aiter_supported\n    def is_mha_enabled(cls) -> bool:\n"),
             ("        if is_aiter_found_and_supported():\n            return func(*args, **kwargs)\n",
              "        if is_aiter_found_and_supported():  # gate\n\n            return func(*args, **kwargs)\n")]
    for old, new in edits:
        assert text.count(old) == 1
        text = text.replace(old, new)
    ops.write_text(text)
    dist_info = next(root.glob("vllm-*.dist-info"))
    record = dist_info / "RECORD"
    record.write_text("".join(line if not line.startswith("vllm/_aiter_ops.py,") else
                              f"vllm/_aiter_ops.py,{record_hash(text.encode())},{len(text.encode())}\n"
                              for line in record.read_text().splitlines(keepends=True)))
    plan = plan_package(catalog, "vllm", *probe(root, catalog, "vllm"), [])
    assert plan.status == "apply", plan.reasons
    written = next(change for change in plan.changes if change.path == "vllm/_aiter_ops.py").new_bytes.decode()
    assert "    @classmethod\n    # attention\n\n    @if_aiter_attention_supported  # gfx90a-asm-enable\n" in written
    assert "        if is_aiter_found_and_supported():  # gate\n\n" in written
    apply_in_place(root, plan, tmp_path / "state")
    assert plan_package(catalog, "vllm", *probe(root, catalog, "vllm"), []).status == "patched"


def test_aiter_wheel_declines_optional_sets_whose_feature_it_lacks_by_name(catalog, results, trees):
    wheel = by_release(results, "0.1.7.post2.dev18 (wheel)")
    assert wheel.cells["aiter-asm-paths"] == "patched"
    assert wheel.cells["aiter-ck-int8-gemm"].startswith("declined: ")
    tree = next(tree for _, name, tree in trees if name == wheel.release)
    plan = plan_package(catalog, "amd-aiter", *probe(tree, catalog, "amd-aiter"),
                        ["aiter-ck-int8-gemm", "aiter-skip-fp8-tune-instances"])
    assert plan.status == "apply" and plan.sets == ["aiter-asm-paths"], plan.reasons
    assert plan.declined == {
        "aiter-ck-int8-gemm": "amd-aiter 0.1.7.post2.dev18: set aiter-ck-int8-gemm: no GFX_CU_NUM_MAP in "
                              "aiter/jit/utils/build_targets.py in this version, so there is no CU table to teach "
                              "gfx90a",
        "aiter-skip-fp8-tune-instances": "amd-aiter 0.1.7.post2.dev18: set aiter-skip-fp8-tune-instances: "
                                         "gen_instances.py writes no FP8 (abF8) tuning instances in this version, so "
                                         "there is nothing to narrow"}
    assert any("leaves gate a8w8-dtypes as it is" in note for note in plan.notes), plan.notes


def test_table_and_json_name_every_release_and_set(catalog, results):
    table = coverage.table(results, catalog)
    for result in results:
        assert re.search(rf"^  {re.escape(result.release)}  ", table, re.M), result.release
    document = json.loads(coverage.to_json(results))
    assert len(document["releases"]) == len(results)
    assert document["releases"][0]["sets"]["aiter-asm-paths"] == "patched"


def test_the_docs_carry_the_current_coverage_table(catalog, results):
    docs = DOCS.read_text()
    start = docs.index("<!-- coverage:start -->\n```\n") + len("<!-- coverage:start -->\n```\n")
    end = docs.index("```\n<!-- coverage:end -->")
    assert docs[start:end] == coverage.table(results, catalog) + "\n", \
        f"{DOCS.name}'s coverage table is stale: paste the output of python -m releases coverage"


def test_audit_lists_gates_left_for_gfx90a_after_the_plan(catalog, trees, tmp_path):
    """The fmha_v3 backward gates of AITER still refuse gfx90a (no set opens them, though the translator installs
    most bwd kernels); stock vLLM 0.27.0's torch FP8 scaled-mm capability floor admits gfx90a until planned."""
    tree = next(tree for _, name, tree in trees if name == "v0.1.19")
    plan = plan_package(catalog, "amd-aiter", *probe(tree, catalog, "amd-aiter"), [])
    assert plan.audit == [
        'aiter/ops/mha.py:2285: ret = get_gfx() == "gfx942": still refuses gfx90a on an attention path whose kernels '
        'are installed',
        'aiter/ops/mha.py:3139: ret = get_gfx() == "gfx942": still refuses gfx90a on an attention path whose kernels '
        'are installed']
    from cdna2.patches.audit import audit

    vllm = next(tree for _, name, tree in trees if name == "0.27.0")
    _, files, _ = probe(vllm, catalog, "vllm")
    stock = audit({path: data.decode() if data else None for path, data in files.items()})
    assert stock == ["vllm/model_executor/kernels/linear/scaled_mm/pytorch.py:38: if compute_capability is not None "
                     "and compute_capability < 89:: admits gfx90a to an FP8/FP4 path (capability 90 passes)"]
    assert plan_package(catalog, "vllm", *probe(vllm, catalog, "vllm"), []).audit == []

"""aiter-triton-gfx90a's added files, as the planner treats them on the real amd-aiter 0.1.7 wheel's files: added
where absent, left alone where they hold our bytes, refused by name where they hold anything else."""

from __future__ import annotations

import shutil

import pytest

from cdna2.patches import load_catalog
from cdna2.patches.cli import apply_in_place
from lab import wheelhouse
from releases import coverage

SET = "aiter-triton-gfx90a"
GEMM = "aiter/ops/triton/configs/gemm/MI200-GEMM-A16W16.json"


@pytest.fixture()
def release(tmp_path):
    catalog = load_catalog()
    root = tmp_path / "site-packages"
    shutil.copytree(coverage.wheel_tree(wheelhouse.AITER, catalog.target_files("amd-aiter")), root)
    return catalog, root


def test_absent_files_are_added_and_a_second_plan_changes_nothing(release, tmp_path):
    catalog, root = release
    plan = coverage._plan(catalog, "amd-aiter", root, [SET])
    added = [change for change in plan.changes if change.old_sha256 is None]
    configs = "aiter/ops/triton/configs"
    moe = [f"{configs}/moe/MI200-{name}.json"
           for name in ("MOE-DEFAULT", "MOE-INT4_W4A16", "MOE-INT8_W8A16", "MOE_ROUTING_SIGMOID_TOPK1")]
    gemm = [f"{configs}/{name}.json" for name in (
        "MI200-GMM", "gemm/MI200-BATCHED_GEMM-A16W16", "gemm/MI200-FF-A16W16-fused", "gemm/MI200-GEMM-A16W16-ATOMIC",
        "gemm/MI200-GEMM-A16W16-gated")]
    assert sorted(change.path for change in added) == sorted([
        f"{configs}/MI200-MHA-DEFAULT.json", GEMM, f"{configs}/MI200-EXTEND_ATTENTION.json",
        f"{configs}/MI200-LEANATTN-DEFAULT.json", f"{configs}/MI200-MLA_DECODE_ROPE-DEFAULT.json",
        f"{configs}/hstu_attn/MI200-HSTU_ATTN_FWD.json", f"{configs}/hstu_attn/MI200-HSTU_ATTN_BWD.json", *moe, *gemm])
    assert plan.variants[SET] == "0.1.7"
    assert apply_in_place(root, plan, tmp_path / "state")["ok"]
    assert (root / GEMM).read_bytes() == next(change.new_bytes for change in added if change.path == GEMM)
    again = coverage._plan(catalog, "amd-aiter", root, [SET])
    assert again.status == "patched" and again.changes == []


def test_a_foreign_file_where_the_set_adds_one_refuses_the_set(release):
    catalog, root = release
    (root / GEMM).write_text('{"any": {}}\n')
    plan = coverage._plan(catalog, "amd-aiter", root, [SET])
    assert plan.status == "refused" and plan.changes == []
    assert any(f"{GEMM}: exists and is not the file this set adds" in reason for reason in plan.reasons), plan.reasons

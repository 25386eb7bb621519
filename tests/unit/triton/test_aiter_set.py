"""aiter-triton-gfx90a's added files, as the planner treats them on the real amd-aiter 0.1.7 wheel's files: added
where absent, left alone where they hold our bytes, refused by name where they hold anything else; from v0.1.20,
chunked delta attention's file added with the directories AITER's tree lacks, and both removed on revert."""

from __future__ import annotations

import shutil

import pytest

from cdna2.__main__ import main
from cdna2.host import txn
from cdna2.patches import load_catalog
from cdna2.patches.catalog import PACKAGE_DIR
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


DELTA_ATTENTION = "aiter/ops/triton/configs/gfx90a/triton/attention/chunk_delta_attn/DEFAULT.json"


@pytest.mark.slow
@pytest.mark.parametrize("release", ["v0.1.20.post1", "main"])
def test_a_file_in_directories_the_tree_lacks_is_added_with_them_and_reverted_to_record_pristine(
        release, aiter_git_dir, tmp_path, capsys):
    catalog = load_catalog()
    tree = coverage.aiter_tree(aiter_git_dir, release, catalog.target_files("amd-aiter"))
    root = tmp_path / "site-packages"
    shutil.copytree(tree, root)
    assert main(["patch", "check", "--site-packages", str(root), "--set", SET]) == 1
    created = ["aiter/ops/triton/configs/gfx90a", "aiter/ops/triton/configs/gfx90a/triton",
               "aiter/ops/triton/configs/gfx90a/triton/attention", DELTA_ATTENTION.rsplit("/", 1)[0]]
    assert "".join(f"   would create directory {directory}\n" for directory in created) in capsys.readouterr().out
    plan = coverage._plan(catalog, "amd-aiter", root, [SET])
    assert plan.variants[SET] == "0.1.20-main" and DELTA_ATTENTION in [change.path for change in plan.changes]
    result = apply_in_place(root, plan, tmp_path / "state")
    assert result["ok"] and result["created_directories"] == created, result
    derived = PACKAGE_DIR / "data" / "triton-configs" / "0.1.17-main" / DELTA_ATTENTION
    assert (root / DELTA_ATTENTION).read_bytes() == derived.read_bytes()
    assert not list(root.rglob(f"*{txn.STAGED_SUFFIX}*"))
    again = coverage._plan(catalog, "amd-aiter", root, [SET])
    assert again.status == "patched" and again.changes == [] and again.new_directories == []
    reverted = txn.revert(tmp_path / "state", root)
    assert reverted["removed_directories"] == created and reverted["left_directories"] == [], reverted
    assert coverage._record_pristine(root, tree) == []

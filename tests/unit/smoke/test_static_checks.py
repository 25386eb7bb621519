"""Each static check of the smoke test on a provisioned fixture host, clean and then broken the way hosts break."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cdna2.host import smoke_static, txn
from tests.unit.smoke.conftest import GFX942, AITER_JIT_OUTPUTS, code_object, write_distribution


def test_a_clean_provisioned_host_passes_every_file_check(host) -> None:
    checks = [host.run(check) for check in (smoke_static.check_gfx90a_tree, smoke_static.check_code_objects,
                                             smoke_static.check_manifests, smoke_static.check_patch_sets, smoke_static.check_record,
                                             smoke_static.check_stale_jit, smoke_static.check_jit_locks)]
    assert [check["status"] for check in checks] == ["passed"] * len(checks), json.dumps(checks, indent=1)
    by_name = {check["name"]: check["detail"] for check in checks}
    assert "3 code objects" in by_name["code_objects_gfx90a"]
    assert "2 rows in 2 manifests" in by_name["manifests_complete"]
    assert "amd-aiter 1 files, vllm 1 files" in by_name["patch_sets_applied"]


# --- the gfx90a tree ------------------------------------------------------------------------------------------------

def test_missing_tree_fails_and_the_tree_checks_skip(host) -> None:
    for path in sorted(host.tree.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    host.tree.rmdir()
    tree = host.run(smoke_static.check_gfx90a_tree)
    assert tree["status"] == "failed" and "is missing: run the deploy" in tree["detail"]
    assert host.run(smoke_static.check_code_objects)["status"] == "skipped"
    assert host.run(smoke_static.check_manifests)["status"] == "skipped"


def test_a_deleted_kernel_changes_the_tree_digest(host) -> None:
    (host.tree / "all_reduce.co").unlink()
    check = host.run(smoke_static.check_gfx90a_tree)
    assert check["status"] == "failed" and "is not the tree the deploy installed" in check["detail"]


def test_a_tree_without_a_kernels_record_was_not_installed_by_the_tool(host) -> None:
    (host.state_dir / "state.json").write_text(json.dumps({"format": 1}))
    check = host.run(smoke_static.check_gfx90a_tree)
    assert check["status"] == "failed" and "has no kernels record" in check["detail"]


def test_code_objects_that_are_not_gfx90a_are_named(host) -> None:
    (host.tree / "pa/pa_bf16_noquant_gqa16_1tg_4w.co").write_bytes(code_object(GFX942, "untranslated"))
    (host.tree / "pa/truncated.co").write_bytes(b"\x7fELF\x02")
    check = host.run(smoke_static.check_code_objects)
    assert check["status"] == "failed"
    assert "2 of 5 code objects" in check["detail"]
    assert "pa/pa_bf16_noquant_gqa16_1tg_4w.co (gfx942)" in check["detail"]
    assert "pa/truncated.co (not an ELF file)" in check["detail"]


def test_machine_of_reads_the_e_flags_low_byte(tmp_path: Path) -> None:
    for mach, expected in ((0x3F, "gfx90a"), (0x4C, "gfx942"), (0x40, "mach 0x40")):
        path = tmp_path / f"{mach}.co"
        path.write_bytes(code_object(mach, "x"))
        assert smoke_static.machine_of(path) == expected


def test_a_dangling_manifest_row_is_named_and_product_folders_count(host) -> None:
    with open(host.tree / "pa/pa_asm.csv", "a") as manifest:
        manifest.write("bf16,bf16,16,0,0,0,16,_ZN5aiter28pa_bf16_noquant_gqa16_1tg_4wE,"
                       "pa_bf16_noquant_gqa16_1tg_4w.co\n")
        manifest.write("bf16,bf16,16,0,0,0,16,escape,../../gfx942/pa/pa_bf16_noquant_gqa8_1tg_4w.co\n")
    check = host.run(smoke_static.check_manifests)
    assert check["status"] == "failed"
    assert check["detail"].startswith("2 manifest rows")
    assert "pa/pa_asm.csv:3 pa_bf16_noquant_gqa16_1tg_4w.co" in check["detail"]
    assert "pa/pa_asm.csv:4 ../../gfx942/pa/pa_bf16_noquant_gqa8_1tg_4w.co" in check["detail"]
    assert "fmha_v3_fwd" not in check["detail"], "fwd_hd128_bf16.co exists under MI300/, where the loader looks"


# --- patches and RECORD ---------------------------------------------------------------------------------------------

def test_a_patched_file_edited_afterwards_fails_and_names_the_file(host) -> None:
    (host.site / "aiter/ops/mha.py").write_text("ret = True  # hand edit\n")
    check = host.run(smoke_static.check_patch_sets)
    assert check["status"] == "failed"
    assert f"{host.site / 'aiter/ops/mha.py'}: edited after patching" in check["detail"]


def test_a_patch_lost_to_a_reinstall_fails(host) -> None:
    backup = host.state_dir / "backups/vllm"
    (host.site / "vllm/_aiter_ops.py").write_bytes((backup / "originals/vllm/_aiter_ops.py").read_bytes())
    check = host.run(smoke_static.check_patch_sets)
    assert check["status"] == "failed" and "back to the original (patch lost)" in check["detail"]


def test_an_interrupted_transaction_fails_with_the_recover_command(host) -> None:
    (host.state_dir / "backups/amd-aiter" / txn.JOURNAL).write_text("{}")
    check = host.run(smoke_static.check_patch_sets)
    assert check["status"] == "failed" and "cdna2.host.txn recover --backup-dir" in check["detail"]


def test_an_installed_package_without_a_transaction_fails(host) -> None:
    txn.revert(host.state_dir / "backups/vllm", host.site)
    check = host.run(smoke_static.check_patch_sets)
    assert check["status"] == "failed" and "vllm: no patch transaction" in check["detail"]


def test_record_names_tampered_and_missing_files_but_not_patched_ones(host) -> None:
    (host.site / "aiter/jit/core.py").write_text("AITER_ASM_DIR = 'elsewhere'\n")
    (host.site / "vllm/__init__.py").unlink()
    check = host.run(smoke_static.check_record)
    assert check["status"] == "failed"
    assert check["detail"].startswith("2 files differ from their RECORD")
    assert "amd-aiter: aiter/jit/core.py (changed)" in check["detail"]
    assert "vllm: vllm/__init__.py (missing)" in check["detail"]
    assert "mha.py" not in check["detail"] and "_aiter_ops.py" not in check["detail"]


def test_record_fails_a_package_whose_record_is_gone_instead_of_matching_zero_files(host) -> None:
    (next(host.site.glob("vllm-*.dist-info")) / "RECORD").unlink()
    check = host.run(smoke_static.check_record)
    assert check["status"] == "failed", check["detail"]
    assert "vllm: no file of" in check["detail"] and "RECORD is missing" in check["detail"]


def test_record_skips_pycache_and_our_own_trees(host) -> None:
    # A RECORD that lists bytecode and a gfx90a tree (as a newer AITER might) must not fail on them.
    record = next(host.site.glob("amd_aiter-*.dist-info")) / "RECORD"
    with open(record, "a") as stream:
        stream.write("aiter/__pycache__/__init__.cpython-311.pyc,sha256=AAAA,4\n")
        stream.write("aiter_meta/hsa/gfx90a/all_reduce.co,sha256=AAAA,4\n")
        stream.write("aiter_meta/hsa/.gfx90a.previous/all_reduce.co,sha256=AAAA,4\n")
    check = host.run(smoke_static.check_record)
    assert check["status"] == "passed", check["detail"]
    assert check["detail"].startswith("4 amd-aiter and 1 vllm files match RECORD")


def test_triton_version_must_be_the_expected_one(host) -> None:
    assert host.run(lambda view: smoke_static.check_triton_version(view, "3.7.1"))["status"] == "failed"
    write_distribution(host.site, "triton", "3.7.0", {"triton/__init__.py": b""})
    check = host.run(lambda view: smoke_static.check_triton_version(view, "3.7.1"))
    assert check["status"] == "failed" and "triton 3.7.0 in" in check["detail"]
    assert "reinstall triton==3.7.1" in check["detail"]
    assert host.run(lambda view: smoke_static.check_triton_version(view, "3.7.0"))["status"] == "passed"


# --- JIT outputs and locks ------------------------------------------------------------------------------------------

def _make_jit_outputs(site: Path, mtime_ns: int) -> None:
    module, build = (site / relative for relative in AITER_JIT_OUTPUTS)
    (build / "obj").mkdir(parents=True)
    for path in (module, build / "obj" / "mha_fwd.o"):
        path.write_bytes(b"built")
        os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_jit_module_older_than_its_patched_input_is_stale(host) -> None:
    patched_at = (host.site / "aiter/ops/mha.py").stat().st_mtime_ns
    _make_jit_outputs(host.site, patched_at - 10**9)
    check = host.run(smoke_static.check_stale_jit)
    assert check["status"] == "failed"
    assert check["detail"].startswith("2 JIT outputs were built before their inputs were patched")
    assert f"python -m cdna2.host.jit --root {host.site} aiter/jit/module_fmha_v3_fwd.so" in check["detail"]


def test_a_jit_module_rebuilt_after_the_patch_is_fine(host) -> None:
    patched_at = (host.site / "aiter/ops/mha.py").stat().st_mtime_ns
    _make_jit_outputs(host.site, patched_at + 10**9)
    check = host.run(smoke_static.check_stale_jit)
    assert check["status"] == "passed", check["detail"]


def test_an_orphan_lock_fails_and_a_held_lock_passes(host) -> None:
    lock = host.site / "aiter/jit/build/lock_module_gemm_a8w8"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    orphan = host.run(smoke_static.check_jit_locks)
    assert orphan["status"] == "failed"
    assert "aiter/jit/build/lock_module_gemm_a8w8" in orphan["detail"]
    assert f"python -m cdna2.host.jit --root {host.site}" in orphan["detail"]
    with open(lock):  # a live build keeps its baton open (AITER's FileBaton)
        held = host.run(smoke_static.check_jit_locks)
    assert held["status"] == "passed" and "held by a running build" in held["detail"]


def test_unreadable_records_are_named_not_mistaken_for_absent_ones(host) -> None:
    (host.state_dir / "state.json").write_text("{not json")
    (host.state_dir / "backups/vllm" / txn.STATE).write_text("{not json")
    tree = host.run(smoke_static.check_gfx90a_tree)
    assert tree["status"] == "failed" and "state.json: unreadable tool state" in tree["detail"]
    patches = host.run(smoke_static.check_patch_sets)
    assert patches["status"] == "failed" and "backups/vllm/state.json: unreadable patch record" in patches["detail"]

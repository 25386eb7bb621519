"""JIT modules built from the kernel trees, and the JIT locks of a process group (cdna2/host/jit.py).

Which modules compile in a table generated from ``hsa/<arch>`` is read from AITER's own optCompilerConfig.json:
the real one of the amd-aiter 0.1.7.post2.dev18 wheel, and those of tags v0.1.17 to main from the AITER git
mirror (``$CDNA2_AITER_GIT``, a bare repository; skipped when it is absent).
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdna2.host import jit, smoke_static
from lab.aiter_git import aiter_git, missing_reason
from lab import wheelhouse

ROOT = Path(__file__).resolve().parents[3]
TAGS = ("v0.1.17", "v0.1.19", "v0.1.20.post1", "main")


def test_the_0_1_7_wheel_builds_the_pa_and_fmha_tables_into_their_modules() -> None:
    modules = jit.kernel_tree_modules(wheelhouse.installed_tree(wheelhouse.AITER))
    assert {"module_attention_asm", "module_fmha_v3_fwd", "module_fmha_v3_varlen_fwd"} <= set(modules), modules
    assert "module_aiter_core" not in modules and "module_gemm_a8w8" not in modules, "CK and core read no tree"


@pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")
@pytest.mark.parametrize("tag", TAGS)
def test_later_aiter_builds_every_fmha_v3_table_from_hsa_codegen(tmp_path: Path, tag: str) -> None:
    config = subprocess.run(["git", f"--git-dir={aiter_git()}", "show", f"{tag}:aiter/jit/optCompilerConfig.json"],
                            capture_output=True, check=True).stdout
    (tmp_path / jit.JIT_CONFIG).parent.mkdir(parents=True)
    (tmp_path / jit.JIT_CONFIG).write_bytes(config)
    modules = jit.kernel_tree_modules(tmp_path)
    fmha_v3 = {name for name in json.loads(config) if name.startswith("module_fmha_v3_")}
    assert fmha_v3 and fmha_v3 | {"module_attention_asm"} <= set(modules), (tag, modules)


def real_config_root(tmp_path: Path) -> Path:
    """A site-packages with the 0.1.7 wheel's optCompilerConfig.json and built modules, tree-read and not."""
    config = wheelhouse.installed_tree(wheelhouse.AITER) / jit.JIT_CONFIG
    (tmp_path / jit.JIT_CONFIG).parent.mkdir(parents=True)
    shutil.copyfile(config, tmp_path / jit.JIT_CONFIG)
    for name in ("module_attention_asm", "module_aiter_core"):
        (tmp_path / "aiter/jit" / f"{name}.so").write_bytes(b"built")
        (tmp_path / "aiter/jit/build" / name).mkdir(parents=True)
    return tmp_path


def test_the_jit_command_removes_the_kernel_tree_modules_only(tmp_path: Path) -> None:
    root = real_config_root(tmp_path)
    completed = subprocess.run([sys.executable, "-B", "-m", "cdna2.host.jit", "--root", str(root),
                                "--kernel-tree-modules", "aiter/jit/libmha_fwd.so"],
                               capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["removed"] == ["aiter/jit/build/module_attention_asm",
                                                       "aiter/jit/module_attention_asm.so"]
    assert (root / "aiter/jit/module_aiter_core.so").exists() and (root / "aiter/jit/build/module_aiter_core").exists()


def test_a_kernel_tree_module_built_before_the_tree_was_installed_is_named(host) -> None:
    config = wheelhouse.installed_tree(wheelhouse.AITER) / jit.JIT_CONFIG
    shutil.copyfile(config, host.site / jit.JIT_CONFIG)
    module = host.site / "aiter/jit/module_attention_asm.so"
    module.write_bytes(b"built")
    installed = calendar.timegm(time.strptime("2026-08-20T00:00:00Z", "%Y-%m-%dT%H:%M:%SZ"))  # record_kernels
    os.utime(module, (installed - 60, installed - 60))
    check = host.run(smoke_static.check_kernel_tree_modules)
    assert check["status"] == "failed", check
    assert "module_attention_asm" in check["detail"] and "cannot get heuristic kernel!" in check["detail"]
    assert f"python -m cdna2.host.jit --root {host.site} --kernel-tree-modules" in check["detail"]
    os.utime(module, (installed + 60, installed + 60))
    assert host.run(smoke_static.check_kernel_tree_modules)["status"] == "passed"


def test_locks_a_process_group_held_are_found_and_removed_once_it_is_gone(tmp_path: Path) -> None:
    build = tmp_path / "aiter/jit/build"
    build.mkdir(parents=True)
    lock, other = build / "lock_module_fmha_v3_fwd", build / "lock_module_other"
    other.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_CREAT | "
                               "os.O_EXCL); print('held', flush=True); time.sleep(600)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        held = jit.locks_held_by(tmp_path, {holder.pid})
        assert held == [lock], "only the lock the process has open"
        assert jit.remove_unheld(held) == [] and lock.exists(), "a lock still held stays"
    finally:
        holder.kill()
        holder.wait()
    assert jit.remove_unheld(held) == [lock] and not lock.exists()
    assert other.exists(), "a lock of no process of the group is not touched"

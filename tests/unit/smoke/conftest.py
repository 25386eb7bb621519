"""A provisioned host in a temporary directory, built with the tool's own host code.

The site-packages holds small amd-aiter and vllm distributions (real dist-info and RECORD), a gfx90a tree of code
objects whose ELF headers carry real e_flags, and patches applied through ``cdna2.host.txn``; the state directory
holds the kernels record written by ``cdna2.host.state``. Nothing here stands in for ROCm: these checks read files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdna2.host import digests, elf, probe, smoke_static, state, txn
from tests.unit.test_probe import write_distribution

ROOT = Path(__file__).resolve().parents[3]
GFX90A, GFX942 = 0x3F, 0x4C
AITER_JIT_OUTPUTS = ["aiter/jit/module_fmha_v3_fwd.so", "aiter/jit/build/module_fmha_v3_fwd"]


def code_object(mach: int, name: str) -> bytes:
    """An AMDGPU ELF header (64-bit, little-endian, EM_AMDGPU) with e_flags 0x500 | mach, then a distinct body."""
    header = bytearray(64)
    header[:8] = b"\x7fELF\x02\x01\x01\x40"  # ELFCLASS64, little-endian, version 1, ELFOSABI_AMDGPU_HSA
    struct.pack_into("<HHI", header, 0x10, 3, 0xE0, 1)  # ET_DYN, EM_AMDGPU, EV_CURRENT
    struct.pack_into("<I", header, elf.E_FLAGS_OFFSET, 0x500 | mach)  # xnack/sramecc bits as llvm-mc sets them
    return bytes(header) + name.encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Host:
    site: Path
    state_dir: Path

    @property
    def tree(self) -> Path:
        return self.site / "aiter_meta/hsa/gfx90a"

    def view(self) -> smoke_static.HostView:
        with smoke_static.searched_first(self.site):
            return smoke_static.read_host(self.site, self.state_dir)

    def run(self, check) -> dict:
        """One check function over this host, with its site-packages searched first as the CLI does."""
        with smoke_static.searched_first(self.site):
            return check(smoke_static.read_host(self.site, self.state_dir))

    def record_kernels(self) -> None:
        state.update_state(self.state_dir, "kernels", {"digest": digests.tree_digest(self.tree),
                                                        "installed": "2026-08-20T00:00:00Z"})


def patch(host: Host, package: str, changes: dict[str, bytes], jit_invalidations: list[str]) -> None:
    """Apply ``changes`` through the real transaction, staged beside each target as the deploy stages them."""
    manifest_changes = []
    for relative, new in changes.items():
        target = host.site / relative
        staged = target.with_name(target.name + ".cdna2-staged")
        staged.write_bytes(new)
        manifest_changes.append({"path": relative, "expected_sha256": digests.file_sha256(target),
                                 "staged": str(staged), "new_sha256": sha256(new)})
    txn.apply({"root": str(host.site), "package": package, "backup_dir": str(host.state_dir / "backups" / package),
               "changes": manifest_changes, "jit_invalidations": jit_invalidations})


def install_gfx90a_tree(tree: Path, kernels: dict[str, bytes]) -> None:
    """A gfx90a tree of five files, with ``kernels`` (relative path: bytes) added."""
    files = kernels | {
        "pa/pa_bf16_noquant_gqa8_1tg_4w.co": code_object(GFX90A, "pa gqa8"),
        "pa/pa_asm.csv": b"qType,kvType,Gqa,Mtp,Msk,Hp,blkSz,knl_name,knl_file\n"
                         b"bf16,bf16,8,0,0,0,16,_ZN5aiter27pa_bf16_noquant_gqa8_1tg_4wE,"
                         b"pa_bf16_noquant_gqa8_1tg_4w.co\n",
        "fmha_v3_fwd/MI300/fwd_hd128_bf16.co": code_object(GFX90A, "fmha mi300"),
        "fmha_v3_fwd/fmha_fwd.csv": b"hdim,knl_name,co_name\n128,_ZN5aiter18fmha_fwd_hd128_bf16E,fwd_hd128_bf16.co\n",
        "all_reduce.co": code_object(GFX90A, "all reduce"),
    }
    for relative, data in files.items():
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_bytes(data)


def provisioned_host(root: Path, aiter_init: bytes = b"from .ops.mha import *\n",
                     kernels: dict[str, bytes] | None = None) -> Host:
    """A fully provisioned host under ``root``: kernels installed and recorded, both packages patched."""
    site, state_dir = root / "site-packages", root / "state"
    write_distribution(site, "amd-aiter", "0.1.7.post2.dev18", {
        "aiter/__init__.py": aiter_init,
        "aiter/ops/mha.py": b"ret = get_gfx() in ('gfx942', 'gfx950')\n",
        "aiter/jit/core.py": b"AITER_ASM_DIR = 'hsa/{gfx}/'\n",
        "aiter_meta/hsa/gfx942/pa/pa_bf16_noquant_gqa8_1tg_4w.co": code_object(GFX942, "pa gqa8"),
        "aiter_meta/hsa/gfx942/pa/pa_asm.csv": b"knl_name,knl_file\nk,pa_bf16_noquant_gqa8_1tg_4w.co\n",
    })
    write_distribution(site, "vllm", "0.23.0", {
        "vllm/__init__.py": b"",
        "vllm/_aiter_ops.py": b"return on_mi3xx()\n",
    })
    host = Host(site, state_dir)
    install_gfx90a_tree(host.tree, kernels or {})
    host.record_kernels()
    patch(host, "amd-aiter", {"aiter/ops/mha.py": b"ret = get_gfx() in ('gfx942', 'gfx950', 'gfx90a')\n"},
          AITER_JIT_OUTPUTS)
    patch(host, "vllm", {"vllm/_aiter_ops.py": b"return on_gfx9()\n"}, [])
    return host


@pytest.fixture
def host(tmp_path: Path) -> Host:
    """A fully provisioned host: kernels installed and recorded, both packages patched."""
    return provisioned_host(tmp_path)


def make_target_python(directory: Path, paths: list[Path]) -> Path:
    """A real venv (no pip) whose path reaches ``paths`` (a fixture host's site-packages, cached trees) through a
    .pth file, as a target environment's site-packages would hold them."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    python = directory / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "cdna2-test-paths.pth").write_text("".join(f"{path}\n" for path in paths))
    return python


def make_agent(directory: Path) -> Path:
    """An agent directory holding only cdna2/__init__.py and cdna2/host/*.py, as the agent bundle does."""
    (directory / "cdna2" / "host").mkdir(parents=True)
    shutil.copyfile(ROOT / "cdna2" / "__init__.py", directory / "cdna2" / "__init__.py")
    for module in (ROOT / "cdna2" / "host").glob("*.py"):
        shutil.copyfile(module, directory / "cdna2" / "host" / module.name)
    return directory


def run_smoke_command(python: Path, agent: Path, host: Host, *options: str, env: dict[str, str] | None = None,
                      cwd: Path | None = None) -> tuple[int, dict, str]:
    """The smoke test as the deploy runs it: the agent on PYTHONPATH, JSON on one line of stdout."""
    completed = subprocess.run(
        ["env", f"PYTHONPATH={agent}", *(f"{name}={value}" for name, value in (env or {}).items()), str(python),
         "-B", "-m", "cdna2.host.smoke", "--site-packages", str(host.site), "--state-dir", str(host.state_dir),
         "--expect-triton", "3.7.1", "--json", *options],
        capture_output=True, text=True, timeout=900, cwd=cwd)
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, f"--json prints exactly one line on stdout, got: {completed.stdout[:2000]}"
    return completed.returncode, json.loads(lines[0]), completed.stderr


def statuses(report: dict) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}

"""Small gfx942 code objects the tests assemble themselves with llvm-mc and ld.lld (no AITER needed)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from cdna2.cache import cache_root
from cdna2.kernels import Policy, find_llvm, translate_tree
from lab.aiter_git import aiter_git, missing_reason
from lab import wheelhouse

KERNEL_TEMPLATE = """\
.amdgcn_target "amdgcn-amd-amdhsa--gfx942"
.text
.globl {name}
.p2align 8
.type {name},@function
{name}:
{body}
  s_endpgm
.rodata
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_next_free_vgpr 32
  .amdhsa_next_free_sgpr 16
  .amdhsa_accum_offset 16
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.kernels:
  - .name: {name}
    .symbol: {name}.kd
    .kernarg_segment_size: 0
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 0
    .kernarg_segment_align: 4
    .wavefront_size: 64
    .sgpr_count: 16
    .vgpr_count: 32
    .max_flat_workgroup_size: 256
amdhsa.target: amdgcn-amd-amdhsa--gfx942
amdhsa.version: [1, 2]
...
.end_amdgpu_metadata
"""

BF16_MFMA = "v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]"
FP8_MFMA = "v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[0:1], v[2:3], a[0:3]"


@pytest.fixture(scope="session")
def llvm_tools():
    return find_llvm()


@pytest.fixture(scope="session")
def real_source() -> Path:
    """The gfx942 tree of amd-aiter 0.1.7.post2.dev18 from PyPI (downloaded once, cached by lab.wheelhouse)."""
    return wheelhouse.installed_tree(wheelhouse.AITER) / "aiter_meta/hsa/gfx942"


@pytest.fixture(scope="session")
def real_translation(real_source, tmp_path_factory) -> tuple[dict, Path, Path]:
    """(report, gfx90a tree, engine cache) of one cold translation of the real tree under the default
    kernel_hazard_policy without padding (the audit's findings as translated in place), shared by the tests that
    need it (about 10 s on 2 cores)."""
    work = tmp_path_factory.mktemp("real-translation")
    report = translate_tree(real_source, work / "first" / "gfx90a", cache_dir=work / "cache",
                            policy=Policy(pad_mfma_hazards=False))
    return report, work / "first" / "gfx90a", work / "cache"


@pytest.fixture
def build_code_object(llvm_tools, tmp_path):
    """build_code_object(path, *instructions) writes a one-kernel gfx942 code object at `path`."""
    work = tmp_path / "build"
    work.mkdir()

    def build(path: Path, *instructions: str) -> Path:
        name = path.stem.replace("-", "_")
        source = work / f"{name}.s"
        body = textwrap.indent("\n".join(instructions), "  ")
        source.write_text(KERNEL_TEMPLATE.format(name=name, body=body))
        subprocess.run([llvm_tools.tool("llvm-mc"), "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx942", "-filetype=obj",
                        str(source), "-o", str(work / f"{name}.o")], check=True, capture_output=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(llvm_tools.bin_dir / "ld.lld"), "-shared", str(work / f"{name}.o"), "-o", str(path)],
                       check=True, capture_output=True)
        return path

    return build


def aiter_git_tree(tag: str) -> Path:
    """AITER's hsa/gfx942 tree at `tag`, exported once into the cache (skips the test when the history is absent)."""
    if missing_reason():
        pytest.skip(missing_reason())
    tree = cache_root() / "trees" / f"aiter-git-{tag}"
    with wheelhouse.cache_lock("trees"):
        if not (tree / ".complete").exists():
            staging = tree.with_name(tree.name + ".staging")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            archive = subprocess.run(["git", f"--git-dir={aiter_git()}", "archive", tag, "hsa/gfx942"],
                                     capture_output=True, check=True).stdout
            tarfile.open(fileobj=io.BytesIO(archive)).extractall(staging, filter="data")
            (staging / ".complete").touch()
            shutil.rmtree(tree, ignore_errors=True)
            staging.rename(tree)
    return tree / "hsa" / "gfx942"

"""LLVM discovery: the order of the candidates and the error that says what to install."""

from __future__ import annotations

import pytest

from cdna2.host import elf
from cdna2.kernels import LlvmNotFoundError, find_llvm, llvm


def test_rocm_llvm_bin_is_used_verbatim(monkeypatch, llvm_tools):
    monkeypatch.setenv("ROCM_LLVM_BIN", str(llvm_tools.bin_dir))
    assert find_llvm().bin_dir == llvm_tools.bin_dir


def test_unusable_rocm_llvm_bin_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCM_LLVM_BIN", str(tmp_path))
    with pytest.raises(LlvmNotFoundError) as raised:
        find_llvm()
    message = str(raised.value)
    assert f"{tmp_path}: missing llvm-mc, llvm-objdump, llvm-readelf" in message
    assert "apt-get install llvm-22" in message and "ROCM_LLVM_BIN" in message


def test_candidates_in_documented_order(monkeypatch):
    monkeypatch.delenv("ROCM_LLVM_BIN", raising=False)
    candidates = [str(p) for p in llvm.candidate_dirs()]
    assert candidates[0] == "/opt/rocm/llvm/bin"
    wheel = [c for c in candidates if c.endswith("_rocm_sdk_devel/lib/llvm/bin")]
    system = [c for c in candidates if c.startswith("/usr/lib/llvm-")]
    assert candidates == [candidates[0], *wheel, *system]
    versions = [int(c.split("/")[3].removeprefix("llvm-")) for c in system]
    assert versions == sorted(versions, reverse=True)


def test_llvm_that_lacks_a_target_is_refused(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # A stand-in for an LLVM built without gfx90a: the real tool cannot be made to forget a target.
    for name in llvm.REQUIRED_TOOLS:
        script = fake_bin / name
        script.write_text("#!/bin/sh\necho \"'$2' is not a recognized processor for this target\" >&2\nexit 1\n")
        script.chmod(0o755)
    assert "does not know gfx942" in llvm._why_unusable(fake_bin)


def test_target_errors_name_each_file_that_does_not_say_the_target(build_code_object, llvm_tools, tmp_path):
    kept = build_code_object(tmp_path / "kept.co", "v_mov_b32_e32 v0, v1")
    moved = build_code_object(tmp_path / "moved.co", "v_mov_b32_e32 v0, v1")
    data = bytearray(moved.read_bytes())
    elf.retarget_to_gfx90a(data, elf.read_code_object(bytes(data)))
    moved.write_bytes(data)
    errors = llvm.target_errors(llvm_tools, [kept, moved], "gfx90a")
    assert list(errors) == [str(kept)]
    assert errors[str(kept)].startswith("llvm-readelf does not say gfx90a: Flags:")
    assert "amdhsa.target: amdgcn-amd-amdhsa--gfx942" in errors[str(kept)]
    assert llvm.target_errors(llvm_tools, [kept], "gfx942") == {}

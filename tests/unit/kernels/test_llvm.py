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


def test_candidates_in_documented_order(monkeypatch, tmp_path):
    monkeypatch.delenv("ROCM_LLVM_BIN", raising=False)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm-module"))
    on_path = tmp_path / "path-bin"
    on_path.mkdir()
    (on_path / "llvm-mc").write_text("#!/bin/sh\n")
    (on_path / "llvm-mc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{on_path}:/usr/bin:/bin")
    candidates = [str(p) for p in llvm.candidate_dirs()]
    assert candidates[:2] == [str(tmp_path / "rocm-module/llvm/bin"), "/opt/rocm/llvm/bin"]
    versioned_rocm = [c for c in candidates if c.startswith("/opt/rocm-")]
    wheel = [c for c in candidates if c.endswith("_rocm_sdk_devel/lib/llvm/bin")]
    system = [c for c in candidates if c.startswith(("/usr/lib/llvm-", "/usr/lib64/llvm"))]
    assert wheel, "the controller's own site-packages are searched for a pip-installed ROCm"
    assert system, "bin/setup installs llvm-22 and llvm-19: both must be candidates"
    assert candidates == [*candidates[:2], *versioned_rocm, *wheel, *system, str(on_path)]
    versions = [int(c.split("/")[3].removeprefix("llvm-").removeprefix("llvm")) for c in system]
    assert versions == sorted(versions, reverse=True) and {22, 19} <= set(versions)


def test_versioned_installs_sort_newest_first(tmp_path):
    for name in ("rocm-6.4.3", "rocm-6.10.0", "rocm-7.0.1", "rocm"):
        (tmp_path / name).mkdir()
    ordered = llvm._newest_first(list(tmp_path.iterdir()), lambda p: p.name)
    assert [p.name for p in ordered] == ["rocm-7.0.1", "rocm-6.10.0", "rocm-6.4.3"]


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

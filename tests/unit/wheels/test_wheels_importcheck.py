"""cdna2/host/importcheck.py, run as the operation runs it (``python -I -c <source>``) in throwaway environments.

The environments are real venvs (``--without-pip``); modules are placed in their site-packages, and the real
triton trees come from the lab wheelhouse through a .pth file (read-only, so the cached tree is not copied).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cdna2.host import importcheck

SOURCE = Path(importcheck.__file__).read_text()
SELF_KILL = ("import os, signal, sys\nprint('dying now', file=sys.stderr, flush=True)\n"
             "os.kill(os.getpid(), signal.SIGSEGV)\n")


def make_venv(root: Path) -> tuple[Path, Path]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return python, Path(site)


def run_check(python: Path, *args: str) -> tuple[int, dict, str]:
    result = subprocess.run([str(python), "-I", "-c", SOURCE, *args], capture_output=True, text=True, timeout=300)
    return result.returncode, json.loads(result.stdout), result.stderr


def by_module(report: dict) -> dict[str, dict]:
    return {check["module"]: check for check in report["checks"]}


def test_a_module_killed_by_sigsegv_is_reported_as_a_signal_death(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "selfkill.py").write_text(SELF_KILL)
    (site / "triton").mkdir()
    (site / "triton" / "__init__.py").write_text("")
    (site / "triton" / "runtime").mkdir()
    (site / "triton" / "runtime" / "__init__.py").write_text("")
    (site / "triton" / "runtime" / "autotuner.py").write_text(SELF_KILL)
    code, report, stderr = run_check(python, "--also", "selfkill")
    checks = by_module(report)
    assert code == 1 and report["ok"] is False
    assert checks["triton"]["status"] == "passed", "import triton alone must still pass, as with triton 3.7.0"
    autotuner = checks["triton.runtime.autotuner"]
    assert autotuner["message"] == "SIGSEGV, exit 139, while importing triton.runtime.autotuner"
    assert (autotuner["status"], autotuner["signal"], autotuner["exit"]) == ("failed", "SIGSEGV", 139)
    assert "dying now" in autotuner["output"], "the child's captured output must be kept"
    assert checks["selfkill"]["message"] == "SIGSEGV, exit 139, while importing selfkill"
    assert "importcheck: failed: SIGSEGV, exit 139, while importing triton.runtime.autotuner" in stderr


def test_aiter_is_unavailable_not_passed_without_a_rocm_torch(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "aiter.py").write_text("")  # would import fine: it must still not be reported as passed
    _, report, _ = run_check(python)
    aiter = by_module(report)["aiter"]
    assert aiter["status"] == "unavailable" and "torch does not import" in aiter["message"], aiter
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '2.13.0+cpu'\nclass version:\n    hip = None\n")
    _, report, _ = run_check(python)
    assert by_module(report)["aiter"]["message"] == \
        "aiter not checked: torch 2.13.0+cpu is not a ROCm build (torch.version.hip is None)"


def test_aiter_is_checked_where_torch_is_a_rocm_build(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '2.9.0+rocm6.4'\nclass version:\n    hip = '6.4'\n")
    (site / "aiter.py").write_text("raise RuntimeError('ROCm version file not found')\n")
    code, report, _ = run_check(python)
    aiter = by_module(report)["aiter"]
    assert code == 1 and aiter["status"] == "failed" and aiter["message"] == "exit 1 while importing aiter"
    assert "ROCm version file not found" in aiter["output"]


def test_signal_numbers_from_subprocess_and_from_a_shell():
    assert importcheck.describe_failure("m", -signal.SIGSEGV) == "SIGSEGV, exit 139, while importing m"
    assert importcheck.describe_failure("m", 139) == "SIGSEGV, exit 139, while importing m"
    assert importcheck.describe_failure("m", 1) == "exit 1 while importing m"


@pytest.mark.slow
@pytest.mark.parametrize("triton", ["triton==3.7.0", "triton==3.7.1"])
def test_real_triton_imports_here_without_a_gpu(tmp_path, triton):
    """Measured fact: without ROCm or a GPU, real triton 3.7.0 imports triton.runtime.autotuner without SIGSEGV."""
    from lab import wheelhouse

    python, site = make_venv(tmp_path / "venv")
    (site / "wheelhouse-tree.pth").write_text(f"{wheelhouse.installed_tree(triton)}\n")
    code, report, stderr = run_check(python)
    checks = by_module(report)
    assert code == 0, stderr
    assert checks["triton"]["status"] == checks["triton.runtime.autotuner"]["status"] == "passed"
    assert checks["aiter"]["status"] == "unavailable"

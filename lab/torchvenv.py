"""A cached venv with CPU torch and the real triton wheel, where vLLM's own Python code is run without a GPU.

The project venv has neither torch nor triton. Triton's interpreter (TRITON_INTERPRET=1) runs ``@triton.jit``
kernels on CPU torch tensors, so the patched vLLM kernels can be executed here (tests/unit/patches/fast_fp8/), and
vLLM's platform and arch gates are imported from real vLLM trees (lab/gates/). The venv is built once per machine
under ``$CDNA2_CACHE/test-venvs/`` (staged, checked by importing its packages, then renamed) and keyed by the
interpreter and the requirements, so a stale one is never reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from lab import wheelhouse

# The CPU build lies on this machine's disk (pip's find-links); naming the local version keeps pip from ever choosing
# the multi-GB CUDA build of the same release from the index.
TORCH_REQUIREMENT = "torch==2.13.0+cpu"
# The triton vLLM is deployed with (3.7.1: 3.7.0 crashes on AITER's import path); its wheel comes from the project's wheelhouse.
TRITON_REQUIREMENT = wheelhouse.TRITON_PINNED
# What `import vllm` and vllm/platforms/rocm.py import before anything else (vLLM's wheels are unpacked with no deps),
# and pydantic, which vllm.config is built on: attention backend selection reads the current VllmConfig.
VLLM_IMPORT_REQUIREMENTS = ("packaging==26.4", "regex==2026.11.19", "pydantic==2.14.4")


def _base_python() -> str:
    """The interpreter the project venv was made from; a venv made from inside a venv would chain to it anyway."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def _venv_dir() -> Path:
    key_source = "\n".join((_base_python(), sys.version, TORCH_REQUIREMENT, TRITON_REQUIREMENT,
                            *VLLM_IMPORT_REQUIREMENTS))
    key = hashlib.sha256(key_source.encode()).hexdigest()[:12]
    return wheelhouse.cache_root() / "test-venvs" / f"torch-cpu-{key}"


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}\n{result.stderr[-4000:]}")


def torch_cpu_python() -> Path:
    """Return the ``bin/python`` of the cached torch-CPU + triton venv, building it first if needed."""
    venv = _venv_dir()
    python = venv / "bin" / "python"
    with wheelhouse.cache_lock("test-venv-torch-cpu"):
        if (venv / ".complete").exists():
            return python
        staging = venv.with_name(venv.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        _run([_base_python(), "-m", "venv", str(staging)], f"creating the venv {staging}")
        triton_wheel = wheelhouse.wheel(TRITON_REQUIREMENT)
        # Only `bin/python -m ...` is used, never the console scripts, whose shebangs name the staging path.
        _run([str(staging / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--only-binary=:all:", TORCH_REQUIREMENT, "numpy", *VLLM_IMPORT_REQUIREMENTS, str(triton_wheel)],
             f"installing {TORCH_REQUIREMENT} and {triton_wheel.name} into {staging}")
        _run([str(staging / "bin" / "python"), "-c",
              "import torch, triton, triton.language, numpy, packaging, regex, pydantic"],
             f"importing torch and triton in {staging}")
        (staging / ".complete").touch()
        shutil.rmtree(venv, ignore_errors=True)
        staging.rename(venv)
    return python

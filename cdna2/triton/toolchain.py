"""An isolated, cached venv per triton version on the controller: the compile proof runs there, never in the
project's venv, so it compiles with exactly the triton the hosts run."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from cdna2.cache import cache_lock, cache_root


class ToolchainError(RuntimeError):
    pass


def triton_python(version: str) -> Path:
    """The interpreter of ``$CDNA2_CACHE/triton-venvs/triton-<version>``, built once: a venv without pip, triton
    installed into it with --no-deps (the wheel carries the AMD backend; the proof needs nothing else). The wheel
    comes from the cache's wheelhouse when it holds it, else from the package index."""
    venv = cache_root() / "triton-venvs" / f"triton-{version}"
    python = venv / "bin" / "python"
    with cache_lock("triton-venvs"):
        if (venv / ".complete").exists():
            return python
        staging = venv.with_name(venv.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        _run([sys.executable, "-m", "venv", "--without-pip", str(staging)])
        relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
        cached = sorted((cache_root() / "wheels").glob(f"triton-{version}-*.whl"))
        _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
              "--no-compile", "--target", str(staging / relative), str(cached[-1]) if cached else f"triton=={version}"])
        (staging / ".complete").touch()
        shutil.rmtree(venv, ignore_errors=True)
        staging.rename(venv)
    return python


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolchainError(f"{' '.join(command)} failed (exit {result.returncode}): {result.stderr[-2000:]}")

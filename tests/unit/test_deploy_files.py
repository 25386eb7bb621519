"""`python deploy.py` (verify.py, rollback.py, bench.py) says in one line what the file is and what to type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["deploy.py", "verify.py", "rollback.py", "bench.py"])
def test_running_a_deploy_file_with_python_names_the_pyinfra_command(name):
    # --help too: an operator's first guess.
    result = subprocess.run([sys.executable, name, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{name} is a pyinfra deploy file, not a program")
    assert f"`.venv/bin/pyinfra inventory/lab.py {name}`" in line
    assert ("--dry" in line) == (name in ("deploy.py", "rollback.py"))

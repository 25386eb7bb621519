"""inventory/slurm.py lists the nodes of a Slurm allocation, read the way pyinfra reads it (``debug-inventory``,
which connects to no host). No Slurm exists here: ``scontrol`` is a stand-in on PATH (a shell script that expands
the one nodelist of these tests as the real ``scontrol show hostnames`` does and records how it was called)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")
NODELIST = "nid[001007,001011-001012]"
STAND_IN_SCONTROL = """#!/bin/sh
# STAND-IN for Slurm's scontrol (tests/unit/test_slurm_inventory.py): no Slurm here.
printf '%s\\n' "$*" >> "$(dirname "$0")/calls"
[ "$1 $2" = "show hostnames" ] || { echo "stand-in scontrol: only 'show hostnames' is known" >&2; exit 2; }
case "$3" in
  'nid[001007,001011-001012]') printf 'nid001007\\nnid001011\\nnid001012\\n' ;;
  *) echo "scontrol: error: Invalid hostlist: $3" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def scontrol_dir(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(STAND_IN_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    return bin_dir


def inventory(environment: dict[str, str], path: str) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "CDNA2_NODELIST", "CDNA2_TARGET_PYTHON", "VIRTUAL_ENV", "CONDA_"))}
    return subprocess.run([str(PYINFRA), "inventory/slurm.py", "debug-inventory", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**base, "PATH": path, "HOME": "/home/alice", "USER": "alice", **environment})


def hosts_of(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("[")))


def test_the_allocations_nodes_are_listed_with_the_data_of_a_shared_environment(scontrol_dir: Path) -> None:
    result = inventory({"SLURM_JOB_NODELIST": NODELIST, "VIRTUAL_ENV": "/project/g1/venv-aiter",
                        "ROCM_PATH": "/opt/rocm-6.4.3"}, f"{scontrol_dir}:{os.environ['PATH']}")
    hosts = hosts_of(result)
    assert [host["name"] for host in hosts] == ["nid001007", "nid001011", "nid001012"]
    assert (scontrol_dir / "calls").read_text() == f"show hostnames {NODELIST}\n", "expanded once, by scontrol"
    for host in hosts:
        assert host["groups"] == ["slurm"]
        data = host["data"]
        assert {key: data.get(key) for key in ("ssh_user", "target_python", "rocm_root", "state_dir",
                                               "shared_environment", "ssh_strict_host_key_checking", "_sudo")} == {
            "ssh_user": "alice", "target_python": "/project/g1/venv-aiter/bin/python", "rocm_root": "/opt/rocm-6.4.3",
            "state_dir": f"/home/alice/.local/state/cdna2/nodes/{host['name']}", "shared_environment": True,
            "ssh_strict_host_key_checking": "yes", "_sudo": None}
    validated = subprocess.run([sys.executable, "-m", "cdna2", "validate-data", "-"], cwd=REPO, text=True,
                               input=json.dumps(hosts), capture_output=True, timeout=120)
    assert validated.returncode == 0, validated.stdout + validated.stderr


def test_a_nodelist_given_wins_over_the_allocations(scontrol_dir: Path) -> None:
    result = inventory({"SLURM_JOB_NODELIST": "other[1-2]", "CDNA2_NODELIST": NODELIST,
                        "CDNA2_TARGET_PYTHON": "/scratch/alice/env/bin/python", "XDG_STATE_HOME": "/scratch/alice/st"},
                       f"{scontrol_dir}:{os.environ['PATH']}")
    hosts = hosts_of(result)
    assert [host["name"] for host in hosts] == ["nid001007", "nid001011", "nid001012"]
    assert hosts[0]["data"]["target_python"] == "/scratch/alice/env/bin/python"
    assert hosts[0]["data"]["state_dir"] == "/scratch/alice/st/cdna2/nodes/nid001007"


@pytest.mark.parametrize("environment, path, message", [
    ({}, None, "not inside a Slurm allocation: SLURM_JOB_NODELIST is not set. Run the deploy inside one"),
    ({"SLURM_JOB_NODELIST": NODELIST}, "/usr/bin:/bin", "scontrol is not on PATH: it expands SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_NODELIST": "nid[7-"}, None,
     "scontrol show hostnames 'nid[7-' (from SLURM_JOB_NODELIST) failed with exit 1: scontrol: error: Invalid "
     "hostlist: nid[7-"),
    ({"SLURM_JOB_NODELIST": NODELIST, "VIRTUAL_ENV": ""}, None, "no Python environment to provision: activate it"),
], ids=["outside an allocation", "no scontrol", "a bad nodelist", "no environment"])
def test_the_inventory_stops_with_what_to_do(scontrol_dir: Path, environment: dict, path: str | None,
                                              message: str) -> None:
    result = inventory({"VIRTUAL_ENV": "/project/g1/venv-aiter", **environment},
                       path or f"{scontrol_dir}:{os.environ['PATH']}")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr, result.stdout[-1500:] + result.stderr[-1500:]

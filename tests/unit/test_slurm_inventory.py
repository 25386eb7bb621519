"""inventory/slurm.py lists the nodes of a Slurm allocation, read the way pyinfra reads it (``debug-inventory``,
which connects to no host). Slurm's real ``scontrol`` expands the node lists: ``show hostnames`` needs a
configuration file and no running daemon, so these tests give it the smallest one."""

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
SCONTROL_DIR = "/usr/bin"


@pytest.fixture
def slurm_conf(tmp_path: Path) -> Path:
    if not Path(SCONTROL_DIR, "scontrol").exists():
        raise RuntimeError("Slurm's scontrol is not installed: run bin/setup")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=inventory-test\nSlurmctldHost=localhost\n")
    return conf


def inventory(environment: dict[str, str], path: str = os.environ["PATH"]) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "CDNA2_NODELIST", "CDNA2_TARGET_PYTHON", "CDNA2_SLURM_TRANSPORT",
                                   "VIRTUAL_ENV", "CONDA_"))}
    return subprocess.run([str(PYINFRA), "inventory/slurm.py", "debug-inventory", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**base, "PATH": path, "HOME": "/home/alice", "USER": "alice", **environment})


def hosts_of(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("[")))


def validated(hosts: list[dict]) -> None:
    result = subprocess.run([sys.executable, "-m", "cdna2", "validate-data", "-"], cwd=REPO, text=True,
                            input=json.dumps(hosts), capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_allocations_nodes_are_reached_through_its_job_steps(slurm_conf: Path) -> None:
    hosts = hosts_of(inventory({"SLURM_CONF": str(slurm_conf), "SLURM_JOB_NODELIST": NODELIST, "SLURM_JOB_ID": "4711",
                                "SLURM_GPUS_PER_NODE": "mi250:8", "VIRTUAL_ENV": "/project/g1/venv-aiter",
                                "ROCM_PATH": "/opt/rocm-6.4.3"}))
    assert [host["name"] for host in hosts] == ["nid001007", "nid001011", "nid001012"]
    for host in hosts:
        assert sorted(host["groups"]) == ["@slurm", "slurm"]
        data = host["data"]
        assert {key: data.get(key) for key in ("slurm_node", "slurm_job", "slurm_gpus", "target_python", "rocm_root",
                                               "state_dir", "shared_environment", "ssh_user", "_sudo")} == {
            "slurm_node": host["name"], "slurm_job": "4711", "slurm_gpus": 8,
            "target_python": "/project/g1/venv-aiter/bin/python", "rocm_root": "/opt/rocm-6.4.3",
            "state_dir": f"/home/alice/.local/state/cdna2/nodes/{host['name']}", "shared_environment": True,
            "ssh_user": None, "_sudo": None}
    validated(hosts)


def test_over_ssh_the_nodes_get_the_data_of_a_login_without_root(slurm_conf: Path) -> None:
    hosts = hosts_of(inventory({"SLURM_CONF": str(slurm_conf), "CDNA2_SLURM_TRANSPORT": "ssh",
                                "SLURM_JOB_NODELIST": NODELIST, "VIRTUAL_ENV": "/project/g1/venv-aiter",
                                "ROCM_PATH": "/opt/rocm-6.4.3"}))
    assert [host["name"] for host in hosts] == ["nid001007", "nid001011", "nid001012"]
    for host in hosts:
        assert host["groups"] == ["slurm"]
        data = host["data"]
        assert {key: data.get(key) for key in ("ssh_user", "target_python", "rocm_root", "state_dir",
                                               "shared_environment", "ssh_strict_host_key_checking", "_sudo",
                                               "slurm_job")} == {
            "ssh_user": "alice", "target_python": "/project/g1/venv-aiter/bin/python", "rocm_root": "/opt/rocm-6.4.3",
            "state_dir": f"/home/alice/.local/state/cdna2/nodes/{host['name']}", "shared_environment": True,
            "ssh_strict_host_key_checking": "yes", "_sudo": None, "slurm_job": None}
    validated(hosts)


def test_a_nodelist_given_wins_over_the_allocations(slurm_conf: Path) -> None:
    result = inventory({"SLURM_CONF": str(slurm_conf), "SLURM_JOB_ID": "4711", "SLURM_JOB_NODELIST": "other[1-2]",
                        "CDNA2_NODELIST": NODELIST, "CDNA2_TARGET_PYTHON": "/scratch/alice/env/bin/python",
                        "XDG_STATE_HOME": "/scratch/alice/st"})
    hosts = hosts_of(result)
    assert [host["name"] for host in hosts] == ["nid001007", "nid001011", "nid001012"]
    assert hosts[0]["data"]["target_python"] == "/scratch/alice/env/bin/python"
    assert hosts[0]["data"]["state_dir"] == "/scratch/alice/st/cdna2/nodes/nid001007"


@pytest.mark.parametrize("environment, path, message", [
    ({}, None, "not inside a Slurm allocation: SLURM_JOB_NODELIST is not set. Run the deploy inside one"),
    ({"CDNA2_NODELIST": NODELIST}, None, "not inside a Slurm allocation: SLURM_JOB_ID is not set, and the Slurm "
                                         "connector reaches nodes through the allocation's job steps"),
    ({"SLURM_JOB_NODELIST": NODELIST}, "empty", "scontrol is not on PATH: it expands SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_NODELIST": "nid[7-"}, None,
     "scontrol show hostnames 'nid[7-' (from SLURM_JOB_NODELIST) gave names that are not host names: nid]"),
    ({"SLURM_JOB_NODELIST": NODELIST, "VIRTUAL_ENV": ""}, None, "no Python environment to provision: activate it"),
    ({"SLURM_JOB_NODELIST": NODELIST, "CDNA2_SLURM_TRANSPORT": "rsh"}, None,
     "CDNA2_SLURM_TRANSPORT='rsh': give slurm (job steps of the allocation, the default) or ssh"),
], ids=["outside an allocation", "nodes named outside an allocation", "no scontrol", "a bad nodelist",
        "no environment", "an unknown transport"])
def test_the_inventory_stops_with_what_to_do(slurm_conf: Path, tmp_path: Path, environment: dict, path: str | None,
                                              message: str) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    result = inventory({"SLURM_CONF": str(slurm_conf), "SLURM_JOB_ID": "4711", "VIRTUAL_ENV": "/project/g1/venv-aiter",
                        **({"SLURM_JOB_ID": ""} if "CDNA2_NODELIST" in environment else {}), **environment},
                       str(empty) if path == "empty" else os.environ["PATH"])
    assert result.returncode != 0
    assert message in result.stdout + result.stderr, result.stdout[-1500:] + result.stderr[-1500:]

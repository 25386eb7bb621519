"""Two lab hosts whose target environment is one directory: host b's /opt/venv is host a's, bind-mounted into b's
mount namespace (a stand-in for an NFS or Lustre environment every node mounts at the same path; each host keeps
its own sshd, state directory and GPU stand-in). Deploying such an environment as one (a single writer, the others
verifying) is not implemented yet; until it is, the first host of the run in inventory order provisions it (chosen
once every host has been probed, whatever order the probes came back in) and every other host seeing the same
directory is refused in preflight by name, so two hosts never write one environment at once. Rollback likewise
restores it once, from the first host.

The lab is two MI210 hosts of its own (a scratch subnet, under the cache's scratch-labs/), stopped at the end.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from lab import kinds, wheelhouse
from tests.lab.conftest import run_lab_command
from tests.lab.deploy_runner import host_snapshot, run_pyinfra

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SHARED_SUBNET = f"{kinds.LAB_NET}.70"


@pytest.fixture()
def two_hosts(monkeypatch: pytest.MonkeyPatch):
    lab_dir = wheelhouse.cache_root() / "scratch-labs" / f"shared-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("CDNA2_LAB_DIR", str(lab_dir))
    run_lab_command("up", "2", "--subnet", SHARED_SUBNET, lab_dir=lab_dir)
    try:
        yield json.loads((lab_dir / "lab.json").read_text())
    finally:
        run_lab_command("down", lab_dir=lab_dir, check=False)


def test_hosts_sharing_one_environment_are_provisioned_from_the_first_only(two_hosts: dict, tmp_path: Path) -> None:
    first, second = two_hosts["hosts"]
    assert (first["name"], second["name"]) == ("mi210-a", "mi210-b")
    in_second = ["nsenter", "-t", str(second["pid"]), "-m"]
    subprocess.run([*in_second, "mount", "--bind", first["binds"]["/opt/venv"], "/opt/venv"], check=True)
    second_state = Path(second["binds"]["/var/lib/cdna2"])
    try:
        deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
        assert deployed.returncode != 0, "a refused host fails the run"
        assert deployed.row("mi210-a")["outcome"] == "provisioned", deployed.row("mi210-a")
        refusal = deployed.row("mi210-b")["steps"]["preflight"]
        assert refusal["status"] == "failed" and refusal["detail"].startswith(
            "its Python environment /opt/venv is the directory host mi210-a provisions in this run (the same "
            "environment on a shared filesystem: fingerprint "), refusal
        assert "--limit mi210-a" in refusal["detail"]
        assert not any(second_state.iterdir()), "the refused host wrote nothing into its own state directory"

        rolled_back = run_pyinfra("-y", "rollback.py", report_dir=tmp_path)
        assert rolled_back.row("mi210-a")["steps"]["record"]["status"] == "ok", rolled_back.row("mi210-a")
        assert "is the directory host mi210-a provisions" in rolled_back.row("mi210-b")["steps"]["rollback"]["detail"]
    finally:
        subprocess.run([*in_second, "umount", "/opt/venv"], check=True)

    # Each with its own environment again (a mix of hosts in one run): both are provisioned.
    before = host_snapshot(second)
    again = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert again.returncode == 0, again.output[-4000:]
    assert {row["host"]: row["outcome"] for row in again.report["hosts"]} == {
        "mi210-a": "provisioned", "mi210-b": "provisioned"}
    assert host_snapshot(second)["hsa"] != before["hsa"]

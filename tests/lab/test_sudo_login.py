"""A host reached as an unprivileged user with passwordless sudo (``./lab/up --login sudo``), as the docs offer
real clusters: deploy, --dry, verify and rollback all run through sudo, and what they leave is root's. A login user
without sudo rights fails that host in preflight, by name, before anything on it changes.

The lab is one MI210 host of its own (a scratch subnet, under the cache's scratch-labs/), and ``./lab/down``
removes its login users again.
"""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from lab.logins import SUDOERS_DIR
from tests.lab.conftest import one_host_lab, run_lab_command
from tests.lab.deploy_runner import assert_redeploy_verify_rollback, host_snapshot, run_pyinfra

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture()
def sudo_lab(monkeypatch: pytest.MonkeyPatch):
    with one_host_lab("sudo", "--login", "sudo", monkeypatch=monkeypatch) as lab:
        yield lab


def owners_and_modes(root: Path) -> set[tuple[int, int]]:
    """(uid, gid) of everything under ``root``, itself included."""
    return {(path.stat().st_uid, path.stat().st_gid) for path in (root, *root.rglob("*"))}


def test_deploy_verify_rollback_through_sudo_and_a_login_without_sudo_is_refused(sudo_lab: dict,
                                                                                    tmp_path: Path) -> None:
    users = sudo_lab["ssh"]["users"]
    (lab_host,) = sudo_lab["hosts"]
    name = lab_host["name"]
    assert sudo_lab["ssh"]["user"] == users["sudo"] and pwd.getpwnam(users["sudo"]).pw_uid != 0
    state = Path(lab_host["binds"]["/var/lib/cdna2"])
    before = host_snapshot(lab_host)

    refused = run_pyinfra("-y", "deploy.py", "--data", f"ssh_user={users['unprivileged']}", report_dir=tmp_path)
    assert refused.returncode != 0
    preflight = refused.row(name)["steps"]["preflight"]
    assert preflight["status"] == "failed", refused.row(name)
    assert preflight["detail"] == (f"user {users['unprivileged']} may not run commands as root through sudo without a "
                                   f"password (sudo: a password is required): give {users['unprivileged']} "
                                   f"passwordless sudo (NOPASSWD) or log in as root")
    assert f"{name}: user {users['unprivileged']} may not run" in refused.output
    assert "sudo password:" not in refused.output, "pyinfra must not prompt for a password"
    assert host_snapshot(lab_host) == before, "the refused host changed"

    dry = run_pyinfra("deploy.py", "--dry", report_dir=tmp_path)
    assert dry.returncode == 0, dry.output[-4000:]
    assert dry.report["executed"] is False and dry.row(name)["steps"]["kernels"]["status"] == "planned"
    assert host_snapshot(lab_host) == before, "--dry changed the host"

    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert deployed.returncode == 0, deployed.output[-4000:]
    row = deployed.row(name)
    assert row["outcome"] == "provisioned" and row["steps"]["smoke"]["status"] == "ok", row
    assert deployed.report["summary"]["text"] == "1 host: 1 gfx90a provisioned, 0 failed"
    assert state.stat().st_mode & 0o777 == 0o700, oct(state.stat().st_mode)
    assert owners_and_modes(state) == {(0, 0)}, "everything in the state directory is root's"
    assert {"agent", "lease.json", "state.json", "backups"} <= {path.name for path in state.iterdir()}
    assert host_snapshot(lab_host)["hsa"] != before["hsa"], "the kernels were installed"

    assert_redeploy_verify_rollback(lab_host, tmp_path, before)

    run_lab_command("down", lab_dir=Path(sudo_lab["lab_dir"]))
    for user in users.values():
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
    assert not (SUDOERS_DIR / users["sudo"]).exists()

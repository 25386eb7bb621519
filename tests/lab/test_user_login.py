"""A host reached as a plain user with no root and no sudo (``./lab/up --login user``), as on an HPC cluster: that
user owns the Python environment and can only read the root-owned ROCm stand-in. Deploy, re-deploy with no change,
verify and rollback all work, the tool's state lives in the user's XDG state directory, and nothing is written
outside it and the environment: every file the user owns anywhere on the host's filesystem (as the host sees it)
is listed before and after, and the differences must all lie there. Where the user may not write what the deploy
must (a directory of root's in the environment, a read-only environment), the host fails in preflight, naming
the path and why, before anything on it changes.

The lab is one MI210 host of its own (a scratch subnet, under the cache's scratch-labs/), brought up as the
session's lab tests start (tests/lab/conftest.py: early_labs); ``./lab/down`` removes its login user again.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from tests.lab.conftest import early_lab, one_host_lab, run_lab_command, up_one_host
from tests.lab.deploy_runner import assert_redeploy_verify_rollback, host_snapshot, run_pyinfra, site_packages, ssh

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@early_lab("user_lab", "user")
def _user_lab_up(lab_dir: Path) -> dict:
    return up_one_host(lab_dir, "--login", "user")


@pytest.fixture()
def user_lab(monkeypatch: pytest.MonkeyPatch, early_labs: dict):
    with one_host_lab("user", monkeypatch=monkeypatch, early=early_labs["user_lab"]) as lab:
        yield lab


def owned_listing(lab_host: dict, uid: int) -> dict[str, str]:
    """Every path of the host's filesystem (root filesystem with the host's binds, /dev/shm, /run) owned by ``uid``,
    with its type, size and mtime: read as root inside the host's mount namespace. A user without CAP_CHOWN cannot
    give a file away, so whatever that user created or replaced anywhere is in this listing."""
    listing = subprocess.run(["nsenter", "-t", str(lab_host["pid"]), "-m", "find", "/", "/dev/shm", "/run", "-xdev",
                              "-user", str(uid), "-printf", r"%p\t%y %s %T@\n"],
                             capture_output=True, text=True, timeout=600)
    assert listing.returncode in (0, 1), listing.stderr[-2000:]  # 1: a file vanished under find (other users)
    return dict(line.split("\t", 1) for line in listing.stdout.splitlines())


def changed_paths(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def test_deploy_verify_rollback_as_a_user_without_root_or_sudo_writes_only_its_own_directories(
        user_lab: dict, tmp_path: Path) -> None:
    user = user_lab["ssh"]["user"]
    entry = pwd.getpwnam(user)
    (lab_host,) = user_lab["hosts"]
    name, host_dir = lab_host["name"], Path(lab_host["host_dir"])
    assert entry.pw_uid != 0 and user_lab["login"] == "user" and not user_lab["ssh"]["sudo"]
    who = ssh(user_lab, lab_host, "id -u; sudo -n true 2>&1; touch /opt/rocm/x 2>&1; stat -c %U /opt/venv")
    assert who.stdout.splitlines()[0] == str(entry.pw_uid)
    assert "a password is required" in who.stdout, "the user may not sudo"
    assert "Permission denied" in who.stdout, "ROCm is root's, read-only to the user"
    assert who.stdout.splitlines()[-1] == user, "the user owns the environment"
    state_dir = f"{entry.pw_dir}/.local/state/cdna2"  # as the host sees it (its own home, bound there)
    own = (f"{entry.pw_dir}/.local", "/opt/venv", f"{host_dir}/home/.local", f"{host_dir}/venv")
    before = owned_listing(lab_host, entry.pw_uid)
    snapshot = host_snapshot(lab_host)

    # A directory of root's in the environment: refused by path before anything changes.
    ops = site_packages(lab_host) / "aiter" / "ops"
    os.chown(ops, 0, 0)
    try:
        refused = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    finally:
        os.chown(ops, entry.pw_uid, entry.pw_gid)
    assert refused.returncode != 0
    detail = refused.row(name)["steps"]["preflight"]["detail"]
    on_host = f"/opt/venv/{ops.relative_to(host_dir / 'venv')}"
    assert detail.startswith(f"user {user} cannot write where the deploy must: {on_host}: not writable by {user}: "
                             f"owner root (foreign-owned), mode 755"), detail
    # A read-only environment (a read-only bind mount inside the host): every place named, nothing changed.
    namespace = ["nsenter", "-t", str(lab_host["pid"]), "-m"]
    subprocess.run([*namespace, "sh", "-c", "mount --bind /opt/venv /opt/venv && "
                                            "mount -o remount,bind,ro /opt/venv"], check=True)
    try:
        read_only = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    finally:
        subprocess.run([*namespace, "umount", "/opt/venv"], check=True)
    assert read_only.returncode != 0
    detail = read_only.row(name)["steps"]["preflight"]["detail"]
    assert "/opt/venv/bin: on a read-only filesystem" in detail and f"{on_host}: on a read-only filesystem" in detail, \
        detail
    assert f"{name}: user {user} cannot write where the deploy must" in read_only.output
    assert host_snapshot(lab_host) == snapshot, "a refused host changed"
    assert owned_listing(lab_host, entry.pw_uid) == before, "a refused host changed"

    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert deployed.returncode == 0, deployed.output[-4000:]
    row = deployed.row(name)
    assert row["outcome"] == "provisioned" and row["steps"]["smoke"]["status"] == "ok", row
    assert host_snapshot(lab_host)["hsa"] != snapshot["hsa"], "the kernels were installed"
    state = host_dir / "home" / ".local" / "state" / "cdna2"
    assert {"agent", "lease.json", "state.json", "backups"} <= {path.name for path in state.iterdir()}, \
        "the agent and the state are in the user's XDG state directory"
    assert not any(Path(lab_host["binds"]["/var/lib/cdna2"]).iterdir()), "nothing in root's /var/lib/cdna2"

    assert_redeploy_verify_rollback(lab_host, tmp_path, snapshot)

    after = owned_listing(lab_host, entry.pw_uid)
    changed = changed_paths(before, after)
    # The home (seen at both its paths) gained .local/, so its mtime moved; its type and size must not have.
    for home in (entry.pw_dir, f"{host_dir}/home"):
        assert before[home].split()[:2] == after[home].split()[:2], (before[home], after[home])
        changed.discard(home)
    outside = sorted(path for path in changed if not any(path == top or path.startswith(top + "/") for top in own))
    assert outside == [], f"written outside the environment and {state_dir}: {outside[:20]}"
    assert any(path.startswith("/opt/venv/") for path in changed), "the deploy wrote into the environment"
    assert any(path.startswith(state_dir) for path in changed), "and into the state directory"
    assert not any(Path(lab_host["binds"]["/tmp"]).iterdir()), "nothing left in the host's /tmp"

    run_lab_command("down", lab_dir=Path(user_lab["lab_dir"]))
    with pytest.raises(KeyError):
        pwd.getpwnam(user)

"""The controller installed without root, as docs/getting-started.md tells an HPC user to: a throwaway user of this
machine with a fresh home, no sudo and no apt, copies the repository, makes a venv, installs requirements.txt, then
previews a deploy of the simulated lab (--dry) from an inventory of its own with Debian's llvm-19 named by
ROCM_LLVM_BIN (standing in for an older ROCm's LLVM; the preview translates the hosts' gfx942 tree with it), then
translates the same tree with `python -m cdna2 translate` and the LLVM the search finds by itself (llvm-22, which the
lab uses). The two gfx90a trees must be byte-identical.

The user's pip reads the controller's wheels from a copy in its home (downloaded once, lab.wheelhouse), so the
install runs offline; the user is removed at the end.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import wheelhouse
from tests.lab.deploy_runner import REPO, host_snapshot

pytestmark = [pytest.mark.lab, pytest.mark.slow]

OLDER_LLVM = Path("/usr/lib/llvm-19/bin")  # bin/setup installs it


@pytest.fixture()
def throwaway_user():
    """A login of this machine with a fresh home, no sudo rights and no password; removed with its home after."""
    name = f"cdna2-ctl-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}"
    subprocess.run(["userdel", "--remove", name], capture_output=True)  # a leftover of a killed run
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", "--shell", "/bin/sh",
                    "--comment", f"cdna2 rootless controller test of {REPO}", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)


def as_user(user: pwd.struct_passwd, script: str, timeout: int = 900,
            **environment: str) -> subprocess.CompletedProcess:
    """``script`` run by ``sh`` as ``user`` with a login's bare environment (no variable of this test leaks in)."""
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **environment}
    return subprocess.run(["runuser", "-u", user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                           "sh", "-euc", script], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def give(user: pwd.struct_passwd, path: Path) -> None:
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(path)], check=True)


def copy_checkout(destination: Path) -> None:
    """The repository's files as a clone has them (tracked and new, not ignored: no .venv, no .lab)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for relative in filter(None, listed):
        source = REPO / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)


def own_inventory(lab: dict, home: Path) -> Path:
    """What an operator writes from inventory/lab.py: the lab's hosts with the key, known_hosts and wheel matrix
    copied to the user's home (the lab's own files are root's)."""
    from inventory.sim import _host_data  # the simulated lab's data per host, as its inventory gives it

    private = home / "lab-ssh"
    private.mkdir(mode=0o700)
    shutil.copy(lab["ssh"]["key"], private / "key")
    shutil.copy(lab["ssh"]["known_hosts"], private / "known_hosts")
    groups: dict[str, list] = {}
    for lab_host in lab["hosts"]:
        data = _host_data(lab, lab_host)
        matrix = private / "wheel-matrix.yaml"
        shutil.copy(data["wheel_matrix"], matrix)
        data.update(ssh_key=str(private / "key"), ssh_known_hosts_file=str(private / "known_hosts"),
                    wheel_matrix=str(matrix))
        groups.setdefault(lab_host["group"], []).append((lab_host["name"], data))
    inventory = home / "my-cluster.py"
    inventory.write_text("".join(f"{group} = {hosts!r}\n" for group, hosts in groups.items()))
    return inventory


def test_controller_installs_without_root_previews_the_lab_and_translates_with_an_older_llvm(lab, throwaway_user):
    user, home = throwaway_user, Path(throwaway_user.pw_dir)
    assert OLDER_LLVM.joinpath("llvm-mc").exists(), "bin/setup installs llvm-19"
    refused = as_user(user, "sudo -n true")
    assert refused.returncode != 0, "the throwaway user must have no sudo"

    clone = home / "cdna2-provision"
    copy_checkout(clone)
    shutil.copytree(wheelhouse.controller_wheels(REPO / "requirements.txt"), home / "wheels")
    source = home / "gfx942"
    shutil.copytree(wheelhouse.installed_tree(wheelhouse.AITER) / "aiter_meta/hsa/gfx942", source)
    inventory = own_inventory(lab, home)
    give(user, home)

    # The documented install, word for word; pip takes the wheels from the copy in the home (offline).
    install = as_user(user, "cd ~/cdna2-provision && python3 -m venv .venv && "
                            ".venv/bin/pip install -q -r requirements.txt",
                      PIP_NO_INDEX="1", PIP_FIND_LINKS=str(home / "wheels"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    assert install.returncode == 0, install.stderr[-3000:]

    before = {lab_host["name"]: host_snapshot(lab_host) for lab_host in lab["hosts"]}
    dry = as_user(user, f"cd ~/cdna2-provision && .venv/bin/pyinfra {inventory} deploy.py --dry",
                  ROCM_LLVM_BIN=str(OLDER_LLVM), PYINFRA_PROGRESS="off")
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-4000:]
    assert {lab_host["name"]: host_snapshot(lab_host) for lab_host in lab["hosts"]} == before, "--dry changed a host"
    report = json.loads((clone / "reports" / "latest.json").read_text())
    assert report["executed"] is False and report["failed_hosts"] == []
    assert sorted(row["host"] for row in report["hosts"]) == sorted(h["name"] for h in lab["hosts"])
    # The preview translated the hosts' tree (amd-aiter 0.1.7.post2.dev18's, as the wheelhouse's) in the user's own
    # fresh cache, with the LLVM ROCM_LLVM_BIN named: that translation is the llvm-19 side of the comparison.
    (entry,) = (home / ".cache/cdna2/kernels/engine").iterdir()
    assert "translating gfx942 tree" in dry.stdout + dry.stderr
    assert json.loads((entry / "report.json").read_text())["llvm"]["bin_dir"] == str(OLDER_LLVM)
    older = entry / "tree"

    # The core's own command, with the LLVM the search finds by itself.
    found = as_user(user, "cd ~/cdna2-provision && .venv/bin/python -m cdna2 translate ~/gfx942 ~/found "
                          "--report ~/found.json --cache ~/cache-found")
    assert found.returncode == 0, found.stderr[-3000:]
    llvm = json.loads((home / "found.json").read_text())["llvm"]
    assert llvm["bin_dir"] == "/usr/lib/llvm-22/bin", "the search takes the newest distribution LLVM"

    files = sorted(p.relative_to(home / "found") for p in (home / "found").rglob("*") if p.is_file())
    assert len([f for f in files if f.suffix == ".co"]) == 178, "amd-aiter 0.1.7.post2.dev18: 178 kernels translate"
    assert files == sorted(p.relative_to(older) for p in older.rglob("*") if p.is_file())
    differing = [str(f) for f in files if not filecmp.cmp(home / "found" / f, older / f, shallow=False)]
    assert differing == [], f"llvm-19 and llvm-22 translate these files differently: {differing}"

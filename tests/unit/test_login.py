"""Where an unprivileged login keeps the tool's state, and how the probe finds the places it may not write.

The probe runs as it does on a host: a fresh interpreter, JSON on stdout, here as the unprivileged user ``nobody``
(``setpriv``) over a fixture environment that user owns. A read-only environment is a real read-only bind mount,
made in a mount namespace of the probe's own (``unshare -m``), so nothing on this machine is remounted.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cdna2.host import environment, probe
from cdna2.login import expected_state_dir, write_access_refusal
from tests.unit.test_probe import PROBE_ARGV, write_distribution

NOBODY = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to run the probe as another user")


def test_the_default_state_dir_is_roots_or_the_logins_xdg_state_dir() -> None:
    assert environment.default_state_dir(0, {"HOME": "/root"}) == ("/var/lib/cdna2", "the default for root")
    path, source = environment.default_state_dir(NOBODY.pw_uid, {"HOME": "/home/u", "XDG_STATE_HOME": "/scratch/u/st"})
    assert (path, source) == ("/scratch/u/st/cdna2", "$XDG_STATE_HOME of nobody")
    # The XDG spec: a relative XDG_STATE_HOME is invalid and ignored.
    assert environment.default_state_dir(NOBODY.pw_uid, {"HOME": "/home/u", "XDG_STATE_HOME": "st"})[0] == \
        "/home/u/.local/state/cdna2"
    assert environment.default_state_dir(NOBODY.pw_uid, {})[0] == f"{NOBODY.pw_dir}/.local/state/cdna2", \
        "without HOME the home comes from the password database"


def test_the_controller_expects_roots_state_dir_only_for_root_or_sudo_logins() -> None:
    assert expected_state_dir("/srv/cdna2", "alice", False, None) == "/srv/cdna2", "host data wins"
    assert expected_state_dir(None, "root", False, None) == "/var/lib/cdna2"
    assert expected_state_dir(None, "deploy", True, None) == "/var/lib/cdna2", "through sudo the probe is root"
    assert expected_state_dir(None, "alice", False, None) is None, "only the host knows alice's home"
    assert expected_state_dir(None, "alice", False, "/home/alice/.local/state/cdna2") == \
        "/home/alice/.local/state/cdna2", "the last probe's answer"


@pytest.fixture
def user_env():
    """A fixture environment owned by ``nobody`` in a directory ``nobody`` can reach (pytest's tmp_path is root's
    alone): site-packages with amd-aiter and triton, a bin/, a home."""
    root = Path(tempfile.mkdtemp(prefix="cdna2-login-", dir="/tmp"))
    root.chmod(0o755)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "env")], check=True)
    site = next((root / "env" / "lib").glob("python3*/site-packages"))
    write_distribution(site, "amd-aiter", "0.1.7.post2.dev18", {
        "aiter/__init__.py": b"",
        "aiter/ops/attention.py": b"GATE = 'gfx942'\n",
        "aiter_meta/hsa/gfx942/pa/pa_a.co": b"\x7fELF-a",
    })
    write_distribution(site, "triton", "3.7.0", {"triton/__init__.py": b""})
    (root / "home").mkdir()
    (root / "rocm").mkdir()
    subprocess.run(["chown", "-R", f"{NOBODY.pw_uid}:{NOBODY.pw_gid}", str(root / "env"), str(root / "home")],
                   check=True)
    yield root
    shutil.rmtree(root)


def site_packages(root: Path) -> Path:
    return next((root / "env" / "lib").glob("python3*/site-packages"))


def probe_as_nobody(root: Path, read_only: Path | None = None, **overrides) -> dict:
    """The probe as ``nobody`` (HOME in the fixture), with ``read_only`` bound read-only in a namespace of its own."""
    python = str(root / "env" / "bin" / "python")
    options = {"target_python": python, "rocm_root": str(root / "rocm"), "state_dir": None,
               "kfd_topology": str(root / "kfd"), "patch_files": {"amd-aiter": ["aiter/ops/attention.py"]},
               **overrides}
    env = {"PATH": os.environ["PATH"], "HOME": str(root / "home")}
    as_nobody = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                 python, *PROBE_ARGV, json.dumps(options)]
    if read_only is not None:
        as_nobody = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                     'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"', "sh",
                     str(read_only), *as_nobody]
    result = subprocess.run(as_nobody, capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


@needs_root
def test_an_unprivileged_login_owning_its_environment_may_write_everywhere_it_must(user_env: Path) -> None:
    found = probe_as_nobody(user_env)
    assert found["login"] == {"user": "nobody", "uid": NOBODY.pw_uid}
    assert found["state_dir"] == {"path": f"{user_env}/home/.local/state/cdna2",
                                  "source": "the XDG state directory of nobody (~/.local/state)"}
    assert found["write_access"] == [], found["write_access"]
    assert write_access_refusal(found) is None
    assert not (user_env / "home" / ".local").exists(), "the probe creates nothing"


@needs_root
def test_a_foreign_owned_package_directory_is_named_with_its_owner_and_mode(user_env: Path) -> None:
    ops = site_packages(user_env) / "aiter" / "ops"
    os.chown(ops, 0, 0)
    ops.chmod(0o755)
    found = probe_as_nobody(user_env)
    assert found["write_access"] == [{"path": str(ops), "why": f"{ops}: not writable by nobody: owner root "
                                                               f"(foreign-owned), mode 755"}]
    refusal = write_access_refusal(found)
    assert refusal.startswith(f"user nobody cannot write where the deploy must: {ops}: not writable by nobody"), refusal


@needs_root
def test_a_state_dir_the_login_cannot_create_is_named_at_its_nearest_existing_parent(user_env: Path) -> None:
    found = probe_as_nobody(user_env, state_dir="/var/lib/cdna2-of-nobody/state")
    assert found["state_dir"] == {"path": "/var/lib/cdna2-of-nobody/state", "source": "host data"}
    assert [problem["path"] for problem in found["write_access"]] == ["/var/lib"], found["write_access"]


@needs_root
def test_a_foreign_owned_file_in_a_sticky_directory_is_named(user_env: Path) -> None:
    ops = site_packages(user_env) / "aiter" / "ops"
    os.chown(ops, 0, 0)
    ops.chmod(0o1777)  # like /tmp: anyone may add files, only a file's (or the directory's) owner replace it
    os.chown(ops / "attention.py", 0, 0)
    found = probe_as_nobody(user_env)
    assert found["write_access"] == [{"path": str(ops / "attention.py"), "why": (
        f"{ops / 'attention.py'}: foreign-owned (uid 0) in the sticky directory {ops}: nobody may not replace it")}]


@needs_root
def test_a_read_only_environment_is_named_by_every_place_the_run_writes(user_env: Path) -> None:
    env = user_env / "env"
    found = probe_as_nobody(user_env, read_only=env)
    whys = {problem["why"] for problem in found["write_access"]}
    assert f"{env}/bin: on a read-only filesystem" in whys, whys
    assert f"{site_packages(user_env)}: on a read-only filesystem" in whys, whys
    assert f"{site_packages(user_env)}/aiter/ops: on a read-only filesystem" in whys, whys
    assert all(why.endswith("on a read-only filesystem") for why in whys), whys


def test_an_environment_has_one_fingerprint_at_every_path_it_is_seen_and_a_copy_another(tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "lib").mkdir(parents=True)
    copy = tmp_path / "copy"
    shutil.copytree(env, copy)
    link = tmp_path / "link"
    link.symlink_to(env)  # the same directory under another name, as a second mount of it would be
    assert environment.environment_fingerprint(str(env)) == environment.environment_fingerprint(str(link)) is not None
    assert environment.environment_fingerprint(str(copy)) != environment.environment_fingerprint(str(env))
    assert environment.environment_fingerprint(str(tmp_path / "absent")) is None


def test_the_first_host_in_inventory_order_claims_an_environment_whatever_order_the_probes_came_in() -> None:
    import gevent
    from pyinfra.api import Config, Inventory, State

    from cdna2.shared_environments import shared_environment_refusal
    from operations.preflight import environment_claimed_by, probe_announced

    inventory = Inventory((["node1", "node2", "node3", "node4"], {}))
    State(inventory, Config())
    shared = {"python": {"prefix": "/project/venv", "fingerprint": "12:34:56"}}
    own = {"python": {"prefix": "/project/venv", "fingerprint": "78:90:12"}}

    def probe_taking(seconds: float, found: dict | None) -> dict:
        gevent.sleep(seconds)  # the SSH round trip: node3's probe comes back first, node1's last
        if found is None:
            raise RuntimeError("connection lost")
        return found

    def deploy(name: str, delay: float, found: dict | None) -> str | None:
        try:
            probe_announced(inventory, name, lambda: probe_taking(delay, found))
        except RuntimeError:
            return "probe failed"
        return environment_claimed_by(inventory, name)

    # Spawned together, as pyinfra loads the deploy file for every host at once (its default parallelism).
    runs = [gevent.spawn(deploy, "node1", 0.05, shared), gevent.spawn(deploy, "node2", 0.02, own),
            gevent.spawn(deploy, "node3", 0.0, shared), gevent.spawn(deploy, "node4", 0.03, None)]
    gevent.joinall(runs, timeout=10, raise_error=True)
    assert [run.value for run in runs] == [None, None, "node1", "probe failed"], \
        "node1 writes (first in inventory order), node2 has its own, node3 is refused; a failed probe blocks nobody"
    refusal = shared_environment_refusal(shared, "node1", deployed_as_one=False)
    assert refusal.startswith("its Python environment /project/venv is the directory host node1 provisions in this "
                              "run (the same environment on a shared filesystem: fingerprint 12:34:56); set "
                              "shared_environment: true for every host that mounts it"), refusal
    assert "--limit node1" in refusal and shared_environment_refusal(shared, None, deployed_as_one=False) is None
    assert shared_environment_refusal(shared, "node1", deployed_as_one=True) is None


def test_the_fetch_names_the_directories_it_creates_outermost_first(tmp_path: Path) -> None:
    from operations.kernels import MISSING_DIRECTORIES

    (tmp_path / "home").mkdir()
    staging = tmp_path / "home" / ".local" / "state" / "cdna2" / "staging"
    made = subprocess.run(["sh", "-c", MISSING_DIRECTORIES, "sh", str(staging)], capture_output=True, text=True,
                          check=True).stdout
    assert made.split("\n")[0].removeprefix("missing:").split() == [
        str(tmp_path / "home" / ".local"), str(tmp_path / "home" / ".local" / "state"),
        str(tmp_path / "home" / ".local" / "state" / "cdna2"), str(staging)], made
    assert staging.is_dir()
    again = subprocess.run(["sh", "-c", MISSING_DIRECTORIES, "sh", str(staging)], capture_output=True, text=True,
                           check=True).stdout
    assert again == "missing:\n", "nothing to remove afterwards when everything was there"


def test_the_filesystem_type_is_that_of_the_longest_mount_point_above(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:52 / /project rw,relatime shared:20 - nfs4 fs1:/project rw,vers=4.2\n"
        "41 40 0:53 / /project/scratch rw shared:21 - lustre 10.0.0.1@o2ib:/scratch rw,flock\n")
    assert environment.filesystem_type("/project/g1/venv", str(mountinfo)) == "nfs4"
    assert environment.filesystem_type("/project/scratch/alice/env", str(mountinfo)) == "lustre"
    assert environment.filesystem_type("/projectx/venv", str(mountinfo)) == "ext4", "a prefix of the name is no mount"
    assert environment.filesystem_type("/opt/venv", str(tmp_path / "absent")) is None


def test_with_one_host_loaded_at_a_time_the_first_to_decide_keeps_the_environment() -> None:
    """``--parallel 1``: pyinfra loads the deploy file host after host; a host must not wait for the others (they
    cannot start before it ends), and the one chosen stays chosen."""
    from pyinfra.api import Config, Inventory, State

    from operations.preflight import environment_claimed_by, probe_announced

    inventory = Inventory((["node1", "node2", "node3"], {}))
    State(inventory, Config())
    shared = {"python": {"prefix": "/project/venv", "fingerprint": "12:34:56"}}
    decided = {}
    for name in ("node2", "node1", "node3"):  # pyinfra spawns from a set: any order
        probe_announced(inventory, name, lambda: shared)
        decided[name] = environment_claimed_by(inventory, name)
    assert decided == {"node2": None, "node1": "node2", "node3": "node2"}

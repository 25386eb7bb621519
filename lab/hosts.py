"""Building and starting one lab host: its directory (ROCm stand-in, venv copy, state, /tmp, .bashrc), its sshd
config and host key, and its sshd in a mount and UTS namespace of its own, started and awaited.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from lab import develop, kinds, venvs, wheelhouse
from lab.labstate import HOST_BINDS, LabPaths, progress, write_atomically

SSHD = "/usr/sbin/sshd"
# Files of a host that are its own, bound over this machine's file when it has one. sshd runs every command through
# root's bash, which reads ~/.bashrc when started by sshd: this machine's (a developer's: pyenv and cargo set-up,
# ~0.15 CPU-s per command) would run on every simulated host. Each host gets Debian's stock root one instead.
HOST_FILE_BINDS = {"/root/.bashrc": "root.bashrc"}
HOST_BASHRC = """# ~/.bashrc of a simulated lab host (written by lab/hosts.py): like Debian's stock root
# .bashrc, it sets nothing for the non-interactive shells sshd starts. This machine's own
# /root/.bashrc is not read on lab hosts.
"""
# Where a --login user lab's hosts see the lab mirror's wheels: a hard-linked copy of them bound there read-only,
# since the mirror itself lies below root's home (the cache), which that user cannot enter.
USER_WHEELS = "/opt/cdna2-wheels"
START_TIMEOUT_S = 15.0
# Runs inside the host's new namespaces: name it, bind its own directories, become its sshd (same pid, via exec).
HOST_ENTRY_SCRIPT = """set -eu
hostname "$1"
shift
config="$1"; log="$2"
shift 2
while [ "$#" -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done
exec /usr/sbin/sshd -D -f "$config" -E "$log"
"""


def _ssh_keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def ensure_client_key(paths: LabPaths) -> None:
    _ssh_keygen(paths.client_key, "cdna2-lab-client")
    public_key = paths.client_key.with_suffix(".pub").read_text()
    write_atomically(paths.authorized_keys, public_key, 0o600)


def ensure_controller_paths() -> None:
    """sshd's privilege-separation directory, and mount points for the hosts' binds (never removed: another lab's hosts may still be bound there)."""
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    for mount_point in (*HOST_BINDS, USER_WHEELS):
        Path(mount_point).mkdir(parents=True, exist_ok=True)


def _host_key(paths: LabPaths, name: str) -> Path:
    return paths.host_dir(name) / "ssh_host_ed25519_key"


def sshd_config_text(paths: LabPaths, planned: kinds.PlannedHost) -> str:
    return "\n".join([
        f"# sshd of simulated lab host {planned.name} (written by lab/hosts.py)",
        f"ListenAddress {planned.address}:{kinds.PORT}",
        f"HostKey {_host_key(paths, planned.name)}",
        # Root's key file is the lab's; a login user's is in its home (sshd reads it with that user's rights).
        f"AuthorizedKeysFile {paths.authorized_keys} /home/%u/.ssh/authorized_keys",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the key files live under .lab/, not in a home directory sshd would check
        "PidFile none",  # with -D the pid the lab records is sshd's own
        "Subsystem sftp internal-sftp",  # pyinfra uploads files over SFTP
        "",
    ])


def _write_rocm_stand_in(rocm_dir: Path, kind: kinds.Kind) -> None:
    (rocm_dir / ".info").mkdir(parents=True, exist_ok=True)
    (rocm_dir / "bin").mkdir(parents=True, exist_ok=True)
    write_atomically(rocm_dir / ".info" / "version", kinds.rocm_version_file(kind))
    write_atomically(rocm_dir / "STAND-IN", kinds.STAND_IN_NOTE + "\n")
    write_atomically(rocm_dir / "bin" / "rocminfo", kinds.rocminfo_script(kind), 0o755)


def prepare_host_dir(paths: LabPaths, planned: kinds.PlannedHost, login_user: str | None = None,
                     shared_venv: Path | None = None) -> None:
    """Create what a host needs that is missing; a restarted host keeps its venv, state and /tmp. With
    ``login_user`` (a --login user lab) the venv is a real copy that user owns, and the host has a home of its own
    for that user (bound over /home/<user>) holding the lab's key."""
    host_dir = paths.host_dir(planned.name)
    host_dir.mkdir(parents=True, exist_ok=True)
    _ssh_keygen(_host_key(paths, planned.name), f"cdna2-lab-host-{planned.name}")
    rocm_dir = host_dir / "rocm"
    if not (rocm_dir / ".info" / "version").exists():
        _write_rocm_stand_in(rocm_dir, planned.kind)
    (host_dir / "state").mkdir(exist_ok=True)
    (host_dir / "tmp").mkdir(exist_ok=True)
    (host_dir / "tmp").chmod(0o1777)
    write_atomically(host_dir / HOST_FILE_BINDS["/root/.bashrc"], HOST_BASHRC)
    owner = None
    if login_user is not None:
        entry = pwd.getpwnam(login_user)
        owner = (entry.pw_uid, entry.pw_gid)
        _user_home(paths, host_dir / "home", owner)
    if shared_venv is None or shared_venv == host_dir / "venv":  # the shared one is provisioned once, by its first host
        venvs.provision_host_venv(planned.kind, host_dir / "venv", progress, owner=owner)
    if planned.kind.aiter_checkout:
        develop.install_checkout(planned.kind, host_dir, progress)
    write_atomically(host_dir / "sshd_config", sshd_config_text(paths, planned))


def _user_home(paths: LabPaths, home: Path, owner: tuple[int, int]) -> None:
    """A host's own home for the --login user lab's user: .ssh/authorized_keys with the lab's key, all theirs."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o755)
    write_atomically(ssh_dir / "authorized_keys", paths.client_key.with_suffix(".pub").read_text(), 0o600)
    for path in (home, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, *owner)


def user_wheels(paths: LabPaths) -> Path:
    """A hard-linked copy of the lab mirror's wheels (the mirror's entries are symlinks into root's cache), for
    the hosts of a --login user lab to read at USER_WHEELS. Made once per lab."""
    copy = paths.root / "user-wheels"
    if not copy.is_dir():
        staging = paths.root / "user-wheels.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for wheel in sorted((paths.mirror / "wheels").iterdir()):
            os.link(wheel.resolve(), staging / wheel.name)
        staging.chmod(0o755)
        staging.rename(copy)
    return copy


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _wait_listening(process: subprocess.Popen, planned: kinds.PlannedHost, host_dir: Path, log_offset: int) -> None:
    """Wait for this sshd's own "Server listening" line (a TCP probe could reach a stray sshd on the address)."""
    sshd_log = host_dir / "sshd.log"
    ready_line = f"Server listening on {planned.address} port {kinds.PORT}."
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logs = "".join(f"\n--- {log}:\n{log.read_text()[-2000:]}"
                           for log in (host_dir / "start.log", sshd_log) if log.exists())
            raise RuntimeError(f"{planned.name}: sshd exited with {process.returncode} while starting on "
                               f"{planned.address}:{kinds.PORT}{logs}")
        if sshd_log.exists() and ready_line.encode() in sshd_log.read_bytes()[log_offset:]:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{planned.name}: sshd (pid {process.pid}) not listening on {planned.address}:{kinds.PORT} "
                       f"after {START_TIMEOUT_S:.0f} s; see {sshd_log}")


def host_binds(host_dir: Path) -> dict[str, str]:
    """Host path -> the lab file or directory bound over it (a file bind only where this machine has the file)."""
    file_binds = {path: name for path, name in HOST_FILE_BINDS.items() if Path(path).is_file()}
    return {mount_point: str(host_dir / name) for mount_point, name in {**HOST_BINDS, **file_binds}.items()}


def start_host(paths: LabPaths, planned: kinds.PlannedHost, login_user: str | None = None,
               shared_venv: Path | None = None, runtime_binds: dict[str, str] | None = None) -> dict:
    host_dir = paths.host_dir(planned.name)
    # ./lab/up --sif-runtime: the stand-in on PATH and the checkout that runs it, bound first: a checkout under /tmp
    # is out of sight once the host's own /tmp is bound
    binds = {**(runtime_binds or {}), **host_binds(host_dir)}
    if shared_venv is not None:  # one directory bound at /opt/venv in every sharing host's mount namespace
        binds[venvs.VENV_MOUNT] = str(shared_venv)
    if login_user is not None:  # a --login user lab: the user's home is the host's own, the wheels readable
        binds[pwd.getpwnam(login_user).pw_dir] = str(host_dir / "home")
        binds[USER_WHEELS] = str(user_wheels(paths))
    argv = ["unshare", "-m", "-u", "--propagation", "private", "--", "sh", "-c", HOST_ENTRY_SCRIPT, "sh",
            planned.name, str(host_dir / "sshd_config"), str(host_dir / "sshd.log"),
            *(arg for mount_point, source in binds.items() for arg in (source, mount_point))]
    log_offset = _log_size(host_dir / "sshd.log")  # sshd -E appends: only lines after this are this start's
    with open(host_dir / "start.log", "w") as start_log:
        # A session of its own, so the host outlives `./lab/up` and whatever shell started it.
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=start_log, stderr=start_log,
                                   start_new_session=True)
    _wait_listening(process, planned, host_dir, log_offset)
    return {
        "name": planned.name,
        "index": planned.index,
        "kind": planned.kind.key,
        "group": planned.kind.group,
        "address": planned.address,
        "port": kinds.PORT,
        "arch": planned.kind.gpu.arch,
        "gpu": planned.kind.gpu.marketing_name,
        "gpu_count": len(planned.kind.gpu.bdfids),
        "rocm_version": planned.kind.rocm_version,
        "python_env": venvs.VENV_MOUNT,
        "shared_environment": shared_venv is not None,
        "packages": ([f"amd-aiter {planned.kind.aiter_checkout} (develop checkout)",
                      *(p for p in planned.kind.packages if p != wheelhouse.AITER)]
                     if planned.kind.aiter_checkout else list(planned.kind.packages)),
        "aiter_checkout": str(host_dir / develop.CHECKOUT_DIR) if planned.kind.aiter_checkout else None,
        "pid": process.pid,
        "host_dir": str(host_dir),
        "sshd_config": str(host_dir / "sshd_config"),
        "sshd_log": str(host_dir / "sshd.log"),
        "host_key_pub": _host_key(paths, planned.name).with_suffix(".pub").read_text().strip(),
        "binds": binds,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def known_hosts_text(lab: dict) -> str:
    # paramiko and OpenSSH both look up a non-22 port as "[address]:port".
    return "".join(f"[{host['address']}]:{host['port']} {host['host_key_pub']}\n" for host in lab["hosts"])

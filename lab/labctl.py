"""Control the simulated MI210 lab: real sshd hosts on loopback, each in its own mount and UTS namespace.

``./lab/up [N]``, ``./lab/down`` and ``./lab/status`` are thin wrappers over ``python -m lab.labctl``. The lab's
state lives in ``<repo>/.lab/`` (or ``$CDNA2_LAB_DIR``); ``lab.json`` there is the contract with
``inventory/sim.py`` and the tests (fields documented in lab/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cdna2.host.state import write_file_atomically
from lab import develop, kinds, mirror, venvs, wheelhouse

REPO = Path(__file__).resolve().parent.parent
LAB_FORMAT = 1
SSHD = "/usr/sbin/sshd"
# Paths of a host that are its own (bind-mounted from its directory under .lab/hosts/<name>/), by host path.
HOST_BINDS = {"/opt/rocm": "rocm", "/opt/venv": "venv", "/var/lib/cdna2": "state", "/tmp": "tmp"}
# Files of a host that are its own, bound over this machine's file when it has one. sshd runs every command through
# root's bash, which reads ~/.bashrc when started by sshd: this machine's (a developer's: pyenv and cargo set-up,
# ~0.15 CPU-s per command) would run on every simulated host. Each host gets Debian's stock root one instead.
HOST_FILE_BINDS = {"/root/.bashrc": "root.bashrc"}
HOST_BASHRC = """# ~/.bashrc of a simulated lab host (written by lab/labctl.py): like Debian's stock root
# .bashrc, it sets nothing for the non-interactive shells sshd starts. This machine's own
# /root/.bashrc is not read on lab hosts.
"""
# A lab started with --login sudo is reached as an unprivileged user who may sudo without a password, as the README
# offers real clusters; a second user, without sudo rights, is there to be refused. A lab started with --login user
# is reached as a plain user with neither root nor sudo, as on an HPC cluster: it owns each host's /opt/venv and
# its home (its own per host), and can only read the root-owned ROCm stand-in. All are this machine's users (the
# hosts share its /etc), named after the lab directory so that labs side by side have their own.
LOGINS = ("root", "sudo", "user")
# Where a --login user lab's hosts see the lab mirror's wheels: a hard-linked copy of them bound there read-only,
# since the mirror itself lies below root's home (the cache), which that user cannot enter.
USER_WHEELS = "/opt/cdna2-wheels"
SUDOERS_DIR = Path("/etc/sudoers.d")
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
SSH_TIMEOUT_S = 10

# Runs inside the host's new namespaces: name it, bind its own directories, become its sshd (same pid, via exec).
HOST_ENTRY_SCRIPT = """set -eu
hostname "$1"
shift
config="$1"; log="$2"
shift 2
while [ "$#" -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done
exec /usr/sbin/sshd -D -f "$config" -E "$log"
"""

# What `status` asks each host over SSH: a fixed script, no interpolated values.
PROBE_SCRIPT = r"""printf 'hostname=%s\n' "$(hostname)"
printf 'rocm_version=%s\n' "$(cat /opt/rocm/.info/version)"
printf 'arch=%s\n' "$(/opt/rocm/bin/rocminfo | sed -n 's/^  Name: *\(gfx[0-9a-z]*\).*/\1/p' | head -n 1)"
/opt/venv/bin/python - <<'PROBE_END'
import importlib.metadata as metadata
import sys
print("python=" + sys.version.split()[0])
print("python_prefix=" + sys.prefix)
for name in ("amd-aiter", "triton", "vllm"):
    try:
        print(f"package:{name}=" + metadata.version(name))
    except metadata.PackageNotFoundError:
        pass
PROBE_END
"""


def progress(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


# --- state files --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabPaths:
    root: Path

    @classmethod
    def default(cls) -> LabPaths:
        if os.environ.get("CDNA2_LAB_DIR"):
            return cls(Path(os.environ["CDNA2_LAB_DIR"]).resolve())
        in_repo = (REPO / ".lab").resolve()
        if any(in_repo.is_relative_to(mount_point) for mount_point in HOST_BINDS):
            # A checkout under /tmp (say, a CI clone) cannot hold the lab: each host replaces /tmp with its own.
            return cls(wheelhouse.cache_root() / "labs" / hashlib.sha256(str(REPO).encode()).hexdigest()[:16])
        return cls(in_repo)

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def client_key(self) -> Path:
        return self.root / "ssh" / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "ssh" / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.root / "ssh" / "known_hosts"

    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    @property
    def mirror(self) -> Path:
        """The lab's package mirror (lab/mirror.py): the wheels and wheel matrix the lab hosts install from."""
        return self.root / "mirror"


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    write_file_atomically(path, text.encode("utf-8"), mode)


def load_lab(paths: LabPaths) -> dict | None:
    if not paths.state_file.exists():
        return None
    lab = json.loads(paths.state_file.read_text())
    if lab.get("format") != LAB_FORMAT:
        raise SystemExit(f"{paths.state_file} has format {lab.get('format')!r}, this labctl reads {LAB_FORMAT}; "
                         f"stop that lab with the labctl that started it, or remove {paths.root} once no host runs")
    return lab


def save_lab(paths: LabPaths, lab: dict) -> None:
    write_atomically(paths.state_file, json.dumps(lab, indent=2) + "\n")


@contextmanager
def lab_locked(paths: LabPaths) -> Iterator[None]:
    """Serialise up/down on one lab; the lock lives outside the lab directory because `down` removes that."""
    with wheelhouse.cache_lock(f"lab-{hashlib.sha256(str(paths.root).encode()).hexdigest()[:12]}"):
        yield


# --- processes ----------------------------------------------------------------------------------------------------

def process_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_lab_sshd(pid: int, sshd_config: str) -> bool:
    """True if pid is alive and is the sshd started with this host's config (not a recycled pid)."""
    try:
        executable = os.readlink(f"/proc/{pid}/exe")
        # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CONFIG ... [listener]"), so match words, not argv[0].
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return executable == SSHD and f" -f {sshd_config} " in f" {title} " and process_state(pid) not in (None, "Z")


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Processes below pid: a host's SSH sessions and whatever they run."""
    children = _children_by_parent()
    found, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children.get(child, []))
    return found


def namespace_processes(pid: int) -> list[int]:
    """Processes other than ``pid`` in its mount namespace: a host's SSH sessions and whatever they run, including
    what a dropped connection left behind (its sshd process exits, and the commands it started are reparented away
    from the host's sshd, so ``descendants`` no longer finds them, but they stay in the host's namespace)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != pid:
            try:
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    found.append(int(entry.name))
            except OSError:  # exited meanwhile, or not ours to read
                continue
    return found


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until pid has exited, reaping it when it is our child."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return True
        except ChildProcessError:
            # Started by an earlier `./lab/up` process, long gone: the host was re-parented to init, which reaps
            # it on its own schedule (seconds, on this machine), so an exited zombie counts as stopped.
            if process_state(pid) in (None, "Z"):
                return True
        time.sleep(0.05)
    return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def stop_host(host: dict) -> str:
    """Stop one host's sshd (by its recorded pid) and its sessions. Returns what happened, for the report."""
    pid = host["pid"]
    if not is_lab_sshd(pid, host["sshd_config"]):
        if process_state(pid) in (None, "Z"):
            return "not running"
        return f"pid {pid} is no longer this host's sshd; left alone"
    sessions = namespace_processes(pid)  # also what a dropped connection left running
    _signal(pid, signal.SIGTERM)  # first the listener, so no new session starts
    for session in sessions:
        _signal(session, signal.SIGTERM)
    for target in (pid, *sessions):
        if not wait_gone(target, STOP_TIMEOUT_S):
            _signal(target, signal.SIGKILL)
            if not wait_gone(target, STOP_TIMEOUT_S):
                raise RuntimeError(f"{host['name']}: pid {target} survived SIGKILL")
    return f"stopped pid {pid}" + (f" and {len(sessions)} session process(es)" if sessions else "")


# --- building a host ----------------------------------------------------------------------------------------------

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
    """sshd's privilege-separation directory, and mount points for the hosts' binds (never removed: lab-notes)."""
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    for mount_point in (*HOST_BINDS, USER_WHEELS):
        Path(mount_point).mkdir(parents=True, exist_ok=True)


def _host_key(paths: LabPaths, name: str) -> Path:
    return paths.host_dir(name) / "ssh_host_ed25519_key"


def sshd_config_text(paths: LabPaths, planned: kinds.PlannedHost) -> str:
    return "\n".join([
        f"# sshd of simulated lab host {planned.name} (written by lab/labctl.py)",
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


def prepare_host_dir(paths: LabPaths, planned: kinds.PlannedHost, login_user: str | None = None) -> None:
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


def start_host(paths: LabPaths, planned: kinds.PlannedHost, login_user: str | None = None) -> dict:
    host_dir = paths.host_dir(planned.name)
    binds = host_binds(host_dir)
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


# --- commands -----------------------------------------------------------------------------------------------------

def host_alive(host: dict) -> bool:
    return is_lab_sshd(host["pid"], host["sshd_config"])


def login_users(paths: LabPaths, login: str = "sudo") -> dict[str, str]:
    """The users of a --login sudo lab: ``sudo`` may run anything as root without a password, ``unprivileged``
    may not; of a --login user lab: ``user``, who has neither root nor sudo and owns each host's environment."""
    stem = f"cdna2-{hashlib.sha256(str(paths.root).encode()).hexdigest()[:8]}"
    if login == "user":
        return {"user": f"{stem}-user"}
    return {"sudo": stem, "unprivileged": f"{stem}-nosudo"}


def _sudoers_file(user: str) -> Path:
    return SUDOERS_DIR / user  # sudo skips names holding a dot; these have none


def ensure_login_users(paths: LabPaths, login: str = "sudo") -> dict[str, str]:
    """Create the lab's login users (idempotent): a home with the lab's key, and sudo rights for the ``sudo`` one."""
    if login == "sudo" and shutil.which("sudo") is None:
        raise RuntimeError("--login sudo needs Debian's sudo on this machine: run bin/setup (it installs it)")
    users = login_users(paths, login)
    public_key = paths.client_key.with_suffix(".pub").read_text()
    for role, user in users.items():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{user}", "--shell", "/bin/sh",
                            "--comment", f"cdna2 lab login ({role}) of {paths.root}", user], check=True)
        # Without PAM, sshd refuses a locked account ("!" in shadow, useradd's default) even for a key: "*" is no
        # password at all, and not locked.
        subprocess.run(["usermod", "--password", "*", user], check=True)
        entry = pwd.getpwnam(user)
        ssh_dir = Path(entry.pw_dir, ".ssh")
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        write_atomically(ssh_dir / "authorized_keys", public_key, 0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    if login != "sudo":
        return users
    sudoers = _sudoers_file(users["sudo"])
    staged = sudoers.with_name(f".{sudoers.name}.staged")
    staged.write_text(f"# cdna2 lab login of {paths.root} (lab/labctl.py)\n"
                      f"{users['sudo']} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    staged.chmod(0o440)
    subprocess.run(["visudo", "-q", "-c", "-f", str(staged)], check=True, capture_output=True)
    staged.replace(sudoers)
    return users


def remove_login_users(users: dict[str, str]) -> None:
    if "sudo" in users:
        _sudoers_file(users["sudo"]).unlink(missing_ok=True)
    for user in users.values():
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        subprocess.run(["userdel", "--remove", user], check=True, capture_output=True)


def _new_lab(paths: LabPaths, subnet: str, login: str, aiter: str) -> dict:
    ssh = {"user": "root", "key": str(paths.client_key), "known_hosts": str(paths.known_hosts), "sudo": False}
    if login == "sudo":
        users = login_users(paths)
        ssh.update(user=users["sudo"], sudo=True, users=users)
    elif login == "user":
        users = login_users(paths, "user")
        ssh.update(user=users["user"], users=users)
    return {
        "format": LAB_FORMAT,
        "lab_dir": str(paths.root),
        "subnet": subnet,
        "login": login,
        "aiter": aiter,
        "ssh": ssh,
        "hosts": [],
    }


def _record(paths: LabPaths, lab: dict, host: dict) -> None:
    """Record a started host at once, so its pid is known to `down` even if a later host fails to start."""
    lab["hosts"] = sorted([h for h in lab["hosts"] if h["name"] != host["name"]] + [host], key=lambda h: h["index"])
    write_atomically(paths.known_hosts, known_hosts_text(lab))
    save_lab(paths, lab)


def check_lab_dir_outside_binds(paths: LabPaths) -> None:
    """A host must see its own config and log: a lab directory under a bound path (say /tmp) would be hidden."""
    for mount_point in HOST_BINDS:
        if paths.root.is_relative_to(mount_point):
            raise SystemExit(f"lab directory {paths.root} is under {mount_point}, which each host replaces with its "
                             f"own; set CDNA2_LAB_DIR to a directory outside {', '.join(HOST_BINDS)}")


def up(paths: LabPaths, count: int, subnet: str | None, login: str | None = None, aiter: str | None = None) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("./lab/up must run as root (it creates mount namespaces and bind mounts)")
    check_lab_dir_outside_binds(paths)
    kinds.check_host_count(count)
    if subnet is not None:
        kinds.check_subnet(subnet)
    with lab_locked(paths):
        lab = load_lab(paths)
        if lab is not None and subnet is not None and lab["subnet"] != subnet:
            raise SystemExit(f"the lab in {paths.root} uses subnet {lab['subnet']}, not {subnet}; "
                             f"run ./lab/down first to change it")
        if lab is not None and login is not None and lab.get("login", "root") != login:
            raise SystemExit(f"the lab in {paths.root} logs in as {lab.get('login', 'root')}, not {login}; "
                             f"run ./lab/down first to change it")
        if lab is not None and aiter is not None and lab.get("aiter", "wheel") != aiter:
            raise SystemExit(f"the lab in {paths.root} holds AITER as a {lab.get('aiter', 'wheel')}, not {aiter}; "
                             f"run ./lab/down first to change it")
        lab = lab or _new_lab(paths, subnet or kinds.DEFAULT_SUBNET, login or "root", aiter or "wheel")
        paths.root.mkdir(parents=True, exist_ok=True)
        ensure_controller_paths()
        ensure_client_key(paths)
        if lab.get("login", "root") != "root":
            ensure_login_users(paths, lab["login"])
        login_user = lab["ssh"]["user"] if lab.get("login") == "user" else None
        if login_user is not None:  # its hosts see the mirror's wheels from their start (user_wheels)
            ensure_mirror(paths)
        recorded = {host["name"]: host for host in lab["hosts"]}
        for planned in kinds.plan_hosts(count, lab["subnet"], lab.get("aiter", "wheel")):
            host = recorded.get(planned.name)
            if host is not None and host_alive(host):
                progress(f"{planned.name}: running (pid {host['pid']}), left alone")
                continue
            progress(f"{planned.name}: {'restarting' if host else 'creating'} ({planned.kind.key}, "
                     f"{planned.address}:{kinds.PORT})")
            prepare_host_dir(paths, planned, login_user)
            host = start_host(paths, planned, login_user)
            _record(paths, lab, host)
            progress(f"{planned.name}: sshd pid {host['pid']} listening on {planned.address}:{kinds.PORT}")
        for extra in lab["hosts"][count:]:
            progress(f"{extra['name']}: beyond the {count} requested, left as it is (./lab/down stops all)")
        ensure_mirror(paths)
        return lab


def ensure_mirror(paths: LabPaths) -> None:
    if not (paths.mirror / "wheel-matrix.yaml").exists():
        progress(f"building the lab's package mirror in {paths.mirror}")
        mirror.build(paths.mirror)


def down(paths: LabPaths) -> dict:
    with lab_locked(paths):
        lab = load_lab(paths)
        if lab is None:
            if paths.root.exists():  # leftovers of an up that failed before it started any host
                shutil.rmtree(paths.root)
            progress(f"no lab recorded in {paths.state_file}; nothing to stop")
            return {"stopped": {}, "removed": str(paths.root)}
        outcomes = {}
        for host in lab["hosts"]:
            outcomes[host["name"]] = {"pid": host["pid"], "result": stop_host(host)}
            progress(f"{host['name']}: {outcomes[host['name']]['result']}")
        still_running = [host["name"] for host in lab["hosts"] if host_alive(host)]
        if still_running:
            raise SystemExit(f"hosts still running: {', '.join(still_running)}; lab state kept in {paths.root}")
        if lab["ssh"].get("users"):
            remove_login_users(lab["ssh"]["users"])
            progress(f"removed the login users {', '.join(lab['ssh']['users'].values())}")
        shutil.rmtree(paths.root)
        progress(f"removed {paths.root}")
        return {"stopped": outcomes, "removed": str(paths.root)}


def ssh_argv(lab: dict, host: dict, remote_command: str) -> list[str]:
    """An ssh command line to a lab host with the lab's key and known_hosts, host-key checking on."""
    return ["ssh", "-F", "/dev/null", "-i", lab["ssh"]["key"], "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={lab['ssh']['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", "-o", "LogLevel=ERROR",
            "-p", str(host["port"]), f"{lab['ssh']['user']}@{host['address']}", remote_command]


def _parse_probe(output: str) -> dict:
    seen: dict = {"packages": {}}
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key.startswith("package:"):
            seen["packages"][key.removeprefix("package:")] = value
        elif key:
            seen[key] = value
    return seen


def probe_host(lab: dict, host: dict) -> dict:
    row = {key: host[key] for key in ("name", "kind", "address", "port", "pid", "arch", "rocm_version")}
    row["running"] = host_alive(host)
    if not row["running"]:
        row["ssh"] = {"ok": False, "error": f"sshd pid {host['pid']} is not running"}
        return row
    result = subprocess.run(ssh_argv(lab, host, PROBE_SCRIPT), capture_output=True, text=True,
                            timeout=SSH_TIMEOUT_S * 3)
    if result.returncode != 0:
        row["ssh"] = {"ok": False, "error": (result.stderr.strip() or f"ssh exit {result.returncode}")[-500:]}
    else:
        row["ssh"] = {"ok": True, **_parse_probe(result.stdout)}
    return row


def status(paths: LabPaths) -> dict:
    lab = load_lab(paths)
    if lab is None:
        return {"up": False, "lab_dir": str(paths.root), "hosts": []}
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(pool.map(lambda host: probe_host(lab, host), lab["hosts"]))
    return {"up": all(row["running"] and row["ssh"]["ok"] for row in rows), "lab_dir": str(paths.root),
            "hosts": rows}


def _python_env_summary(seen: dict) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in seen.get("packages", {}).items())
    return f"{seen.get('python_prefix', '?')} (Python {seen.get('python', '?')}): {packages}"


def print_status(report: dict) -> None:
    if not report["hosts"]:
        print(f"lab is not up (no {report['lab_dir']}/lab.json); run ./lab/up")
        return
    header = ("NAME", "ADDRESS", "PID", "HOSTNAME(ssh)", "ROCM", "ARCH", "PYTHON ENV")
    rows = []
    for row in report["hosts"]:
        seen = row["ssh"]
        if seen["ok"]:
            rows.append((row["name"], f"{row['address']}:{row['port']}", str(row["pid"]), seen["hostname"],
                         seen["rocm_version"], seen["arch"], _python_env_summary(seen)))
        else:
            state = "running" if row["running"] else "DEAD"
            rows.append((row["name"], f"{row['address']}:{row['port']}", f"{row['pid']} ({state})",
                         f"UNREACHABLE: {seen['error']}", row["rocm_version"], row["arch"], "?"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)) + "  " + r[-1])


def print_hosts(lab: dict) -> None:
    for host in lab["hosts"]:
        print(f"{host['name']:<10} {host['address']}:{host['port']}  pid {host['pid']:<8} {host['kind']:<13} "
              f"{host['arch']}  ROCm {host['rocm_version']} (stand-in)  {host['python_env']}: "
              f"{', '.join(host['packages'])}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="start N hosts (default 3); running hosts are left alone")
    up_parser.add_argument("count", nargs="?", type=int, default=3)
    up_parser.add_argument("--subnet", help=f"first three octets of the hosts' loopback addresses "
                                            f"(default {kinds.DEFAULT_SUBNET}; fixed once the lab exists)")
    up_parser.add_argument("--login", choices=LOGINS, help="how the deploy logs in: root (default), an "
                                                        "unprivileged user with passwordless sudo (sudo), or a "
                                                        "plain user without root or sudo who owns the venv (user); "
                                                        "fixed once the lab exists")
    up_parser.add_argument("--aiter", choices=kinds.AITER_MODES, help="wheel (default): the kinds' AITER wheel; "
                                                                   "develop: every host is kind mi210-develop, its "
                                                                   "AITER a git checkout in develop mode (fixed once "
                                                                   "the lab exists)")
    up_parser.add_argument("--json", action="store_true", help="print lab.json's content on stdout")
    down_parser = commands.add_parser("down", help="stop the recorded hosts and remove the lab's state")
    down_parser.add_argument("--json", action="store_true")
    status_parser = commands.add_parser("status", help="list the hosts, asking each over SSH who it is")
    status_parser.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args, LabPaths.default())
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as error:
        print(f"lab: {args.command} failed: {error}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, paths: LabPaths) -> int:
    if args.command == "up":
        started = time.monotonic()
        lab = up(paths, args.count, args.subnet, args.login, args.aiter)
        progress(f"up: {len(lab['hosts'])} host(s) in {time.monotonic() - started:.1f} s")
        if args.json:
            print(json.dumps(lab, indent=2))
        else:
            print_hosts(lab)
        return 0
    if args.command == "down":
        report = down(paths)
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    report = status(paths)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_status(report)
    return 0 if report["up"] else 1


if __name__ == "__main__":
    sys.exit(main())

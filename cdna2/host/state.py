"""The tool's recorded state on a host: ``<state_dir>/state.json``, and the run lock beside it.

Every step that changes a host records what it did here (under its own key), so a later run, ``verify.py`` and
``rollback.py`` know what was installed, from what, and what to restore. Updates are atomic (write a staged file,
fsync, rename) and serialised by an exclusive lock on ``<state_dir>/lock``.

The lock is per command; a controller's run is many commands. So that a second controller cannot interleave its
commands with a running deploy's, every locked command of a controller run (``CDNA2_RUN`` set by the controller)
also holds the run lease ``<state_dir>/lease.json``: it names the run and is bound to the SSH connection that
run's commands arrive on. A command of another run is refused while that connection lives; the lease ends with the
connection (run finished, controller killed, network gone), so it never goes stale and needs no release.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from cdna2.host.cli import finish
from cdna2.host.env_lock import EnvLock, SharedEnvironmentBusy
from cdna2.host.shared_env import node_record_key, shared_environment_of, this_node

STATE_FORMAT = 1
RUN_ENVIRONMENT = "CDNA2_RUN"  # who runs this command: the controller's run description (operations/agent.py)
LEASE = "lease.json"
SSHD_EXECUTABLES = {"sshd", "sshd-session"}
STATE_DIR_MODE = 0o700  # OpenSSH before and since 9.8 serve a connection with these


class HostLockedError(RuntimeError):
    pass


def _process_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time in clock ticks since boot) of a live process, None when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), fields[19]


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _outside_root(pid: int, own_root: os.stat_result) -> bool:
    """Whether ``pid`` sees another root directory than this process (this one runs in a chroot, it does not)."""
    try:
        root = os.stat(f"/proc/{pid}/root")
    except OSError:
        return False  # not ours to read, or no /proc: no chroot evidence
    return (root.st_dev, root.st_ino) != (own_root.st_dev, own_root.st_ino)


def ssh_connection() -> dict[str, Any]:
    """What this command's run arrives through: the nearest sshd ancestor, with its start time (so that a recycled
    pid is never mistaken for it); in a container entered with ``docker exec`` (pyinfra's @docker connector), the
    container's main process, whose life bounds every run in it; in a chroot (pyinfra's @chroot connector on an
    image's root, cdna2/images/), the nearest process outside it: the controller's, which starts every command."""
    pid = os.getpid()
    own_root = os.stat("/")
    while pid > 1:
        stat = _process_stat(pid)
        if stat is None:
            break
        if _outside_root(pid, own_root):
            return {"pid": pid, "start": stat[1], "chroot": True}
        try:
            executable = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            # Not ours to read: an unprivileged login may not read the exe link of sshd's processes (root's, or
            # its own session process, which sshd makes undumpable); their name in /proc/<pid>/comm is public.
            executable = _process_name(pid)
        if executable in SSHD_EXECUTABLES:
            return {"pid": pid, "start": stat[1]}
        if stat[0] == 0:  # started from outside this pid namespace, not by its init: docker exec
            container_init = _process_stat(1)
            if container_init is not None:
                return {"pid": 1, "start": container_init[1], "container": True}
        pid = stat[0]
    raise HostLockedError(f"{RUN_ENVIRONMENT} is set but no sshd serves this command: a controller run reaches the "
                          f"host over SSH; unset {RUN_ENVIRONMENT} to run the host agent by hand")


def _connection_alive(connection: dict[str, Any]) -> bool:
    stat = _process_stat(connection["pid"])
    return stat is not None and stat[1] == connection["start"]


def hold_run_lease(state_dir: Path, run: str) -> dict[str, Any]:
    """Take or keep the run lease for ``run``; the caller holds the host lock. Refuses while another run's
    connection lives."""
    lease = read_lease(state_dir)
    if lease is not None and lease["run"] != run and _connection_alive(lease["connection"]):
        raise HostLockedError(
            f"host {os.uname().nodename} is being provisioned by {lease['run']} since {lease['since']}: wait for "
            f"that run to finish (the lease ends with its SSH connection; in a container, with the container's "
            f"main process: remove {state_dir / LEASE} once that run's controller is gone), then run again")
    connection = ssh_connection()
    if lease is None or lease["run"] != run or lease["connection"] != connection:
        lease = {"run": run, "connection": connection, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_file_atomically(state_dir / LEASE, (json.dumps(lease, sort_keys=True) + "\n").encode())
    return lease


@contextmanager
def host_lock(state_dir: Path, wait_seconds: float = 0.0) -> Iterator[None]:
    """Hold ``<state_dir>/lock`` exclusively; raise HostLockedError naming the holder if it stays busy.

    A shared environment's state directory (cdna2/host/shared_env.py) is locked across nodes instead, by the
    environment's ``mkdir`` lock, waiting for another node's command; the run lease, which is bound to one node's
    SSH connection, is not taken there."""
    shared = shared_environment_of(state_dir)
    if shared is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            with EnvLock(Path(shared)):
                yield
        except SharedEnvironmentBusy as error:
            raise HostLockedError(str(error)) from error
        return
    state_dir.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    # Backups, the lease and the agent the deploy runs as root live here: root's alone, whoever logged in.
    os.chmod(state_dir, STATE_DIR_MODE)
    lock_path = state_dir / "lock"
    with open(lock_path, "a+") as lock_file:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    lock_file.seek(0)
                    holder = lock_file.read().strip() or "unknown process"
                    raise HostLockedError(
                        f"{lock_path} is held by {holder}: another deploy, verify or rollback is running on this "
                        f"host; wait for it to finish, then run again") from error
                time.sleep(0.2)
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        lock_file.flush()
        try:
            if os.environ.get(RUN_ENVIRONMENT):
                hold_run_lease(state_dir, os.environ[RUN_ENVIRONMENT])
            yield
        finally:
            lock_file.seek(0)
            lock_file.truncate()


def read_lease(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / LEASE
    return json.loads(path.read_text()) if path.exists() else None


def read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "state.json"
    if not path.exists():
        return {"format": STATE_FORMAT}
    return json.loads(path.read_text())


def write_file_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a staged file beside ``path``, fsync it, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.staged-{os.getpid()}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(descriptor, mode)  # the umask must not narrow the mode of a file that replaces another
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def update_state(state_dir: Path, key: str, value: Any) -> dict[str, Any]:
    """Set (or, with ``value`` None, remove) one step's record; the caller holds the host lock."""
    state = read_state(state_dir)
    if shared_environment_of(state_dir) is not None:
        key = node_record_key(key, this_node()["name"])
    if value is None:
        state.pop(key, None)
    else:
        state[key] = value
    state["format"] = STATE_FORMAT
    write_file_atomically(state_dir / "state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
    return state


def main(argv: list[str] | None = None) -> int:
    """``python -m cdna2.host.state {set,set-once,clear} --state-dir D KEY [JSON]``: record one step's state;
    ``python -m cdna2.host.state lease --state-dir D``: take (or keep) the run lease before a step changes the host."""
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.state", description=main.__doc__)
    parser.add_argument("action", choices=["set", "set-once", "clear", "lease"])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("key", nargs="?")
    parser.add_argument("value", nargs="?", help="JSON value (set, set-once)")
    # Intermixed: the optional KEY and VALUE come after --state-dir, which plain parse_args would not allow.
    args = parser.parse_intermixed_args(argv)
    if args.action != "lease" and args.key is None:
        parser.error(f"{args.action} needs a KEY")
    try:
        with host_lock(args.state_dir):
            if args.action == "lease":
                lease = read_lease(args.state_dir)
                result = {"result": "leased" if lease else "unleased (no controller run)", "lease": lease}
            elif args.action == "set-once" and args.key in read_state(args.state_dir):
                result = {"result": "unchanged", "key": args.key}
            else:
                update_state(args.state_dir, args.key, None if args.action == "clear" else json.loads(args.value))
                result = {"result": "cleared" if args.action == "clear" else "recorded", "key": args.key}
    except HostLockedError as error:
        return finish(f"state {args.action}", {"result": "refused", "error": str(error)}, str(error))
    return finish(f"state {args.action}", result)


if __name__ == "__main__":
    sys.exit(main())

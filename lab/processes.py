"""The lab hosts' processes: is a recorded pid still that host's sshd, what runs in its namespace, and stopping it
(by its recorded pid, with its sessions, never a recycled pid).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lab.hosts import SSHD

STOP_TIMEOUT_S = 5.0


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

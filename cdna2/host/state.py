"""The tool's recorded state on a host: ``<state_dir>/state.json``, and the run lock beside it.

Every step that changes a host records what it did here (under its own key), so a later run, ``verify.py`` and
``rollback.py`` know what was installed, from what, and what to restore. Updates are atomic (write a staged file,
fsync, rename) and serialised by an exclusive lock on ``<state_dir>/lock``, which also keeps two controllers from
provisioning the same host at once.
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

STATE_FORMAT = 1


class HostLockedError(RuntimeError):
    pass


@contextmanager
def host_lock(state_dir: Path, wait_seconds: float = 0.0) -> Iterator[None]:
    """Hold ``<state_dir>/lock`` exclusively; raise HostLockedError naming the holder if it stays busy."""
    state_dir.mkdir(parents=True, exist_ok=True)
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
            yield
        finally:
            lock_file.seek(0)
            lock_file.truncate()


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
    if value is None:
        state.pop(key, None)
    else:
        state[key] = value
    state["format"] = STATE_FORMAT
    state_dir.mkdir(parents=True, exist_ok=True)
    write_file_atomically(state_dir / "state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
    return state


def main(argv: list[str] | None = None) -> int:
    """``python -m cdna2.host.state {set,set-once,clear} --state-dir D KEY [JSON]``: record one step's state."""
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.state", description=main.__doc__)
    parser.add_argument("action", choices=["set", "set-once", "clear"])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("key")
    parser.add_argument("value", nargs="?", help="JSON value (set, set-once)")
    args = parser.parse_args(argv)
    with host_lock(args.state_dir):
        current = read_state(args.state_dir)
        if args.action == "set-once" and args.key in current:
            result = {"result": "unchanged", "key": args.key}
        else:
            update_state(args.state_dir, args.key, None if args.action == "clear" else json.loads(args.value))
            result = {"result": "cleared" if args.action == "clear" else "recorded", "key": args.key}
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Forget AITER JIT outputs built from patched sources, and clear stale JIT locks. Standard library only.

AITER loads an existing ``aiter/jit/<module>.so`` with no source or arch check, so after a C++ or codegen input
changes the module and its build tree must go. A build killed mid-way leaves ``aiter/jit/build/lock_module_*``
behind and every later build waits on it forever; such a lock is removed only when no live process holds it.

How "held" is told: AITER's FileBaton keeps the lock file open (``os.open(O_CREAT|O_EXCL)``) until it releases it,
so a lock is held while any process has it open: every ``/proc/<pid>/fd/*`` is compared with the lock by device
and inode. Newer AITER writes ``<pid>\\n<host>`` into the lock; a lock naming a live pid on this host is held too.
Processes in other PID namespaces are invisible here, so run this where the builds run.

Prints one JSON object on stdout; exit 0 when done, 1 on a refused pattern.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path

from cdna2.host.cli import finish

LOCK_GLOB = "aiter/jit/build/lock_module_*"


def _inside(root: Path, pattern: str) -> None:
    if os.path.isabs(pattern) or ".." in Path(pattern).parts:
        raise ValueError(f"{pattern}: JIT patterns must be relative to the site-packages root {root}")


def open_file_ids() -> set[tuple[int, int]]:
    """(device, inode) of every file any visible process has open."""
    ids = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            entries = list(fd_dir.iterdir())
        except OSError:  # the process exited or is not ours to inspect
            continue
        for entry in entries:
            try:
                info = os.stat(entry)
            except OSError:
                continue
            ids.add((info.st_dev, info.st_ino))
    return ids


def _owner_alive(lock: Path) -> bool:
    """True when the lock names a pid on this host that still runs (AITER HEAD writes ``pid\\nhost``)."""
    try:
        lines = lock.read_text(errors="replace").split()
    except OSError:
        return False
    if not lines or not lines[0].isdigit():
        return False
    if len(lines) > 1 and lines[1] != socket.gethostname():
        return True  # another host's builder: not ours to judge
    return Path(f"/proc/{lines[0]}").exists()


def lock_is_held(lock: Path, open_ids: set[tuple[int, int]]) -> bool:
    info = lock.stat()
    return (info.st_dev, info.st_ino) in open_ids or _owner_alive(lock)


def partition_locks(root: Path) -> tuple[list[Path], list[Path]]:
    """AITER's JIT build locks under ``root``: (held by a running build, held by nobody)."""
    locks = sorted(root.glob(LOCK_GLOB))
    open_ids = open_file_ids() if locks else set()  # scanning every /proc/*/fd is wasted on no lock
    held, free = [], []
    for lock in locks:
        (held if lock_is_held(lock, open_ids) else free).append(lock)
    return held, free


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def invalidate(root: Path, patterns: list[str]) -> dict:
    """Remove every file or directory under ``root`` matching ``patterns``, then every lock nobody holds."""
    for pattern in patterns:
        _inside(root, pattern)
    removed = sorted({str(path.relative_to(root)) for pattern in patterns for path in root.glob(pattern)})
    for relative in removed:
        target = root / relative
        if target.exists() or target.is_symlink():
            _remove(target)
    held, free = partition_locks(root)
    for lock in free:
        lock.unlink()
    return {"ok": True, "root": str(root), "removed": removed,
            "stale_locks_removed": [str(lock.relative_to(root)) for lock in free],
            "locks_held": [str(lock.relative_to(root)) for lock in held]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.jit", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="site-packages holding aiter/")
    parser.add_argument("patterns", nargs="*", help="globs relative to the root, e.g. aiter/jit/module_fmha_v3_fwd.so")
    args = parser.parse_args(argv)
    try:
        result = invalidate(args.root, args.patterns)
    except ValueError as error:
        result = {"ok": False, "root": str(args.root), "error": str(error)}
    return finish("jit", result, None if result["ok"] else result["error"])


if __name__ == "__main__":
    sys.exit(main())

"""Forget AITER JIT outputs built from patched sources, and clear stale JIT locks. Standard library only.

AITER loads an existing ``aiter/jit/<module>.so`` with no source or arch check, so after a C++ or codegen input
changes the module and its build tree must go. A build killed mid-way leaves ``aiter/jit/build/lock_module_*``
behind and every later build waits on it forever; such a lock is removed only when no live process holds it.

How "held" is told: AITER's FileBaton keeps the lock file open (``os.open(O_CREAT|O_EXCL)``) until it releases it,
so a lock is held while any process has it open: every ``/proc/<pid>/fd/*`` is compared with the lock by device
and inode. Newer AITER writes ``<pid>\\n<host>`` into the lock; a lock naming a live pid on this host is held too.
Processes in other PID namespaces are invisible here, so run this where the builds run.

Some modules compile a kernel table generated from the ``hsa/<arch>`` trees into themselves when they are built
(``module_attention_asm``'s pa table; from v0.1.17 the ``module_fmha_v3_*`` tables too): one built before
``hsa/gfx90a`` existed stops with "cannot get heuristic kernel!". Which modules do is read from the installed
``aiter/jit/optCompilerConfig.json`` (their ``blob_gen_cmd`` runs a codegen over the tree), not from a version list.

Prints one JSON object on stdout; exit 0 when done, 1 on a refused pattern.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

from cdna2.host.cli import finish

LOCK_GLOB = "aiter/jit/build/lock_module_*"
JIT_CONFIG = "aiter/jit/optCompilerConfig.json"
# A blob_gen_cmd that generates code from the kernel trees: 0.1.7's "{get_asm_dir()}/pa/codegen.py", v0.1.17 and
# later's "{AITER_META_DIR}/hsa/codegen.py -m pa".
READS_KERNEL_TREE = re.compile(r"get_asm_dir\(\)|/hsa/codegen\.py")


def _inside(root: Path, pattern: str) -> None:
    if os.path.isabs(pattern) or ".." in Path(pattern).parts:
        raise ValueError(f"{pattern}: JIT patterns must be relative to the site-packages root {root}")


def open_file_ids(pids: set[int] | None = None) -> set[tuple[int, int]]:
    """(device, inode) of every file any visible process (or any of ``pids``) has open."""
    ids = set()
    fd_dirs = [Path(f"/proc/{pid}/fd") for pid in sorted(pids)] if pids is not None else Path("/proc").glob("[0-9]*/fd")
    for fd_dir in fd_dirs:
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


def _owner(lock: Path) -> tuple[int, str | None] | None:
    """The (pid, host) newer AITER writes into a lock (``pid\\nhost``), or None."""
    try:
        lines = lock.read_text(errors="replace").split()
    except OSError:
        return None
    if not lines or not lines[0].isdigit():
        return None
    return int(lines[0]), lines[1] if len(lines) > 1 else None


def _owner_alive(lock: Path) -> bool:
    """True when the lock names a pid on this host that still runs."""
    owner = _owner(lock)
    if owner is None:
        return False
    if owner[1] is not None and owner[1] != socket.gethostname():
        return True  # another host's builder: not ours to judge
    return Path(f"/proc/{owner[0]}").exists()


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


def locks_held_by(root: Path, pids: set[int]) -> list[Path]:
    """The JIT locks under ``root`` that one of ``pids`` holds open or is named in as owner."""
    locks = sorted(root.glob(LOCK_GLOB))
    open_ids = open_file_ids(pids) if locks else set()
    held = []
    for lock in locks:
        try:
            info = lock.stat()
        except OSError:  # released meanwhile
            continue
        owner = _owner(lock)
        if (info.st_dev, info.st_ino) in open_ids or (owner is not None and owner[0] in pids):
            held.append(lock)
    return held


def remove_unheld(locks: list[Path]) -> list[Path]:
    """Remove those of ``locks`` that still exist and that no live process holds; return the removed ones."""
    present = [lock for lock in locks if lock.exists()]
    open_ids = open_file_ids() if present else set()
    removed = []
    for lock in present:
        if not lock_is_held(lock, open_ids):
            lock.unlink(missing_ok=True)
            removed.append(lock)
    return removed


def kernel_tree_modules(root: Path) -> list[str]:
    """Names of the JIT modules whose build compiles in tables generated from the ``hsa/<arch>`` trees."""
    config = root / JIT_CONFIG
    if not config.is_file():
        return []
    modules = json.loads(config.read_text())
    return sorted(name for name, options in modules.items()
                  if READS_KERNEL_TREE.search(json.dumps(options.get("blob_gen_cmd", ""))))


def module_outputs(name: str) -> list[str]:
    """What a JIT build of module ``name`` leaves under site-packages: the module and its build tree."""
    return [f"aiter/jit/{name}.so", f"aiter/jit/build/{name}"]


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
    parser.add_argument("--kernel-tree-modules", action="store_true",
                        help="also every module whose build compiles in tables from the hsa/<arch> trees")
    args = parser.parse_args(argv)
    patterns = list(args.patterns)
    if args.kernel_tree_modules:
        patterns += [output for name in kernel_tree_modules(args.root) for output in module_outputs(name)]
    try:
        result = invalidate(args.root, patterns)
    except ValueError as error:
        result = {"ok": False, "root": str(args.root), "error": str(error)}
    return finish("jit", result, None if result["ok"] else result["error"])


if __name__ == "__main__":
    sys.exit(main())

"""The controller's cache directory: ``$CDNA2_CACHE``, default ``~/.cache/cdna2``.

Everything fetched or computed once per machine lives below it: downloaded wheels, installed test trees, the
gfx942 source trees, translated trees and their archives, the host agent bundle. Several processes use it at once
(two test sessions, a lab, a bench, deploys): an entry appears complete in one rename, and one that takes long to
build is built under ``cache_lock``, so a second process waits for it instead of building it again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


def cache_root() -> Path:
    return Path(os.environ.get("CDNA2_CACHE") or Path.home() / ".cache" / "cdna2")


@contextmanager
def cache_lock(name: str, root: Path | None = None) -> Iterator[None]:
    """Hold ``<root>/locks/<name>.lock`` (root: ``cache_root()``) exclusively: one process at a time builds what it
    guards; the kernel releases it when the process dies. Not re-entrant: a flock belongs to its open file, so a
    process (or another greenlet of it) that takes a lock it already holds waits forever."""
    lock_dir = (root or cache_root()) / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def code_digest(modules: tuple[ModuleType, ...]) -> str:
    """Digest of the source of ``modules``: a cached result computed by that code is stale once any of it changes
    (a version constant alone misses the edits made between two bumps, and the cache outlives checkouts)."""
    return hashlib.sha256(b"".join(Path(module.__file__).read_bytes() for module in modules)).hexdigest()

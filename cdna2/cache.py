"""The controller's cache directory: ``$CDNA2_CACHE``, default ``~/.cache/cdna2``.

Everything fetched or computed once per machine lives below it: downloaded wheels, installed test trees, the
gfx942 source trees, translated trees and their archives, the host agent bundle.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType


def cache_root() -> Path:
    return Path(os.environ.get("CDNA2_CACHE") or Path.home() / ".cache" / "cdna2")


def code_digest(modules: tuple[ModuleType, ...]) -> str:
    """Digest of the source of ``modules``: a cached result computed by that code is stale once any of it changes
    (a version constant alone misses the edits made between two bumps, and the cache outlives checkouts)."""
    return hashlib.sha256(b"".join(Path(module.__file__).read_bytes() for module in modules)).hexdigest()

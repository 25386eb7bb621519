"""The controller's cache directory: ``$CDNA2_CACHE``, default ``~/.cache/cdna2``.

Everything fetched or computed once per machine lives below it: downloaded wheels, installed test trees, the
gfx942 source trees, translated trees and their archives, the host agent bundle.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("CDNA2_CACHE") or Path.home() / ".cache" / "cdna2")

"""Patch plans remembered by their inputs: within one controller run, and from one run to the next.

A plan (code matching by tokenize, the audit) costs about 0.3 CPU-s per package and version; the hosts of a cluster
mostly hold the same files, and a no-op re-run holds the same files as the last run. ``plan_package_once`` plans
each distinct input once per process, and keeps the plans that write nothing (``patched``, ``refused``, ``no-set``:
every re-run's) in ``$CDNA2_CACHE/patch-plans/``, keyed by everything a plan depends on: the catalog's bytes, the
planner's code and the Python running it, the package, its version, the hash of every target file, the RECORD (or
git) hashes, the optional sets, the checkout and the absent directories. A lost or unreadable entry costs one plan,
never a wrong one. Plans that write something are not kept: they carry the new bytes, and the next run finds the
files patched. The directory keeps the PLANS_KEPT plans used last (a plan read back is marked used), so a cluster
that upgrades often does not grow it without end.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import asdict
from functools import cache
from pathlib import Path

from cdna2.cache import cache_root, code_digest
from cdna2.host import checkouts, digests
from cdna2.host.state import write_file_atomically
from cdna2.patches import audit, catalog as catalog_module, matching, planner
from cdna2.patches.catalog import Catalog
from cdna2.patches.planner import PackagePlan, SiteState, plan_package, sha256_hex

PLAN_MEMO_FORMAT = 1
PLANS_KEPT = 512  # distinct inputs, a few kB each; one upgrade of one package across a cluster adds one or two

# Plans made or read in this process, by their inputs: (id(catalog), ...) -> (catalog, plan). The catalog is held
# so that its id is not reused by another while the entry lives.
_plans: dict[tuple, tuple[Catalog, PackagePlan]] = {}


@cache
def _planner_code() -> str:
    return code_digest((planner, matching, audit, catalog_module, checkouts, digests))


def _stored_path(catalog: Catalog, inputs: tuple) -> Path | None:
    """Where the plan for ``inputs`` is kept; None for a catalog not loaded from files (it has no digest)."""
    if not catalog.digest:
        return None
    # The Python version too: tokenize, which code matching rests on, changes between versions (3.12's f-strings).
    key = json.dumps([PLAN_MEMO_FORMAT, catalog.digest, _planner_code(), sys.version, *inputs])
    return cache_root() / "patch-plans" / f"{hashlib.sha256(key.encode('utf-8')).hexdigest()}.json"


def _read(path: Path) -> PackagePlan | None:
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
        plan = PackagePlan(**{**fields, "sites": [SiteState(**site) for site in fields["sites"]]})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    with contextlib.suppress(OSError):  # a plan read is good even where it cannot be marked
        os.utime(path)  # used now: _prune keeps it
    return plan


def _store(path: Path, plan: PackagePlan) -> None:
    write_file_atomically(path, json.dumps(asdict(plan), sort_keys=True).encode("utf-8"))
    _prune(path.parent)


def _prune(directory: Path) -> None:
    """Remove all but the PLANS_KEPT plans used last (another process may remove the same ones meanwhile)."""
    plans = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".json"):  # staged files end in -<pid>
                with contextlib.suppress(FileNotFoundError):
                    plans.append((entry.stat().st_mtime_ns, entry.path))
    for _, stale in sorted(plans, reverse=True)[PLANS_KEPT:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)


def plan_package_once(catalog: Catalog, package: str, installed_version: str, files: Mapping[str, bytes | None],
                      record: Mapping[str, str], enabled_optional: Collection[str],
                      checkout: str | None = None, absent_dirs: Collection[str] = ()) -> PackagePlan:
    """``plan_package``, made once per distinct input (see the module's docstring); each call gets its own copy.

    The deploy and verify plan each host's packages through here.
    """
    inputs = (package, installed_version,
              sorted((path, None if data is None else sha256_hex(data)) for path, data in files.items()),
              sorted(record.items()), sorted(enabled_optional), checkout, list(absent_dirs))
    key = (id(catalog), json.dumps(inputs))
    if key not in _plans:
        path = _stored_path(catalog, inputs)
        plan = _read(path) if path and path.is_file() else None
        if plan is None:
            plan = plan_package(catalog, package, installed_version, files, record, enabled_optional, checkout,
                                absent_dirs)
            if path and not plan.changes:
                _store(path, plan)
        _plans[key] = catalog, plan
    return copy.deepcopy(_plans[key][1])

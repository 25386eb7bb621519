"""Declarative patch sets that open AITER's and vLLM's gfx90a dispatch paths, planned from the installed text.

``load_catalog`` reads and validates the YAML sets; ``plan_package`` decides, purely from the bytes and RECORD
hashes a host reported, what to write there. The host side (``cdna2.host.txn``, ``cdna2.host.jit``) executes it.
"""

from cdna2.host.digests import record_hash
from cdna2.patches.catalog import Catalog, PatchDataError, PatchSet, Site, Variant, load_catalog
from cdna2.patches.plan_memo import plan_package_once
from cdna2.patches.planner import FileChange, PackagePlan, SiteState, plan_package, sha256_hex

__all__ = ["Catalog", "FileChange", "PackagePlan", "PatchDataError", "PatchSet", "Site", "SiteState", "Variant",
           "load_catalog", "plan_package", "plan_package_once", "record_hash", "sha256_hex"]

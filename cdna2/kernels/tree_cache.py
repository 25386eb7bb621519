"""The content-addressed cache of translated trees, and the staging directory every translated tree is built in (or
copied into from the cache) and renamed from onto its destination. Entry points: ``cache_key``, then
``from_cache`` or, after a translation, ``store_in_cache``; ``staging_for`` and ``move_into_place`` around both.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Callable

from cdna2.cache import code_digest
from cdna2.host.digests import tree_digest
from cdna2.kernels import edits, hazard_rules, llvm
from cdna2.kernels.policy import Policy

# Bump whenever the bytes written for the same input may change (rename table, patching, manifest rules).
TRANSLATOR_VERSION = "2"
# Every module whose code decides the bytes or the report of a translation: a change to any of them makes a new key
# (a test checks that every module of cdna2/kernels/ but the command line is here).
PIPELINE_MODULES = (
    "cdna2.kernels.engine", "cdna2.kernels.analysis", "cdna2.kernels.batching", "cdna2.kernels.workers",
    "cdna2.kernels.scan", "cdna2.kernels.judge", "cdna2.kernels.isa", "cdna2.kernels.split", "cdna2.kernels.llvm",
    "cdna2.kernels.hazards", "cdna2.kernels.hazard_rules", "cdna2.kernels.hazard_instructions",
    "cdna2.kernels.hazard_paths", "cdna2.kernels.hazard_report", "cdna2.kernels.edits", "cdna2.kernels.reassemble",
    "cdna2.kernels.relocation_proof", "cdna2.kernels.write_and_prove", "cdna2.kernels.report",
    "cdna2.kernels.policy", "cdna2.kernels.tree_cache", "cdna2.host.elf", "cdna2.host.manifest",
)


@lru_cache(maxsize=1)
def _engine_code_digest() -> str:
    return code_digest(tuple(map(importlib.import_module, PIPELINE_MODULES)))


def cache_key(src_digest: str, tools: llvm.LlvmTools, policy: Policy = Policy(),
              pads: dict[str, list[edits.Pad]] | None = None) -> str:
    """What a translation depends on: the source tree, the translator, the LLVM that proves it, the hazard audit,
    the policy and the padding asked for."""
    asked = json.dumps({"policy": asdict(policy), "pads": {r: [asdict(p) for p in v] for r, v in (pads or {}).items()}},
                       sort_keys=True)
    parts = (src_digest, TRANSLATOR_VERSION, tools.banner, hazard_rules.AUDIT_VERSION, asked, _engine_code_digest())
    return hashlib.sha256("".join(f"{part}\n" for part in parts).encode()).hexdigest()


def move_into_place(staging: Path, dst: Path) -> None:
    """Rename the finished tree onto DST; an existing DST is moved aside first and removed only afterwards."""
    previous = dst.with_name(f".{dst.name}.previous.{os.getpid()}")
    if dst.exists():
        dst.rename(previous)
    staging.rename(dst)
    if previous.exists():
        shutil.rmtree(previous)


def staging_for(dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.staging.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def from_cache(entry: Path, dst: Path, report_base: dict, progress: Callable[[str], None]) -> dict | None:
    if not (entry / "report.json").is_file():
        return None
    report = json.loads((entry / "report.json").read_text())
    if tree_digest(entry / "tree") != report["output_digest"]:
        progress(f"cache entry {entry} does not match its recorded digest; translating again")
        # Renamed away first, so another process finding it corrupt too, or storing a good one, never meets half.
        discarded = entry.with_name(f"{entry.name}.corrupt.{os.getpid()}")
        try:
            entry.rename(discarded)
        except FileNotFoundError:
            pass  # another process removed it already
        shutil.rmtree(discarded, ignore_errors=True)
        report_base["cache"]["status"] = "miss: corrupt entry replaced"
        return None
    staging = staging_for(dst)
    shutil.copytree(entry / "tree", staging)
    move_into_place(staging, dst)
    return {**report, **report_base, "cache": {**report_base["cache"], "status": "hit"}}


def store_in_cache(entry: Path, staging: Path, report: dict) -> None:
    """Copy the finished tree and its report into the cache, appearing in one rename."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    temporary = entry.with_name(f"{entry.name}.tmp.{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(staging, temporary / "tree")
    (temporary / "report.json").write_text(json.dumps(report, sort_keys=True))
    try:
        temporary.rename(entry)
    except OSError:
        # Another run stored the same key meanwhile: same inputs, same bytes, so its entry serves.
        shutil.rmtree(temporary)
        if not (entry / "report.json").is_file():
            raise

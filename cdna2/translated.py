"""Translated kernel trees on the controller: one per distinct gfx942 source tree in the cluster.

The cache (``<cache>/kernels``) holds, per source digest (the probe's RECORD digest of ``hsa/gfx942``):
``sources/<digest>/gfx942`` the source tree, fetched once from a host that has it, and
``translated/<digest>/<kernel policy>/<memo key>/`` the gfx90a tree with its translation report (policy:
Policy.label; the key: what the result depends on, ``_memo_key``);
plus ``archives/<output digest>.tar.gz``, the deterministic archive that hosts receive. Translation runs as
``python -m cdna2 translate`` in a child process, whose own cache makes a repeated translation of the same inputs
cost no LLVM work.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Callable

from cdna2.archive import tree_archive
from cdna2.cache import cache_lock
from cdna2.host.kernels import safe_extract
from cdna2.host.digests import file_sha256, git_hash_field, record_hash, tree_digest
from cdna2.kernels import Policy, cache_key, find_llvm
from cdna2.kernels.hazard_rules import AUDIT_VERSION, VERDICTS
from cdna2.host.state import write_file_atomically
from cdna2.schema import load_packaged

ADAPTATIONS_FILE = "gfx90a-tree.yaml"
MEMO_FORMAT = "2"  # the remembered tree's fields (2: code_changes); a memo of another format is made again


class KernelSourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class TranslatedTree:
    source_digest: str
    digest: str  # tree digest of the gfx90a tree: what a host's probe reports once it is installed
    archive: Path
    archive_sha256: str
    kernels: int
    tree_bytes: int  # size of the unpacked tree: the room it needs beside hsa/ on the host
    adaptations: tuple[str, ...]  # ids of the gfx90a-tree adaptations applied
    invalidates: tuple[str, ...]  # JIT outputs built from the tree's non-kernel files, to remove when it changes
    hazard_policy: str  # kernel_hazard_policy the tree was made under
    hazard_audit_version: str
    hazard_verdicts: dict[str, int]  # MFMA wait-state verdict -> portable kernels with it
    withheld: int  # portable kernels the policy did not install
    code_changes: dict[str, int]  # written kernels by how their code was made: "in place", "padded", "split", ...

    def report_details(self) -> dict:
        """The deploy report's `kernels` details for a host that takes this tree."""
        return {"kernels": self.kernels, "code_changes": self.code_changes, "hazard_policy": self.hazard_policy,
                "hazard_audit_version": self.hazard_audit_version, "hazard_verdicts": self.hazard_verdicts,
                "withheld": self.withheld}

    def hazard_summary(self) -> str:
        """The verdicts and what the policy did, for the deploy report."""
        counts = ", ".join(f"{self.hazard_verdicts.get(verdict, 0)} {verdict}" for verdict in VERDICTS)
        written = ", ".join(f"{count} {code}" for code, count in self.code_changes.items())
        return (f"kernel_hazard_policy {self.hazard_policy} (MFMA wait-state audit {self.hazard_audit_version}): "
                f"{counts}; {self.withheld} withheld; written {written}")


@cache
def load_adaptations() -> list[dict]:
    """cdna2/data/gfx90a-tree.yaml, validated against its schema at load."""
    return load_packaged(ADAPTATIONS_FILE, "gfx90a-tree-1.0.json", KernelSourceError)["adaptations"]


def adapt_tree(tree: Path, adaptations: list[dict]) -> list[dict]:
    """Apply each adaptation whose anchor the tree holds exactly ``count`` times; return those applied.

    An anchor found a different number of times is an error (the text moved: never guess); a file without the
    anchor or without the file is a tree the adaptation does not concern.
    """
    applied = []
    for adaptation in adaptations:
        path = tree / adaptation["file"]
        if not path.is_file():
            continue
        text = path.read_text()
        found = text.count(adaptation["anchor"])
        if adaptation["marker"] in text or found == 0:
            continue
        if found != adaptation["count"]:
            raise KernelSourceError(f"{path}: adaptation {adaptation['id']}: anchor found {found} times, expected "
                                    f"{adaptation['count']}; update cdna2/data/{ADAPTATIONS_FILE} for this AITER")
        path.write_text(text.replace(adaptation["anchor"], adaptation["replacement"]))
        applied.append(adaptation)
    return applied


def ensure_source(cache: Path, digest: str, fetch: Callable[[Path], None], checkout: str | None = None) -> Path:
    """The cached gfx942 tree with ``digest``; when absent, ``fetch(archive)`` downloads one and it is verified.

    ``checkout``: the host's AITER is this develop checkout, and ``digest`` is made of git HEAD's blob ids
    (cdna2.host.probe.read_develop_aiter), which the fetched files are hashed to again.
    """
    source = cache / "sources" / digest / "gfx942"
    if source.is_dir():
        return source
    with cache_lock(f"kernel-source-{digest[:32]}", cache):  # another controller may be fetching the same tree
        if not source.is_dir():
            _fetch_source(cache, digest, fetch, checkout, source)
    return source


def _fetch_source(cache: Path, digest: str, fetch: Callable[[Path], None], checkout: str | None, source: Path) -> None:
    staging = cache / "sources" / f".{digest}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        archive = staging / "gfx942.tar.gz"
        fetch(archive)
        safe_extract(archive, staging)  # files and directories only: the archive comes from a host
        archive.unlink()
        found = tree_digest(staging / "gfx942", git_hash_field if checkout else record_hash)
        if found != digest and checkout:
            raise KernelSourceError(
                f"{checkout}/hsa/gfx942 differs from the checkout's git HEAD (tree {digest[:12]} in HEAD, "
                f"{found[:12]} on disk): uncommitted or untracked kernel files; commit or stash them there")
        if found != digest:
            raise KernelSourceError(
                f"the gfx942 tree fetched for {digest[:12]} has digest {found[:12]}: the files on the host differ "
                f"from AITER's RECORD (modified after install?); reinstall amd-aiter on that host")
        (cache / "sources" / digest).mkdir(parents=True, exist_ok=True)
        (staging / "gfx942").rename(source)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _memo_key(source_digest: str, policy: Policy) -> str:
    """What the translated tree depends on: what the engine's translation does, and the adaptations."""
    adaptations = resources.files("cdna2").joinpath("data", ADAPTATIONS_FILE).read_bytes()
    parts = (cache_key(source_digest, find_llvm(), policy), hashlib.sha256(adaptations).hexdigest(), MEMO_FORMAT)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def ensure_translation(cache: Path, source_digest: str, source: Path, policy: Policy,
                       progress: Callable[[str], None] = lambda line: None) -> TranslatedTree:
    """Translate ``source`` (cached by the engine) under the kernel ``policy`` and archive the result once per
    output digest.

    The result is remembered per source digest and policy with everything it depends on, so a run that finds it
    needs no translator process at all. Another controller translating the same tree is waited for: both would
    write the same directory.
    """
    with cache_lock(f"kernel-translation-{source_digest[:32]}-{policy.label}", cache):
        return _translation(cache, source_digest, source, policy, progress)


def _translation(cache: Path, source_digest: str, source: Path, policy: Policy,
                 progress: Callable[[str], None]) -> TranslatedTree:
    key = _memo_key(source_digest, policy)
    # One slot per memo key: checkouts of different code sharing a cache each keep theirs, none re-translates
    # because the other ran last.
    out_dir = cache / "translated" / source_digest / policy.label / key[:16]
    out_dir.mkdir(parents=True, exist_ok=True)
    memo_path, report_path = out_dir / "tree.json", out_dir / "report.json"  # report.json: the engine's report
    memo = json.loads(memo_path.read_text()) if memo_path.exists() else None
    if memo and memo["key"] == key and Path(memo["archive"]).is_file():
        progress(f"translated gfx942 tree {source_digest[:12]} taken from the controller cache")
        fields = {name: value for name, value in memo.items() if name != "key"}
        return TranslatedTree(**dict(fields, archive=Path(fields["archive"]), adaptations=tuple(fields["adaptations"]),
                                     invalidates=tuple(fields["invalidates"])))
    command = [sys.executable, "-m", "cdna2", "translate", str(source), str(out_dir / "gfx90a"),
               "--report", str(report_path), "--cache", str(cache / "engine"), *policy.cli_arguments]
    progress(f"translating gfx942 tree {source_digest[:12]} ({' '.join(command[1:4])} ...)")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KernelSourceError(f"translation of gfx942 tree {source_digest[:12]} failed "
                                f"(exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    report = json.loads(report_path.read_text())
    hazards = report["hazards"]
    if hazards["audit_version"] != AUDIT_VERSION or hazards["policy"] != policy.hazards:
        raise KernelSourceError(f"translation of gfx942 tree {source_digest[:12]}: the report says audit "
                                f"{hazards['audit_version']} under policy {hazards['policy']}, expected "
                                f"{AUDIT_VERSION} under {policy.hazards}; this is a translator bug")
    applied = adapt_tree(out_dir / "gfx90a", load_adaptations())
    digest = tree_digest(out_dir / "gfx90a")
    archive = cache / "archives" / f"gfx90a-{digest[:32]}.tar.gz"
    if not archive.exists():
        tree_archive(out_dir / "gfx90a", archive)
    tree = TranslatedTree(
        source_digest=source_digest, digest=digest, archive=archive,
        archive_sha256=file_sha256(archive),
        kernels=sum(1 for _ in (out_dir / "gfx90a").rglob("*.co")),
        tree_bytes=sum(path.stat().st_size for path in (out_dir / "gfx90a").rglob("*") if path.is_file()),
        adaptations=tuple(a["id"] for a in applied),
        invalidates=tuple(sorted({pattern for a in applied for pattern in a["invalidates"]})),
        hazard_policy=policy.hazards, hazard_audit_version=hazards["audit_version"],
        hazard_verdicts=hazards["verdicts"], withheld=len(hazards["withheld"]),
        code_changes=dict(sorted(Counter(entry["code"] for entry in report["kernels"].values()
                                         if entry["status"] == "written").items())),
    )
    memo = dict(asdict(tree), key=key, archive=str(archive))
    write_file_atomically(memo_path, json.dumps(memo, indent=1, sort_keys=True).encode("utf-8"))
    return tree

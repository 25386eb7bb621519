"""Which release every patch set serves: real AITER tags and vLLM wheels, each taken through the whole patch cycle.

Each release is laid out as the installed package (only the files the catalog targets, with a RECORD that hashes
them), cached under ``$CDNA2_CACHE/release-trees``:

- amd-aiter 0.1.7.post2.dev18, the one wheel PyPI serves, from that wheel.
- AITER from its git history (``$CDNA2_AITER_GIT``, a bare clone of ROCm/aiter): every tag from the floor on and
  main's HEAD (releases/discovery.py). The amd-aiter wheel installs repo ``csrc/`` and ``hsa/`` under
  ``aiter_meta/`` (setup.py copies them there) and ``aiter/`` as it is.
- vLLM from its wheels (``pip download --no-deps``, the wheelhouse cache): every release the package index serves
  from the floor on (releases/discovery.py).

Each row says whether the release is qualified (every set names it), new since the last qualification, or refused
by name (cdna2/data/releases.yaml; no tree is laid out for it). Per release and set: the required sets with that set
(and what it requires) are planned; the cell says patched, or refused/declined with the planner's reason. Then every
set that patched goes through apply, check, a second apply that must change nothing, and revert, which must leave
each file matching RECORD.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from cdna2.cache import cache_lock, cache_root, code_digest
from cdna2.host import checkouts, digests, jit, txn
from cdna2.host.checkouts import checkout_path
from cdna2.host.digests import record_hash
from cdna2.host.state import write_file_atomically
from cdna2.patches import audit, catalog as catalog_module, cli, matching, planner
from cdna2.patches.catalog import Catalog, load_catalog
from cdna2.patches.cli import apply_in_place, probe
from cdna2.patches.planner import PackagePlan, plan_package
from cdna2.patches.releases import load_releases
from lab import wheelhouse
from lab.aiter_git import SourceMissing, aiter_git, aiter_version
from releases.discovery import Discovered, aiter_releases, qualification_status, vllm_releases


def _key(files: list[str]) -> str:
    return hashlib.sha256("\n".join(files).encode()).hexdigest()[:12]


def _write_dist_info(root: Path, name: str, version: str, files: list[str]) -> None:
    dist_info = root / f"{name}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    rows = []
    for relative in files + [f"{dist_info.name}/METADATA"]:
        data = (root / relative).read_bytes()
        rows.append([relative, record_hash(data), str(len(data))])
    rows.append([f"{dist_info.name}/RECORD", "", ""])
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    (dist_info / "RECORD").write_text(buffer.getvalue())


def _cached(name: str, build) -> Path:
    """``build(staging)`` once into ``$CDNA2_CACHE/release-trees/<name>``; a finished tree is never rebuilt."""
    tree = cache_root() / "release-trees" / name
    with cache_lock("release-trees"):
        if not (tree / ".complete").exists():
            staging = tree.with_name(tree.name + ".staging")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            build(staging)
            (staging / ".complete").touch()
            shutil.rmtree(tree, ignore_errors=True)
            staging.rename(tree)
    return tree


def aiter_tree(git_dir: Path, ref: str, files: list[str]) -> Path:
    """amd-aiter at ``ref`` as the wheel installs it, holding only ``files`` (installed paths) and a RECORD."""
    version = aiter_version(git_dir, ref)

    def build(staging: Path) -> None:
        present = []
        for relative in files:
            repo_path = checkout_path(relative)
            shown = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{ref}:{repo_path}"],
                                   capture_output=True)
            if shown.returncode == 0:
                (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                (staging / relative).write_bytes(shown.stdout)
                present.append(relative)
        _write_dist_info(staging, "amd_aiter", version, present)

    return _cached(f"amd-aiter-{version}-{_key(files)}", build)


def aiter_triton_tree(git_dir: Path, ref: str) -> Path:
    """AITER's whole Triton package (``aiter/ops/triton``) at ``ref``, as the wheel installs it: what the Triton
    compile proof (``cdna2.triton``) reads."""
    def build(staging: Path) -> None:
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", ref,
                                  "aiter/ops/triton"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)

    return _cached(f"amd-aiter-triton-{aiter_version(git_dir, ref)}", build)


def wheel_tree(requirement: str, files: list[str]) -> Path:
    """``name==version`` from its PyPI wheel: its dist-info (real RECORD) and ``files``, no other file."""

    def build(staging: Path) -> None:
        with zipfile.ZipFile(wheelhouse.wheel(requirement)) as archive:
            names = set(archive.namelist())
            dist_info = [name for name in names if name.split("/", 1)[0].endswith(".dist-info")]
            for name in dist_info + [name for name in files if name in names]:
                archive.extract(name, staging)

    return _cached(f"{requirement.replace('==', '-')}-{_key(files)}", build)


@dataclass
class ReleaseResult:
    package: str
    release: str
    version: str
    cells: dict[str, str] = field(default_factory=dict)  # set -> "patched" or "refused: ..." / "declined: ..."
    variants: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cycle: str = ""  # "ok" or what failed in apply / check / second apply / revert
    status: str = ""  # qualified, new, main or refused (releases.discovery.qualification_status)

    def to_json(self) -> dict:
        return {"package": self.package, "release": self.release, "version": self.version, "status": self.status,
                "sets": self.cells, "variants": self.variants, "notes": self.notes, "cycle": self.cycle}


def _probe(catalog: Catalog, package: str, root: Path):
    probed = probe(root, catalog, package)
    if probed is None:
        raise SourceMissing(f"{root}: {package} is not installed there")
    return probed


def _plan(catalog: Catalog, package: str, root: Path, optional: list[str]) -> PackagePlan:
    version, files, record = _probe(catalog, package, root)
    return plan_package(catalog, package, version, files, record, optional)


def _with_requirements(catalog: Catalog, name: str) -> list[str]:
    wanted, pending = [], [name]
    while pending:
        current = catalog.by_name(pending.pop())
        if current.optional and current.name not in wanted:
            wanted.append(current.name)
        pending.extend(current.requires)
    return wanted


def _record_pristine(root: Path, tree: Path) -> list[str]:
    """Files of ``tree`` (the subset the release tree holds) that are missing under ``root`` or differ from RECORD,
    files under ``root`` RECORD does not list, and directories under ``root`` that ``tree`` has not (one a
    transaction created and left)."""
    dist_info = next(root.glob("*.dist-info"))
    rows = {row[0]: row[1] for row in csv.reader((dist_info / "RECORD").read_text().splitlines()) if row}
    problems = [path for path, hash_field in rows.items() if hash_field and (tree / path).is_file()
                and (not (root / path).is_file() or record_hash((root / path).read_bytes()) != hash_field)]
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative not in rows and relative != ".complete":
            problems.append(f"{relative} (not in RECORD)")
        elif path.is_dir() and not (tree / relative).is_dir():
            problems.append(f"{relative}/ (a directory the release's tree has not)")
    return problems


def _cycle(catalog: Catalog, package: str, tree: Path, sets: list[str]) -> str:
    """Apply, check, apply again, revert on a copy of ``tree``; "ok" or the first step that failed."""
    with tempfile.TemporaryDirectory(prefix="cdna2-coverage-") as scratch:
        root = Path(scratch) / "site-packages"
        shutil.copytree(tree, root)
        state = Path(scratch) / "state"
        plan = _plan(catalog, package, root, sets)
        if plan.status != "apply":
            return f"plan: {plan.status}: {' / '.join(plan.reasons)}"
        result = apply_in_place(root, plan, state)
        if not result["ok"]:
            return f"apply: {result.get('error')}"
        check = _plan(catalog, package, root, sets)
        if check.status != "patched" or check.changes:
            return f"check: {check.status}: {' / '.join(check.reasons)}"
        txn.revert(state, root)
        left = _record_pristine(root, tree)
        if left:
            return f"revert: not RECORD-pristine: {', '.join(left)}"
        if state.exists() and any(state.iterdir()):
            return f"revert: left {', '.join(p.name for p in state.iterdir())} in the state directory"
    return "ok"


def refused_result(catalog: Catalog, package: str, release: str, reason: str) -> ReleaseResult:
    """A release the data refuses by name: every set refused with the reason, nothing laid out or run."""
    return ReleaseResult(package, release, release.removeprefix("v"),
                         {patch_set.name: f"refused: {reason}" for patch_set in catalog.sets_for(package)},
                         cycle="not run: refused by name", status="refused")


def _result_path(catalog: Catalog, package: str, release: str, tree: Path, status: str) -> Path | None:
    """Where the result of one release tree is kept: keyed by the catalog's bytes, the code that computes it, the
    Python running it, the tree (its name carries the version and the target files) and its status. None for a
    catalog built in code (no digest)."""
    if not catalog.digest:
        return None
    code = code_digest((sys.modules[__name__], planner, matching, audit, catalog_module, cli, txn, jit, checkouts,
                        digests))
    key = json.dumps([catalog.digest, code, sys.version, package, release, tree.name, status])
    return cache_root() / "coverage-results" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def release_result(catalog: Catalog, package: str, release: str, tree: Path,
                   refused: dict[str, str] | None = None) -> ReleaseResult:
    """The release's row, kept in ``$CDNA2_CACHE/coverage-results`` (a warm run re-plans only what changed)."""
    version = _probe(catalog, package, tree)[0]
    status = qualification_status(catalog, package, release, version, refused or {})
    kept = _result_path(catalog, package, release, tree, status)
    if kept is not None and kept.is_file():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            fields = json.loads(kept.read_text())
            fields["cells"] = fields.pop("sets")
            return ReleaseResult(**fields)
    result = _computed_result(catalog, package, release, version, tree, status)
    if kept is not None:
        write_file_atomically(kept, json.dumps(result.to_json(), sort_keys=True).encode())
    return result


def _computed_result(catalog: Catalog, package: str, release: str, version: str, tree: Path,
                     status: str) -> ReleaseResult:
    result = ReleaseResult(package, release, version, status=status)
    required = [patch_set.name for patch_set in catalog.sets_for(package) if not patch_set.optional]
    base = _plan(catalog, package, tree, [])
    for name in required:
        result.cells[name] = "patched" if base.status == "apply" else f"refused: {' / '.join(base.reasons)}"
    result.variants.update(base.variants)
    result.notes.extend(base.notes)
    applicable = []
    for patch_set in catalog.sets_for(package):
        if not patch_set.optional:
            continue
        plan = _plan(catalog, package, tree, _with_requirements(catalog, patch_set.name))
        if patch_set.name in plan.declined:
            result.cells[patch_set.name] = f"declined: {plan.declined[patch_set.name]}"
        elif plan.status == "apply":
            result.cells[patch_set.name] = "patched"
            result.variants[patch_set.name] = plan.variants[patch_set.name]
            result.notes.extend(note for note in plan.notes if note not in result.notes)
            applicable.append(patch_set.name)
        else:
            result.cells[patch_set.name] = f"refused: {' / '.join(plan.reasons)}"
    result.cycle = _cycle(catalog, package, tree, applicable) if base.status == "apply" else "not run: refused"
    return result


def discover(catalog: Catalog) -> list[Discovered]:
    """The releases to qualify: AITER's tags and main, then vLLM's releases on the index (releases/discovery.py)."""
    releases = load_releases()
    return [aiter_releases(aiter_git(), releases), vllm_releases(catalog, releases)]


def release_trees(catalog: Catalog, discovered: list[Discovered],
                  progress=lambda line: None) -> list[tuple[str, str, Path]]:
    """(package, release, tree) for every discovered release but those refused by name, AITER first (the one
    amd-aiter wheel the index serves, then every tag from git). Trees are cached: only a new release costs a
    download or a git read."""
    git_dir = aiter_git()
    wheel = wheelhouse.AITER
    trees = [("amd-aiter", f"{wheel.partition('==')[2]} (wheel)",
              wheel_tree(wheel, catalog.target_files("amd-aiter")))]
    for found in discovered:
        files = catalog.target_files(found.package)
        for release in found.releases:
            if release in found.refused:
                continue
            progress(f"coverage: {found.package} {release}: laying out its files (cached after the first run)")
            trees.append((found.package, release, aiter_tree(git_dir, release, files) if found.package == "amd-aiter"
                          else wheel_tree(f"{found.package}=={release}", files)))
    return trees


def results(catalog: Catalog, discovered: list[Discovered], progress=lambda line: None) -> list[ReleaseResult]:
    """Every discovered release's row, in the order discovered (the amd-aiter wheel first)."""
    refused = {(found.package, release): reason for found in discovered for release, reason in found.refused.items()}
    trees = {(package, release): tree for package, release, tree in release_trees(catalog, discovered, progress)}
    order = [(package, release) for package, release in trees if release.endswith("(wheel)")]
    order += [(found.package, release) for found in discovered for release in found.releases]
    by_package = {found.package: found.refused for found in discovered}
    return [refused_result(catalog, package, release, refused[(package, release)]) if (package, release) in refused
            else release_result(catalog, package, release, trees[(package, release)], by_package.get(package))
            for package, release in order]


def _cell(row: ReleaseResult, name: str) -> str:
    status = row.cells[name].split(":")[0]
    return f"{status} ({row.variants[name]})" if status == "patched" else status


def table(results: list[ReleaseResult], catalog: Catalog) -> str:
    """One block per package: a row per release, a column per set (patched with the variant, declined, refused),
    then the reasons and notes, wrapped to 118 columns."""
    out = []
    for package in catalog.packages():
        rows = [result for result in results if result.package == package]
        if not rows:
            continue
        names = [patch_set.name for patch_set in catalog.sets_for(package)]
        header = ["release", "status", *names, "cycle"]
        body = [[row.release, row.status, *[_cell(row, name) for name in names],
                 "ok" if row.cycle == "ok" else "refused" if row.status == "refused" else "FAILED"] for row in rows]
        widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
        out.append(f"{package}:")
        out.extend("  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                   for line in [header, *body])
        remarks = [f"{row.release} is version {row.version}" for row in rows
                   if not row.release.removeprefix("v").startswith(row.version)]
        for row in rows:
            remarks.extend(f"{row.release} {name}: {row.cells[name].split(': ', 1)[1]}" for name in names
                           if row.cells[name] != "patched")
            remarks.extend(f"{row.release}: {note}" for note in row.notes)
            if row.cycle != "ok":
                remarks.append(f"{row.release}: cycle {row.cycle}")
        out.extend(textwrap.fill(remark, width=118, initial_indent="  - ", subsequent_indent="    ",
                                 break_on_hyphens=False)
                   for remark in remarks)
        new = [row.release for row in rows if row.status == "new"]
        out.append(f"  new since the last qualification: {', '.join(new) or 'none'}")
        out.append("")
    return "\n".join(out)


def to_json(results: list[ReleaseResult]) -> str:
    return json.dumps({"releases": [result.to_json() for result in results]}, indent=1, sort_keys=True)


def failures(results: list[ReleaseResult], catalog: Catalog) -> list[str]:
    """Rows that fail qualification: a cycle that broke, or a required set that does not patch a release the data
    does not refuse by name."""
    required = {patch_set.name for patch_set in catalog.sets if not patch_set.optional}
    return [f"{result.package} {result.release}" for result in results if result.status != "refused" and (
        result.cycle != "ok" or any(result.cells[name] != "patched" for name in required & set(result.cells)))]


def command(as_json: bool) -> int:
    """``python -m releases coverage``: print the table (or JSON); exit 1 when a required set fails a release."""
    catalog = load_catalog()
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        discovered = discover(catalog)
        rows = results(catalog, discovered, progress)
    except SourceMissing as error:
        print(f"coverage: {error}", file=sys.stderr)
        return 1
    for found in discovered:
        print(f"coverage: {found.package}: {len(found.releases)} releases from {found.source}", file=sys.stderr)
    print(to_json(rows) if as_json else table(rows, catalog))
    failed = failures(rows, catalog)
    if failed:
        print(f"coverage: not qualified: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("coverage", help="every patch set on every AITER and vLLM release from the floor "
                                                    "to the newest (discovered; real trees, cached), the whole patch "
                                                    "cycle on each")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(func=lambda args: command(args.json))


__all__ = ["ReleaseResult", "SourceMissing", "aiter_git", "aiter_tree", "aiter_triton_tree", "discover", "failures",
           "release_result", "release_trees", "results", "table", "to_json", "wheel_tree"]

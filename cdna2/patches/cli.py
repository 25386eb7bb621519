"""``python -m cdna2 patch {plan,apply,check,revert,port}``: the patch engine on one box, no pyinfra.

The same pieces the deploy uses: a local probe of the site-packages, ``plan_package`` per package, and the host
transaction (``cdna2.host.txn``) plus JIT invalidation (``cdna2.host.jit``) run locally.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cdna2.host import jit, txn
from cdna2.host.distributions import absent_directories, canonical_name, read_core_metadata, record_entries
from cdna2.patches.catalog import Catalog, PatchDataError, load_catalog
from cdna2.patches.planner import PackagePlan, plan_package

STATE_DIR_NAME = ".cdna2-patch-state"


def _dist_info(site_packages: Path, package: str) -> Path | None:
    """The dist-info directory of ``package`` (names normalised as in PEP 503/427), or None if not installed."""
    wanted = canonical_name(package)
    found = [path for path in site_packages.glob("*.dist-info")
             if canonical_name(path.name.split("-", 1)[0]) == wanted]
    if len(found) > 1:
        raise SystemExit(f"{site_packages}: several dist-info directories for {package}: "
                         f"{', '.join(p.name for p in found)}; remove the stale ones")
    return found[0] if found else None


def _installed_version(dist_info: Path) -> str:
    version = read_core_metadata(dist_info).get("Version")
    if not version:
        raise SystemExit(f"{dist_info}/METADATA: no Version: line; the installation is damaged, reinstall it")
    return version


def _record(dist_info: Path) -> dict[str, str]:
    rows = record_entries((dist_info / "RECORD").read_text(encoding="utf-8"))
    return {path: hash_field for path, hash_field, _ in rows if hash_field}


def probe(site_packages: Path, catalog: Catalog, package: str) -> tuple[str, dict, dict] | None:
    """Local equivalent of the deploy's host probe: (version, file bytes or None, RECORD hashes)."""
    dist_info = _dist_info(site_packages, package)
    if dist_info is None:
        return None
    files = {}
    for relative in catalog.target_files(package):
        path = site_packages / relative
        files[relative] = path.read_bytes() if path.is_file() else None
    return _installed_version(dist_info), files, _record(dist_info)


def _plans(args: argparse.Namespace, catalog: Catalog) -> list[tuple[str, PackagePlan | None]]:
    plans = []
    for package in catalog.packages():
        probed = probe(args.site_packages, catalog, package)
        if probed is None:
            plans.append((package, None))
            continue
        version, files, record = probed
        absent = absent_directories(args.site_packages, [path for path, data in files.items() if data is None])
        plans.append((package, plan_package(catalog, package, version, files, record, args.sets, absent_dirs=absent)))
    return plans


def _state_dir(args: argparse.Namespace, package: str) -> Path:
    return (args.state_dir or args.site_packages / STATE_DIR_NAME) / package


def _stage(root: Path, plan: PackagePlan) -> dict[str, str]:
    """Write each new content next to its target, or above the directories the transaction creates (same
    filesystem, so the rename is atomic); path -> staged copy."""
    staged = plan.staged_paths(str(root))
    for change in plan.changes:
        with open(staged[change.path], "wb") as handle:
            handle.write(change.new_bytes)
            handle.flush()
            os.fsync(handle.fileno())
    return staged


def apply_in_place(root: Path, plan: PackagePlan, backup_dir: Path) -> dict:
    """Apply a plan to the site-packages at ``root`` on this machine: stage, transaction, JIT cleanup. The
    directories to create are this tree's, whatever tree the plan was made from."""
    plan.new_directories = absent_directories(root, [plan.host_path(change.path) for change in plan.changes
                                                     if change.old_sha256 is None])
    result = txn.apply(plan.transaction(str(root), str(backup_dir), _stage(root, plan)))
    result["jit"] = jit.invalidate(root, plan.jit_invalidations)
    return result


def _print_plan(package: str, plan: PackagePlan | None, show_diff: bool) -> None:
    if plan is None:
        print(f"== {package}: not installed")
        return
    print(f"== {package} {plan.installed_version}: {plan.status}" + (f" ({', '.join(plan.sets)})" if plan.sets else ""))
    for reason in plan.reasons:
        print(f"   {reason}")
    for note in plan.notes:
        print(f"   note: {note}")
    for finding in plan.audit:
        print(f"   audit: {finding}")
    for directory in plan.new_directories:
        print(f"   would create directory {directory}")
    for change in plan.changes:
        print(change.diff if show_diff else f"   would change {change.path}")
    if plan.jit_invalidations:
        print(f"   JIT outputs to remove after the change: {', '.join(plan.jit_invalidations)}")


def _port(catalog: Catalog, args: argparse.Namespace) -> int:
    """Print a draft variant of one set for the release installed at --site-packages; writes nothing."""
    from cdna2.patches.port import draft_variant, draft_yaml

    if len(args.sets) != 1 or args.sets[0] not in catalog.set_names():
        print(f"patch port: name one set with --set; sets: {', '.join(catalog.set_names())}", file=sys.stderr)
        return 2
    patch_set = catalog.by_name(args.sets[0])
    probed = probe(args.site_packages.resolve(), catalog, patch_set.package)
    if probed is None:
        print(f"{args.site_packages}: {patch_set.package} is not installed there", file=sys.stderr)
        return 1
    version, files, _ = probed
    texts = {path: data.decode("utf-8") if data is not None else None for path, data in files.items()}
    draft = draft_variant(patch_set, texts)
    print(draft_yaml(draft, version, f"drafted by python -m cdna2 patch port from variant {draft.model.id} on "
                                     f"{patch_set.package} {version}: review every site"))
    return 1 if draft.unplaced else 0


def _run(args: argparse.Namespace) -> int:
    try:
        catalog = load_catalog()
    except PatchDataError as error:
        print(f"patch data invalid: {error}", file=sys.stderr)
        return 1
    if args.site_packages is None:
        print(f"patch {args.action}: --site-packages is required", file=sys.stderr)
        return 2
    args.site_packages = args.site_packages.resolve()
    if args.action == "port":
        return _port(catalog, args)
    unknown = sorted(set(args.sets) - set(catalog.optional_sets()))
    if unknown:
        print(f"--set {', '.join(unknown)}: not an optional patch set; choose from "
              f"{', '.join(catalog.optional_sets())}", file=sys.stderr)
        return 2
    report = {"site_packages": str(args.site_packages), "action": args.action, "packages": []}
    failed = False
    if args.action == "revert":
        for package in catalog.packages():
            try:
                result = txn.revert(_state_dir(args, package), args.site_packages)
                result["jit"] = jit.invalidate(args.site_packages, result["jit_invalidations"])
                if args.state_dir is None and (args.site_packages / STATE_DIR_NAME).is_dir() and not any(
                        (args.site_packages / STATE_DIR_NAME).iterdir()):
                    (args.site_packages / STATE_DIR_NAME).rmdir()  # RECORD does not list it
            except txn.TxnError as error:
                result, failed = {"ok": False, "package": package, "error": str(error), "file": error.path}, True
            report["packages"].append(result)
            if not args.json:
                print(f"== {package}: " + (f"restored {', '.join(result['changed']) or 'nothing'}" if result["ok"]
                                           else f"REFUSED: {result['error']}"))
                for directory in result.get("removed_directories", []):
                    print(f"   removed directory {directory}")
                if result.get("left_directories"):
                    print(f"   note: {result['note']}")
    else:
        for package, plan in _plans(args, catalog):
            entry = {"package": package, "installed": plan is not None, "plan": plan.to_json() if plan else None}
            if plan is not None and plan.status in ("refused", "no-set"):
                failed = True
            if args.action == "check" and plan is not None and plan.status != "patched":
                failed = True
            if args.action == "apply" and plan is not None and plan.status == "apply":
                try:
                    entry["result"] = apply_in_place(args.site_packages, plan, _state_dir(args, package))
                except txn.TxnError as error:
                    entry["result"], failed = {"ok": False, "error": str(error), "file": error.path}, True
            report["packages"].append(entry)
            if not args.json:
                _print_plan(package, plan, show_diff=args.action == "plan")
                if "result" in entry:
                    print("   " + ("applied" if entry["result"]["ok"] else f"FAILED: {entry['result']['error']}"))
    if args.action == "check" and not any(entry.get("installed", True) for entry in report["packages"]):
        print(f"{args.site_packages}: none of {', '.join(catalog.packages())} is installed here", file=sys.stderr)
        failed = True
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    return 1 if failed else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("patch", help="plan, apply, check or revert the gfx90a patch sets on one box",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("plan", "apply", "check", "revert", "port"),
                        help="plan: show unified diffs; apply: patch; check: exit 1 unless every selected site is "
                             "patched; revert: restore the originals; port: print a draft variant of --set NAME for "
                             "the release installed (writes nothing). Every set on every release, and vLLM's gates: "
                             "python -m releases")
    parser.add_argument("--site-packages", type=Path, help="the site-packages holding the packages")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME",
                        help="enable an optional patch set (repeatable); required sets are always selected")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help=f"where originals and state are kept (default: <site-packages>/{STATE_DIR_NAME})")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON report instead of text")
    parser.set_defaults(func=_run)

"""Kernel families on a host: which installed code objects each family is, each family's verdict from the smoke
test's GPU checks, and the families withheld from ``hsa/gfx90a``. Standard library only.

A family is proven when every GPU check that proves it passed. On a host whose GPU checks ran, a family whose check
failed, or that no check proves, is withheld: its code objects leave ``hsa/gfx90a`` and its manifest rows are
dropped, both in one atomic exchange of the tree, so no installed ASM kernel runs unjudged. Host data may keep
families with no check by name (then they stay, "unproven", and every report says so); a failed check withholds its
family whatever the host data says. Where the GPU checks cannot run (the lab, images), every family is unproven,
with the reason, and nothing is withheld.

The families (name, code objects as ``dir/`` prefixes or root file names, the checks proving it) come from the
controller's ``cdna2/data/kernel-families.yaml`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from cdna2.host.cli import finish
from cdna2.host.digests import regular_files, tree_digest, tree_stat_signature
from cdna2.host.jit import invalidate, kernel_tree_modules, module_outputs
from cdna2.host.kernels import STATE_KEY, exchange_directories, rename_directory
from cdna2.host.manifest import ManifestError, prune
from cdna2.host.state import host_lock, read_state, update_state, write_file_atomically

PROVEN, WITHHELD, UNPROVEN = "proven", "withheld", "unproven"
KEEP_SETTING = "smoke_keep_unproven_families"


def family_of(relpath: str, families: list[dict]) -> str:
    """The family a code object (relative to ``hsa/gfx90a``) belongs to; one no family lists is named for its
    directory (or file) with ``unlisted:`` in front, so it is judged, and withheld, like any other."""
    for family in families:
        if any(relpath.startswith(pattern) if pattern.endswith("/") else relpath == pattern
               for pattern in family["kernels"]):
            return family["name"]
    return f"unlisted:{relpath.split('/')[0]}"


def installed_families(tree: Path, families: list[dict]) -> dict[str, list[str]]:
    """The code objects under ``tree``, by family."""
    found: dict[str, list[str]] = {}
    for relpath, _ in regular_files(tree):
        if relpath.endswith(".co"):
            found.setdefault(family_of(relpath, families), []).append(relpath)
    return {name: sorted(paths) for name, paths in sorted(found.items())}


def judge(installed: dict[str, list[str]], checks: list[dict], families: list[dict], keep: list[str],
          not_run: str | None, withheld_before: dict[str, dict]) -> dict[str, dict]:
    """Each family's verdict: ``{verdict, reason, kernels, checks}``, and ``kept_by_host_data`` where a family no check
    proves is installed because the host data keeps it.

    ``checks``: the smoke test's GPU check results; ``not_run``: why the GPU checks did not run on this host (every
    family is then unproven with it), None when they ran; ``withheld_before``: the families already withheld on
    this host (their code objects are gone; they stay withheld until the tree is installed again).
    """
    by_name = {family["name"]: family for family in families}
    results = {check["name"]: check for check in checks}
    verdicts = {}
    for name in sorted({*installed, *withheld_before}):
        family = by_name.get(name, {"checks": [], "no_check": "no entry in kernel-families.yaml"})
        entry = {"kernels": len(installed.get(name, ())), "checks": family["checks"]}
        if name in withheld_before and name not in installed:
            entry = {**entry, "kernels": withheld_before[name]["kernels"], "verdict": WITHHELD,
                     "reason": withheld_before[name]["reason"]}
        elif not_run:
            entry.update(verdict=UNPROVEN, reason=f"GPU checks did not run: {not_run}")
        elif not family["checks"]:
            kept = name in keep
            entry.update(verdict=UNPROVEN if kept else WITHHELD, kept_by_host_data=kept,
                         reason=f"no GPU check proves it ({family['no_check']})"
                                + (f"; kept by host data {KEEP_SETTING}" if kept else ""))
        else:
            missing = [check for check in family["checks"] if check not in results]
            bad = [results[check] for check in family["checks"]
                   if check in results and results[check]["status"] != "passed"]
            if missing or bad:
                entry.update(verdict=WITHHELD, reason="; ".join(
                    [f"{check['name']} {check['status']}: {check['detail'][:300]}" for check in bad]
                    + [f"{check} did not run" for check in missing]))
            else:
                entry.update(verdict=PROVEN, reason=f"{', '.join(family['checks'])} passed on this GPU")
        verdicts[name] = entry
    return verdicts


def verdict_line(verdicts: dict[str, dict]) -> str:
    """``families: 2 proven (pa, fmha_v3_fwd); 1 withheld (mla); ...``: the report's compact line."""
    if not verdicts:
        return "families: none installed, nothing proven"
    parts = []
    for verdict in (PROVEN, WITHHELD, UNPROVEN):
        names = [name for name, entry in verdicts.items() if entry["verdict"] == verdict]
        if names:
            parts.append(f"{len(names)} {verdict} ({', '.join(names)})")
    return "families: " + "; ".join(parts)


def withhold(hsa_root: Path, tree: Path, drop: dict[str, list[str]], reasons: dict[str, str],
             state_dir: Path) -> dict:
    """Remove the code objects of the families in ``drop`` from ``tree`` (``hsa_root/gfx90a``) and the manifest
    rows naming them, by building the reduced tree beside it (hard links to the kept files) and exchanging the two in
    one step; record the withheld families and the new digest in the kernels record (the installed tree's digest
    stays there as ``installed_digest``, which the deploy compares with the translation)."""
    dropped = {path for paths in drop.values() for path in paths}
    staging = hsa_root / f".gfx90a.withholding-{os.getpid()}"
    with host_lock(state_dir):
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(tree, staging, copy_function=os.link, ignore=lambda directory, names: [
            name for name in names if os.path.relpath(os.path.join(directory, name), tree).replace(os.sep, "/")
            in dropped])
        try:
            present = {relpath for relpath, _ in regular_files(tree) if relpath.endswith(".co")}
            rows_dropped = 0
            for relpath, path in list(regular_files(staging)):
                if relpath.endswith(".csv"):
                    text = Path(path).read_text(encoding="utf-8")
                    pruned = prune(relpath, text, present, present - dropped)
                    if pruned.dropped:  # a new file, not a write through the hard link into the installed tree
                        rows_dropped += pruned.dropped
                        write_file_atomically(Path(path), pruned.text.encode("utf-8"))
            if not exchange_directories(staging, tree):
                # No atomic exchange on this filesystem: the tree is absent between these two renames.
                rename_directory(tree, staging.with_name(staging.name + ".old"))
                os.rename(staging, tree)
                os.rename(staging.with_name(staging.name + ".old"), staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # after the exchange: the full tree
        record = read_state(state_dir).get(STATE_KEY) or {}
        withheld = dict(record.get("withheld") or {})
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        withheld.update({name: {"reason": reasons[name], "kernels": len(paths), "at": at}
                         for name, paths in drop.items()})
        digest = tree_digest(tree)
        update_state(state_dir, STATE_KEY, {
            **record, "digest": digest, "stat_signature": tree_stat_signature(tree)[0],
            "installed_digest": record.get("installed_digest") or record.get("digest"), "withheld": withheld})
    return {"withheld": sorted(drop), "kernels_removed": len(dropped), "manifest_rows_dropped": rows_dropped,
            "digest": digest}


def withhold_on_host(site_packages: Path, hsa_root: Path, state_dir: Path, families: list[dict],
                     reasons: dict[str, str]) -> dict:
    """Withhold the families in ``reasons`` (name -> why) that still have code objects in ``hsa_root/gfx90a``, then
    remove the JIT modules that compiled a kernel table from the tree (they would name the removed kernels)."""
    tree = hsa_root / "gfx90a"
    installed = installed_families(tree, families)
    drop = {name: installed[name] for name in reasons if name in installed}
    if not drop:
        return {"result": "unchanged", "withheld": []}
    done = withhold(hsa_root, tree, drop, reasons, state_dir)
    jit_outputs = [output for name in kernel_tree_modules(site_packages) for output in module_outputs(name)]
    done["jit"] = invalidate(site_packages, jit_outputs)
    return {"result": "withheld", **done}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.families", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    withhold_parser = commands.add_parser("withhold", help="remove families from hsa/gfx90a in one atomic swap")
    withhold_parser.add_argument("--site-packages", type=Path, required=True)
    withhold_parser.add_argument("--hsa-root", type=Path, required=True)
    withhold_parser.add_argument("--state-dir", type=Path, required=True)
    withhold_parser.add_argument("--families", required=True, metavar="JSON", help="the kernel families")
    withhold_parser.add_argument("--reasons", required=True, metavar="JSON", help="family -> why it is withheld")
    args = parser.parse_args(argv)
    try:
        result = withhold_on_host(args.site_packages, args.hsa_root, args.state_dir, json.loads(args.families),
                                  json.loads(args.reasons))
    except (OSError, ValueError, ManifestError) as error:
        return finish("families withhold", {"result": "failed", "error": str(error)}, str(error))
    return finish("families withhold", result)


if __name__ == "__main__":
    sys.exit(main())

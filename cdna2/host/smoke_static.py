"""The smoke test's static checks: what the deploy left on the host, read from disk without a GPU.

The gfx90a tree is present and is the one the deploy installed, every code object in it says gfx90a, no manifest
row names a missing kernel, the patch transactions are applied, every other AITER and vLLM file matches its RECORD,
triton is the expected version and its autotuner imports, no stale JIT output or orphaned JIT lock is left, no
module compiled from the kernel trees predates the gfx90a tree. Entry point: ``static_checks(view, ...)``, on the
``HostView`` that ``read_host`` reads. Standard library only.
"""

from __future__ import annotations

import calendar
import csv
import functools
import io
import os
import struct
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from cdna2.host import elf, importcheck, jit, probe, state
from cdna2.host.checkouts import read_develop_aiter
from cdna2.host.digests import file_sha256
from cdna2.host.distributions import read_aiter, read_distributions, read_records, record_mismatches
from cdna2.host import manifest as kernel_manifest

PASSED, FAILED, SKIPPED, WRONG = "passed", "failed", "skipped", "wrong"
STATIC, GPU = "static", "gpu"
PATCHED_PACKAGES = ("amd-aiter", "vllm")  # the distributions the deploy patches, by the names backups use
MAX_NAMED = 10  # offenders named in a check's detail; the count is always complete


def result(name: str, kind: str, status: str, detail: str) -> dict:
    return {"name": name, "kind": kind, "status": status, "detail": detail}


def named(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    return shown + (f" (and {len(items) - MAX_NAMED} more)" if len(items) > MAX_NAMED else "")


# --- what is on the host -------------------------------------------------------------------------------------------

@dataclass
class Transaction:
    """One package's patch backups (``<state_dir>/backups/<package>``, layout in cdna2.host.txn)."""

    package: str
    backup_dir: Path
    record: dict
    interrupted: bool

    @property
    def root(self) -> Path:
        return Path(self.record["root"])

    @functools.cached_property
    def file_states(self) -> dict[str, str]:
        """Per file of the transaction: ``patched`` or what it is instead (each file hashed once per smoke test)."""
        states = {}
        for relative, hashes in sorted(self.record["files"].items()):
            current = file_sha256(self.root / relative)
            if hashes["patched_sha256"] is None:
                states[relative] = "its patch never finished"
            elif current == hashes["patched_sha256"]:
                states[relative] = "patched"
            elif current is None:
                states[relative] = "missing"
            elif current == hashes["original_sha256"]:
                states[relative] = "back to the original (patch lost)"
            else:
                states[relative] = "edited after patching"
        return states


@dataclass
class HostView:
    site_packages: Path
    state_dir: Path
    distributions: dict
    records: dict[str, str]  # RECORD text per installed package
    aiter: dict | None
    tool_state: dict | None
    transactions: list[Transaction]
    errors: list[str] = field(default_factory=list)

    @property
    def gfx90a_tree(self) -> Path | None:
        return Path(self.aiter["hsa_root"], "gfx90a") if self.aiter and self.aiter["hsa_root"] else None

    def errors_about(self, path: Path) -> list[str]:
        return [error for error in self.errors if error.startswith(str(path))]


@contextmanager
def searched_first(site_packages: Path) -> Iterator[None]:
    """Put ``site_packages`` first on the metadata search path (for the target Python's own one, nothing changes)."""
    entry = str(site_packages)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def read_transactions(state_dir: Path, errors: list[str]) -> list[Transaction]:
    return [Transaction(package, Path(backup["backup_dir"]), backup, backup["journal"])
            for package, backup in probe.read_backups(str(state_dir), errors).items()]


def read_host(site_packages: Path, state_dir: Path) -> HostView:
    """Everything the static checks look at, read once (call inside ``searched_first``)."""
    errors: list[str] = []
    distributions = read_distributions(errors)
    records = read_records(distributions, errors)
    aiter = read_aiter(distributions.get("amd-aiter"), records.get("amd-aiter", ""), errors,
                       facts=read_develop_aiter(distributions, ()))
    try:
        tool_state = state.read_state(state_dir)
    except (OSError, ValueError) as error:
        errors.append(f"{state_dir / 'state.json'}: unreadable tool state: {error}")
        tool_state = None
    return HostView(site_packages, state_dir, distributions, records, aiter, tool_state,
                    read_transactions(state_dir, errors), errors)


# --- static checks ------------------------------------------------------------------------------------------------

def check_gfx90a_tree(view: HostView) -> dict:
    name = "gfx90a_tree"
    tree = view.gfx90a_tree
    if tree is None:
        why = "; ".join(view.errors) or (f"amd-aiter is not installed for {sys.executable} "
                                         f"(searched {view.site_packages} first)")
        return result(name, STATIC, FAILED, f"AITER's kernel tree was not found: {why}")
    if not tree.is_dir():
        return result(name, STATIC, FAILED, f"{tree} is missing: run the deploy to install the translated kernels")
    if view.tool_state is None:
        return result(name, STATIC, FAILED, "; ".join(view.errors_about(view.state_dir / "state.json")) +
                      ": the kernels record cannot be read; run the deploy to record the tree again")
    if "kernels" not in view.tool_state:
        return result(name, STATIC, FAILED, f"{tree} exists but {view.state_dir / 'state.json'} has no kernels "
                                            f"record, so this tool did not install it: run the deploy")
    recorded, actual = view.tool_state["kernels"]["digest"], view.aiter["gfx90a_digest"]
    if actual != recorded:
        return result(name, STATIC, FAILED, f"{tree} is not the tree the deploy installed (digest {actual[:12]}, "
                                            f"recorded {recorded[:12]}): a file was added, removed or changed; run "
                                            f"the deploy to reinstall it")
    return result(name, STATIC, PASSED, f"{tree}: {view.aiter['gfx90a_files']} files, digest {actual[:12]} as "
                                        f"installed {view.tool_state['kernels'].get('installed', '')}".rstrip())


def machine_of(path: Path) -> str:
    """``gfx90a``, ``gfx942``, ``mach 0x..`` for other AMDGPU machines, or why the file is no code object."""
    with open(path, "rb") as handle:
        header = handle.read(elf.E_FLAGS_OFFSET + 4)
    if header[:4] != b"\x7fELF" or len(header) < elf.E_FLAGS_OFFSET + 4:
        return "not an ELF file"
    mach = struct.unpack_from("<I", header, elf.E_FLAGS_OFFSET)[0] & elf.MACH_MASK
    return elf.mach_name(mach)


def reads_gfx90a_tree(name: str) -> Callable[[Callable[[str, Path], dict]], Callable[[HostView], dict]]:
    """A check of the installed gfx90a tree, called with its name and the tree; skipped when there is no tree
    (the gfx90a_tree check reports that)."""
    def decorate(check: Callable[[str, Path], dict]) -> Callable[[HostView], dict]:
        @functools.wraps(check)
        def run(view: HostView) -> dict:
            tree = view.gfx90a_tree
            if tree is None or not tree.is_dir():
                return result(name, STATIC, SKIPPED, "no hsa/gfx90a tree to read (reported by gfx90a_tree)")
            return check(name, tree)
        return run
    return decorate


@reads_gfx90a_tree("code_objects_gfx90a")
def check_code_objects(name: str, tree: Path) -> dict:
    code_objects = sorted(tree.rglob("*.co"))
    if not code_objects:
        return result(name, STATIC, FAILED, f"{tree} holds no .co file: run the deploy to reinstall the kernels")
    wrong = [f"{path.relative_to(tree)} ({machine})" for path in code_objects
             if (machine := machine_of(path)) != "gfx90a"]
    if wrong:
        return result(name, STATIC, FAILED, f"{len(wrong)} of {len(code_objects)} code objects in {tree} are not "
                                            f"gfx90a: {named(wrong)}; the GPU cannot load them: run the deploy to "
                                            f"reinstall the translated tree")
    return result(name, STATIC, PASSED, f"all {len(code_objects)} code objects in {tree} say gfx90a")


def dangling_manifest_rows(tree: Path, manifest: Path) -> tuple[int, list[str]]:
    """Rows checked and ``<csv>:<line> <kernel>`` for each row whose kernel is in none of its load locations."""
    rows = list(csv.reader(io.StringIO(manifest.read_text(encoding="utf-8", errors="replace"))))
    column = kernel_manifest.kernel_column(rows[0]) if rows else None
    if column is None:
        return 0, []
    checked, dangling = 0, []
    for line_number, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        checked += 1
        kernel = row[column].strip() if column < len(row) else ""
        relpath = manifest.relative_to(tree).as_posix()
        try:
            locations = [tree / candidate for candidate in
                         kernel_manifest.row_candidates(relpath, kernel, f"{relpath}:{line_number}")]
        except kernel_manifest.ManifestError:
            locations = []  # a kernel named outside the tree can never be loaded from it
        inside = all(location.resolve().is_relative_to(tree.resolve()) for location in locations)
        if not kernel or not locations or not inside or not any(location.is_file() for location in locations):
            dangling.append(f"{manifest.relative_to(tree)}:{line_number} {kernel or '(empty)'}")
    return checked, dangling


@reads_gfx90a_tree("manifests_complete")
def check_manifests(name: str, tree: Path) -> dict:
    manifests = sorted(tree.rglob("*.csv"))
    checked, dangling = 0, []
    for manifest in manifests:
        rows, missing = dangling_manifest_rows(tree, manifest)
        checked += rows
        dangling.extend(missing)
    if dangling:
        return result(name, STATIC, FAILED, f"{len(dangling)} manifest rows in {tree} name a kernel that is not "
                                            f"there, so selecting that shape fails with 'failed to open': "
                                            f"{named(dangling)}; run the deploy to reinstall the pruned tree")
    return result(name, STATIC, PASSED, f"{checked} rows in {len(manifests)} manifests all name an existing kernel")


def check_patch_sets(view: HostView) -> dict:
    name = "patch_sets_applied"
    by_package = {transaction.package: transaction for transaction in view.transactions}
    problems, applied = [], []
    for package in PATCHED_PACKAGES:
        if view.distributions.get(package) is None:
            continue
        transaction = by_package.get(package)
        if transaction is None:
            backup_dir = view.state_dir / "backups" / package
            problems.append(f"{package}: " + ("; ".join(view.errors_about(backup_dir)) or
                                              f"no patch transaction under {backup_dir}") +
                            "; run the deploy (or this host has apply_patches off)")
            continue
        if transaction.interrupted:
            problems.append(f"{package}: interrupted transaction in {transaction.backup_dir}: run "
                            f"'python -m cdna2.host.txn recover --backup-dir {transaction.backup_dir}'")
            continue
        states = transaction.file_states
        bad = [f"{transaction.root / path}: {status}" for path, status in states.items() if status != "patched"]
        if bad:
            problems.append(f"{package}: {named(bad)}; run the deploy to patch it again")
        else:
            applied.append(f"{package} {len(states)} files")
    if problems:
        return result(name, STATIC, FAILED, "; ".join(problems))
    if not applied:
        return result(name, STATIC, FAILED, f"neither amd-aiter nor vllm is installed for {sys.executable}")
    return result(name, STATIC, PASSED, "patched as recorded: " + ", ".join(applied))


def check_record(view: HostView) -> dict:
    name = "record_pristine"
    touched = {t.package: set(t.record["files"]) for t in view.transactions}
    counts, mismatches, checkouts = [], [], []
    for package in PATCHED_PACKAGES:
        dist = view.distributions.get(package)
        if dist is None:
            continue
        if dist.get("install_mode") == "develop":  # its RECORD lists only the path file
            checkouts.append(f"{package} is a develop checkout ({dist['location']}): git HEAD is its oracle, and "
                             f"its patched files are checked by patch_sets_applied")
            continue
        found = record_mismatches(Path(dist["location"]), view.records[package],
                                        skip_paths=touched.get(package, set()))
        if found["unproven"]:
            mismatches.append(f"{package}: {found['unproven']}")
            continue
        mismatches.extend(f"{package}: {path} (changed)" for path in found["mismatched"])
        mismatches.extend(f"{package}: {path} (missing)" for path in found["missing"])
        counts.append(f"{found['checked']} {package}")
    if not counts and not checkouts:
        return result(name, STATIC, FAILED, f"neither amd-aiter nor vllm is installed for {sys.executable}")
    if mismatches:
        return result(name, STATIC, FAILED, f"{len(mismatches)} files differ from their RECORD: {named(mismatches)}; "
                                            f"something changed the packages outside this tool: reinstall them, "
                                            f"then run the deploy")
    matched = [f"{' and '.join(counts)} files match RECORD (patched files are checked by patch_sets_applied; "
               f"bytecode and console scripts are not checked)"] if counts else []
    return result(name, STATIC, PASSED, "; ".join(matched + checkouts))


def check_triton_version(view: HostView, expected: str) -> dict:
    name = "triton_version"
    found = view.distributions.get("triton")
    if found is None:
        return result(name, STATIC, FAILED, f"triton is not installed for {sys.executable}: install "
                                            f"triton=={expected}")
    if found["version"] != expected:
        return result(name, STATIC, FAILED, f"triton {found['version']} in {found['location']}, expected {expected}: "
                                            f"reinstall triton=={expected} after AITER")
    return result(name, STATIC, PASSED, f"triton {expected} in {found['location']}")


def import_results(imports: dict, aiter_required: bool) -> list[dict]:
    """The triton and aiter checks from ``importcheck.run_checks`` (each import ran in its own child).

    An aiter that could not even be tried (no ROCm torch) is skipped, unless the host needs it (a gfx90a host
    whose GPU checks are on): then that fails too.
    """
    by_module = {check["module"]: check for check in imports["checks"]}
    triton_checks = [by_module["triton"], by_module["triton.runtime.autotuner"]]
    failed = [check["message"] + (f" ({check['output'].strip().splitlines()[-1]})" if check["output"].strip() else "")
              for check in triton_checks if check["status"] != "passed"]
    triton = result("triton_autotuner_import", STATIC, FAILED if failed else PASSED,
                    "; ".join(failed) or "import triton and import triton.runtime.autotuner succeed in a child")
    aiter = by_module["aiter"]
    aiter_status = {"passed": PASSED, "unavailable": FAILED if aiter_required else SKIPPED}.get(aiter["status"],
                                                                                              FAILED)
    detail = aiter["message"] + (f": {aiter['output'][-500:]}" if aiter_status == FAILED and aiter["output"] else "")
    return [triton, result("import_aiter", STATIC, aiter_status, detail)]


def _newest_mtime(path: Path) -> int:
    """Newest modification time (ns) of a file, or of the files in a directory (its own when it holds none).

    Directory times are left out: creating a lock or an empty folder in a build tree touches them, building does
    not necessarily, so only file times say when something was built.
    """
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_mtime_ns
    times = [os.lstat(os.path.join(directory, name)).st_mtime_ns
             for directory, _, files in os.walk(path) for name in files]
    return max(times, default=path.lstat().st_mtime_ns)


def stale_jit_outputs(transaction: Transaction) -> list[str]:
    """JIT outputs matching the transaction's invalidations that are older than its newest patched input.

    A module built after the patch is legitimate (AITER rebuilds on first use); one older than the patched file
    was built from the original and AITER loads it without any source check.
    """
    root = transaction.root
    patched = [root / path for path, status in transaction.file_states.items() if status == "patched"]
    if not patched:
        return []
    patched_at = max(path.stat().st_mtime_ns for path in patched)
    stale = set()
    for pattern in transaction.record.get("jit_invalidations", []):
        for output in root.glob(pattern):
            if _newest_mtime(output) < patched_at:
                stale.add(str(output.relative_to(root)))
    return sorted(stale)


def check_stale_jit(view: HostView) -> dict:
    name = "jit_no_stale_modules"
    stale = [(transaction.root, path) for transaction in view.transactions for path in stale_jit_outputs(transaction)]
    if stale:
        fixes = {f"python -m cdna2.host.jit --root {root} {path}" for root, path in stale}
        return result(name, STATIC, FAILED, f"{len(stale)} JIT outputs were built before their inputs were patched "
                                            f"and AITER would load them unchecked: "
                                            f"{named([str(root / path) for root, path in stale])}; remove them: "
                                            f"{named(sorted(fixes))}")
    patterns = sum(len(t.record.get("jit_invalidations", [])) for t in view.transactions)
    if not view.transactions:
        return result(name, STATIC, PASSED, "no patch transaction recorded, so no JIT input is patched")
    return result(name, STATIC, PASSED, f"no output of {patterns} invalidated JIT patterns predates its patched inputs")


def check_jit_locks(view: HostView) -> dict:
    name = "jit_no_orphan_lock"
    aiter = view.distributions.get("amd-aiter")
    if aiter is None:
        return result(name, STATIC, SKIPPED, f"amd-aiter is not installed for {sys.executable}: no JIT directory")
    root = Path(aiter["location"])
    held, orphans = ([str(lock.relative_to(root)) for lock in locks] for locks in jit.partition_locks(root))
    if orphans:
        return result(name, STATIC, FAILED, f"{len(orphans)} JIT locks under {root} are held by no process and every "
                                            f"build of those modules would wait forever: {named(orphans)}; clear "
                                            f"them with 'python -m cdna2.host.jit --root {root}'")
    if held:
        return result(name, STATIC, PASSED, f"no orphan lock; held by a running build: {named(held)}")
    return result(name, STATIC, PASSED, f"no JIT lock under {root / 'aiter/jit/build'}")


def check_kernel_tree_modules(view: HostView) -> dict:
    """No JIT module that compiles in a kernel table from the ``hsa/<arch>`` trees predates the gfx90a tree.

    Times: the module file's mtime against the kernels record's install time (whole seconds, so a module built
    in the very second before the install is not caught). Modules in a JIT directory elsewhere (``AITER_JIT_DIR``,
    ``~/.aiter`` when site-packages is read-only) are not looked at.
    """
    name = "jit_modules_after_kernels"
    aiter = view.distributions.get("amd-aiter")
    installed = ((view.tool_state or {}).get("kernels") or {}).get("installed")
    if aiter is None or not installed:
        return result(name, STATIC, SKIPPED, "no kernel install recorded (reported by gfx90a_tree)")
    installed_at = calendar.timegm(time.strptime(installed, "%Y-%m-%dT%H:%M:%SZ"))
    root = Path(aiter["location"])
    modules = jit.kernel_tree_modules(root)
    stale = [module for module in modules
             if (built := root / jit.module_outputs(module)[0]).exists() and built.stat().st_mtime < installed_at]
    if stale:
        return result(name, STATIC, FAILED, f"{len(stale)} JIT modules under {root / 'aiter/jit'} were built before "
                                            f"the gfx90a tree was installed ({installed}), so their kernel tables "
                                            f"lack it ('cannot get heuristic kernel!'): {named(stale)}; remove "
                                            f"them: 'python -m cdna2.host.jit --root {root} --kernel-tree-modules'")
    return result(name, STATIC, PASSED, f"none of the {len(modules)} modules built from the kernel trees predates "
                                        f"the gfx90a tree installed {installed}")


def static_checks(view: HostView, expected_triton: str, timeout: float, aiter_required: bool) -> list[dict]:
    checks = [check(view) for check in (check_gfx90a_tree, check_code_objects, check_manifests, check_patch_sets,
                                        check_record)]
    checks.append(check_triton_version(view, expected_triton))
    checks.extend(import_results(importcheck.run_checks(timeout=timeout), aiter_required))
    checks.extend([check_stale_jit(view), check_kernel_tree_modules(view), check_jit_locks(view)])
    return checks

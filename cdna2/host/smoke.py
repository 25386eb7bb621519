"""On-host smoke test: prove that this host runs AITER's translated gfx90a kernels, or say exactly why it does not.

    PYTHONPATH=<state_dir>/agent <target_python> -B -m cdna2.host.smoke --site-packages DIR --state-dir DIR \\
        --host-arch ARCH|none [--no-gpu-checks] [--expect-triton 3.7.1] [--timeout SECONDS] \\
        [--device-timeout SECONDS] [--warmup-timeout SECONDS] [--case-timeout SECONDS] [--json]

Static checks always run: the gfx90a tree is present and is the one the deploy installed, every code object in it
says gfx90a, no manifest row names a missing kernel, the patch transactions are applied, every other AITER and
vLLM file matches its RECORD, triton is the expected version and ``triton.runtime.autotuner`` imports in a child,
no JIT output built before its inputs were patched survives, no module compiled from the kernel trees predates
the gfx90a tree, no JIT lock is orphaned, ``import aiter`` works where torch is a ROCm build (and must, on a
gfx90a host). GPU checks run ``cdna2.host.smoke_gpu`` in child processes on a host the probe saw as gfx90a
(``--host-arch``): a GPU that cannot be used there fails them, with the reason; they are "skipped" only on a host
with no GPU or another arch, or with ``--no-gpu-checks``, never "passed".

Each GPU child runs isolated (``python -I``: no working directory, PYTHONPATH or user site on its path) from the
state directory, in a session of its own; when it ends, or at its time limit, whatever is left of its process
group is killed and the JIT locks the group held are removed. A warm-up child first runs every case once under a
generous limit (AITER JIT-builds there); then each case runs in a fresh child under a short one.

Standard library only; torch and aiter are imported only inside child processes. Distributions are looked up
with ``--site-packages`` first on the search path. Prints one JSON object on stdout (indented, or one line with
``--json``) and a human summary on stderr; exit 0 when no check failed or was wrong (skips are fine), else 1.
"""

from __future__ import annotations

import argparse
import calendar
import csv
import functools
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from cdna2.host import elf, importcheck, jit, probe, smoke_gpu, state
from cdna2.host import manifest as kernel_manifest

PASSED, FAILED, SKIPPED, WRONG = "passed", "failed", "skipped", "wrong"
STATIC, GPU = "static", "gpu"
DEFAULT_TRITON = "3.7.1"  # the pin AITER needs: 3.7.0 dies with SIGSEGV on AITER's import path (field-notes §2.2)
PATCHED_PACKAGES = ("amd-aiter", "vllm")  # the distributions the deploy patches, by the names backups use
MAX_NAMED = 10  # offenders named in a check's detail; the count is always complete

# Kernel-load lines, captured at fd level in the GPU child. AITER 0.1.7.post2.dev18's AiterAsmKernel prints
# "[aiter] hipModuleLoad: <path> GetFunction: <symbol>" unconditionally; later AITER prints
# "[aiter] LoadKernel: <symbol> hsaco: <path>" at AITER_LOG_LEVEL=info; HIP's API trace (AMD_LOG_LEVEL=3,
# AMD_LOG_MASK=1) logs "hipModuleLoad ( <ptr>, <path> )", the only trace of loaders that print nothing (the
# fmha_v3_fwd loader of 0.1.7.post2.dev18).
LOAD_LINE_PATTERNS = (
    re.compile(r"LoadKernel: (?P<symbol>\S+) hsaco: (?P<path>\S+\.co)\b"),
    re.compile(r"hipModuleLoad: (?P<path>\S+\.co) GetFunction: (?P<symbol>\S+)"),
    re.compile(r"hipModuleLoad \( *\S+, *[\"']?(?P<path>[^\s\"')]+\.co)[\"']? *\)"),
)
GPU_CHILD_ENV = {"AITER_LOG_LEVEL": "info", "AMD_LOG_LEVEL": "3", "AMD_LOG_MASK": "1"}
AGENT_ROOT = Path(__file__).resolve().parents[2]  # holds cdna2/host, as <state_dir>/agent does on a host


@dataclass(frozen=True)
class GpuCheck:
    """A GPU check: the smoke_gpu case it runs and what a load line's code object, relative to the provisioned
    hsa/gfx90a, must match (a regular expression; None: no proof)."""

    name: str
    case: str
    proof: str | None
    what: str


GPU_ARCH = "gfx90a"
BATCHED_FMHA = r"^fmha_v3_fwd/(?!.*_group\.co$)"  # a batch-mode kernel: the group-mode ones end in _group.co
GPU_CHECKS = (
    GpuCheck("fmha_v3_fwd_bf16_hd128", "fmha_v3_fwd_noncausal", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, not causal"),
    GpuCheck("fmha_v3_fwd_bf16_hd128_causal", "fmha_v3_fwd_causal", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, causal"),
    GpuCheck("fmha_v3_fwd_bf16_hd128_partial_tile", "fmha_v3_fwd_partial_tile", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, causal, seqlen 1000 (a partial last tile)"),
    # The path vLLM's prefill takes: group mode, its own kernels.
    GpuCheck("fmha_v3_fwd_varlen_group", "fmha_v3_varlen_group", r"^fmha_v3_fwd/.*_group\.co$",
             "varlen fmha_v3_fwd bf16 head_dim 128, causal, lengths 129 and 383"),
    GpuCheck("pa_fwd_asm_bf16_block16_gqa8", "pa_fwd_asm", r"^pa/", "pa_fwd_asm bf16 block 16 GQA 8"),
    # The sliding-window path is CK, not ASM, in every AITER we know; the guard is its result, not a load line.
    GpuCheck("sliding_window_attention", "sliding_window", None, "sliding-window varlen attention (window 256)"),
)


def result(name: str, kind: str, status: str, detail: str) -> dict:
    return {"name": name, "kind": kind, "status": status, "detail": detail}


def _named(items: list[str]) -> str:
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
            current = probe.file_sha256(self.root / relative)
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
    distributions = probe.read_distributions(errors)
    records = probe.read_records(distributions, errors)
    aiter = probe.read_aiter(distributions.get("amd-aiter"), records.get("amd-aiter", ""), errors,
                             facts=probe.read_develop_aiter(distributions, ()))
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
                                            f"gfx90a: {_named(wrong)}; the GPU cannot load them: run the deploy to "
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
                                            f"{_named(dangling)}; run the deploy to reinstall the pruned tree")
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
            problems.append(f"{package}: {_named(bad)}; run the deploy to patch it again")
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
        found = probe.record_mismatches(Path(dist["location"]), view.records[package],
                                        skip_paths=touched.get(package, set()))
        mismatches.extend(f"{package}: {path} (changed)" for path in found["mismatched"])
        mismatches.extend(f"{package}: {path} (missing)" for path in found["missing"])
        counts.append(f"{found['checked']} {package}")
    if not counts and not checkouts:
        return result(name, STATIC, FAILED, f"neither amd-aiter nor vllm is installed for {sys.executable}")
    if mismatches:
        return result(name, STATIC, FAILED, f"{len(mismatches)} files differ from their RECORD: {_named(mismatches)}; "
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
                                            f"{_named([str(root / path) for root, path in stale])}; remove them: "
                                            f"{_named(sorted(fixes))}")
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
                                            f"build of those modules would wait forever: {_named(orphans)}; clear "
                                            f"them with 'python -m cdna2.host.jit --root {root}'")
    if held:
        return result(name, STATIC, PASSED, f"no orphan lock; held by a running build: {_named(held)}")
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
                                            f"lack it ('cannot get heuristic kernel!'): {_named(stale)}; remove "
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


# --- GPU checks ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuLimits:
    """Seconds each GPU child may take: the device probe, the warm-up (JIT builds, first loads), each case."""

    device: float = 120.0
    warmup: float = 3600.0
    case: float = 180.0


@dataclass(frozen=True)
class GpuRun:
    """Where the GPU children run and what they must use: the provisioned AITER and its gfx90a tree."""

    state_dir: Path  # the children's working directory: nothing in it shadows the installed aiter
    site_packages: Path  # holds the provisioned aiter/ and, under aiter/jit/build, its JIT locks
    tree: Path | None  # the provisioned hsa/gfx90a
    limits: GpuLimits


def process_group(pgid: int) -> set[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "(comm)": state, ppid, pgrp, ...
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.add(int(stat.parent.name))
    return members


def kill_group(pgid: int, wait: float = 10.0) -> list[int]:
    """SIGKILL every process of group ``pgid`` and wait until none is left; the pids that were killed."""
    members = sorted(process_group(pgid))
    if members:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + wait
        while process_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return members


def run_in_own_group(command: list[str], run: GpuRun, env: dict[str, str], timeout: float) -> dict:
    """Run ``command`` in a session of its own from the state directory; after it ends, or at ``timeout``, kill
    whatever is left of its process group and remove the JIT locks the group held (a killed AITER build never
    releases its lock, and every later build would wait on it forever).

    Returns ``returncode`` (None when it was killed at the limit), ``stdout``, ``stderr`` and ``cleanup`` (what
    was killed and removed, for the detail; empty when nothing was).
    """
    with subprocess.Popen(command, cwd=run.state_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
            returncode = child.returncode
        except subprocess.TimeoutExpired:
            stdout, stderr, returncode = "", "", None
        held = jit.locks_held_by(run.site_packages, process_group(child.pid))
        killed = kill_group(child.pid)
        if returncode is None:
            try:
                stdout, stderr = child.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process that left the group still holds the pipes
                child.kill()
    removed = jit.remove_unheld(held)
    cleanup = []
    if killed:
        cleanup.append(f"killed its process group ({len(killed)} processes: {_named([str(pid) for pid in killed])})")
    if removed:
        cleanup.append(f"removed the JIT locks it held: {_named([str(lock) for lock in removed])}")
    return {"returncode": returncode, "stdout": stdout or "", "stderr": stderr or "", "cleanup": "; ".join(cleanup)}


# -I: isolated mode, so neither the working directory, PYTHONPATH nor the user's site-packages can put another
# aiter/ before the installed one; the agent is put on sys.path by hand instead.
CHILD_BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from cdna2.host.smoke_gpu import main; "
                   "sys.exit(main(sys.argv[1:]))")


def _gpu_child(args: list[str], run: GpuRun, timeout: float) -> dict:
    """Run ``cdna2.host.smoke_gpu ARGS`` in a fresh process group; its last stdout line is its JSON report.

    The child's captured fd output goes to a file here, so what it printed before dying is still reported.
    """
    env = {**os.environ, **GPU_CHILD_ENV}
    with tempfile.TemporaryDirectory(prefix="cdna2-smoke-", dir=run.state_dir) as scratch:  # the tool's own dir
        capture_file = Path(scratch, "captured.log")
        command = [sys.executable, "-I", "-B", "-c", CHILD_BOOTSTRAP, str(AGENT_ROOT), *args]
        if args[0] == "run":
            command += ["--capture-file", str(capture_file)]
        ended = run_in_own_group(command, run, env, timeout)
        cleanup = f"; {ended['cleanup']}" if ended["cleanup"] else ""
        if ended["returncode"] is None:
            return {"error": f"timed out after {timeout:g} s{cleanup}", "timed_out": True,
                    "captured_tail": _tail_of(capture_file)}
        lines = ended["stdout"].strip().splitlines()
        if ended["returncode"] == 0 and lines and lines[-1].startswith("{"):
            return {**json.loads(lines[-1]), "cleanup": ended["cleanup"]}
        # AITER's HIP_CALL prints the HIP error and calls exit(0): a child can end "successfully" with no report.
        number = importcheck.signal_of(ended["returncode"])
        how = f"{signal.Signals(number).name} (exit {128 + number})" if number else f"exit {ended['returncode']}"
        tail = (ended["stdout"] + ended["stderr"]).strip()[-800:]
        return {"error": f"'smoke_gpu {' '.join(args)}' ended with {how} and no report{': ' + tail if tail else ''}"
                         f"{cleanup}", "captured_tail": _tail_of(capture_file)}


def _tail_of(path: Path) -> str:
    return path.read_bytes()[-smoke_gpu.CAPTURED_TAIL:].decode("utf-8", errors="replace") if path.is_file() else ""


def load_lines(captured: str) -> list[dict]:
    """Kernel-load lines in captured output: the code object's path (slashes collapsed) and the raw line."""
    loads = []
    for line in captured.splitlines():
        for pattern in LOAD_LINE_PATTERNS:
            match = pattern.search(line)
            if match:
                loads.append({"path": re.sub(r"/+", "/", match.group("path")), "line": line.strip()})
                break
    return loads


def _within(path: str, directory: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def _relative_in(path: str, directory: Path | None) -> str | None:
    """``path`` relative to ``directory`` (symlinks resolved), or None when it lies outside."""
    if directory is None or not _within(path, directory):
        return None
    return Path(os.path.realpath(path)).relative_to(os.path.realpath(directory)).as_posix()


def provenance_problem(report: dict, run: GpuRun) -> str | None:
    """Why the child's AITER is not the provisioned one: its ``aiter.__file__`` or ``AITER_ASM_DIR`` lies elsewhere."""
    package, aiter_file, asm_dir = run.site_packages / "aiter", report.get("aiter_file"), report.get("aiter_asm_dir")
    if not aiter_file or not _within(aiter_file, package):
        return f"the child imported aiter from {aiter_file}, not from the provisioned {package}"
    tree = run.tree
    if tree is None or not asm_dir or os.path.realpath(asm_dir) not in (os.path.realpath(tree),
                                                                        os.path.realpath(tree.parent)):
        return f"AITER_ASM_DIR is {asm_dir}, not the provisioned kernel tree {tree} (or its hsa directory)"
    return None


def _figures(report: dict) -> str:
    first = report.get("first_bad_element")
    element = (f"; the first, element {first['index']}, is {first['got']:.4g} against {first['ref']:.4g}"
               if first else "")
    unwritten = f", {report['unwritten']} never written (still NaN)" if report["unwritten"] else ""
    rel_rms = f"{report['rel_rms']:.2e}" if report["rel_rms"] is not None else "non-finite"
    return (f"rel_rms {rel_rms} of rms(ref), worst row {report['worst_row_rel_rms']:.2e}, "
            f"{report['bad_elements']} of {report['elements']} elements outside the bound{unwritten}{element}")


def judge_gpu_case(check: GpuCheck, report: dict, run: GpuRun) -> dict:
    """The check's status from the child's report: failed, wrong (a result off the reference), or passed."""
    cleanup = f"; {report['cleanup']}" if report.get("cleanup") else ""
    if report.get("error"):
        output = report.get("captured_tail", "").strip()[-400:]
        return result(check.name, GPU, FAILED, f"{check.what}: {report['error']}"
                                               f"{'; output: ' + output if output else ''}{cleanup}")
    problem = provenance_problem(report, run)
    if problem:
        return result(check.name, GPU, FAILED, f"{check.what}: {problem}, so this run says nothing about the "
                                               f"provisioned AITER{cleanup}")
    if not report["prefilled"]:
        return result(check.name, GPU, FAILED, f"{check.what}: AITER's output did not land in the NaN-filled "
                                               f"memory, so an element the kernel never wrote cannot be told from "
                                               f"stale memory{cleanup}")
    figures = f"{_figures(report)}, {report['elapsed_ms']:.3f} ms"
    loads = load_lines(report.get("captured", ""))
    loaded = f"; loaded {_named(sorted({load['path'] for load in loads}))}" if loads else ""
    if not smoke_gpu.passes(report):
        return result(check.name, GPU, WRONG, f"WRONG: {check.what} differs from the torch reference ({figures}; "
                                              f"needs every element within {smoke_gpu.ATOL:.2e} * max|v| + "
                                              f"{smoke_gpu.RTOL:.2e} * |ref| and every row within "
                                              f"{smoke_gpu.ROW_REL_RMS_LIMIT:.2e}){loaded}{cleanup}")
    if check.proof is None:
        return result(check.name, GPU, PASSED, f"{check.what} matches the reference ({figures}){loaded}{cleanup}")
    tree = run.tree
    proof = [load for load in loads
             if (inside := _relative_in(load["path"], tree)) is not None and re.search(check.proof, inside)]
    if not proof:
        return result(check.name, GPU, FAILED, f"{check.what} is correct ({figures}) but no kernel-load line names "
                                               f"a code object matching {check.proof} in the provisioned {tree}, so "
                                               f"a fallback computed it{loaded or ' (no load line at all)'}{cleanup}")
    return result(check.name, GPU, PASSED, f"{check.what} matches the reference ({figures}); loaded "
                                           f"{_named(sorted({load['path'] for load in proof}))}{cleanup}")


def gpu_checks(host_arch: str | None, run: GpuRun | None,
               no_gpu_reason: str | None = None) -> tuple[list[dict], dict | None]:
    """Every GPU check and the device seen.

    Skipped only where they cannot apply: no GPU can exist (``no_gpu_reason``: an image built where the probe found
    none and the arch came from data), the checks are off for this host (``run`` None), or the host probe found
    no GPU or one of another arch. On a host the probe saw as gfx90a, a GPU that cannot be used (a crashed, hung
    or deviceless probe, torch or AITER missing) fails every check with the reason.
    """
    if no_gpu_reason:
        return [result(check.name, GPU, SKIPPED, f"skipped: {no_gpu_reason}") for check in GPU_CHECKS], None
    if run is None:
        return [result(check.name, GPU, SKIPPED, "skipped: GPU checks are off for this host (smoke_gpu_checks)")
                for check in GPU_CHECKS], None
    if host_arch != GPU_ARCH:
        why = f"the host probe saw {host_arch}, these checks are for {GPU_ARCH}" if host_arch else \
            "the host probe found no GPU"
        return [result(check.name, GPU, SKIPPED, f"skipped: {why}") for check in GPU_CHECKS], None
    probe_report = _gpu_child(["device"], run, run.limits.device)
    reason = probe_report.get("error") or probe_report.get("reason")
    if reason:
        return [result(check.name, GPU, FAILED, f"the host probe saw {GPU_ARCH} but its GPU cannot be used: {reason}")
                for check in GPU_CHECKS], probe_report.get("device")
    warmup = _gpu_child(["warmup", *(check.case for check in GPU_CHECKS)], run, run.limits.warmup)
    if warmup.get("timed_out"):
        return [result(check.name, GPU, FAILED, f"{check.what}: the warm-up (AITER's JIT builds and first loads) "
                                                f"{warmup['error']}") for check in GPU_CHECKS], probe_report["device"]
    return [judge_gpu_case(check, _gpu_child(["run", check.case], run, run.limits.case), run)
            for check in GPU_CHECKS], probe_report["device"]


# --- the run ------------------------------------------------------------------------------------------------------

def run_smoke(site_packages: Path, state_dir: Path, host_arch: str | None, expected_triton: str = DEFAULT_TRITON,
              timeout: float = 1800.0, limits: GpuLimits | None = GpuLimits(),
              no_gpu_reason: str | None = None) -> dict:
    """Every check; ``limits`` None turns the GPU checks off, ``no_gpu_reason`` says why none can exist (an image
    built without a GPU): either way the report says so."""
    gpu_required = host_arch == GPU_ARCH and limits is not None and not no_gpu_reason
    with searched_first(site_packages):
        view = read_host(site_packages, state_dir)
        checks = static_checks(view, expected_triton, timeout, gpu_required)
    run = GpuRun(state_dir, site_packages, view.gfx90a_tree, limits) if limits is not None else None
    gpu, device = gpu_checks(host_arch, run, no_gpu_reason)
    checks.extend(gpu)
    counts = {status: sum(check["status"] == status for check in checks) for status in (PASSED, FAILED, SKIPPED, WRONG)}
    return {"checks": checks, **counts, "device": device, "host_arch": host_arch, "gpu_checks": run is not None}


def summary_lines(report: dict) -> list[str]:
    lines = [f"smoke: {check['status']:>7}  {check['kind']:<6} {check['name']}: {check['detail']}"
             for check in report["checks"]]
    lines.append(f"smoke: {report[PASSED]} passed, {report[FAILED]} failed, {report[WRONG]} wrong, "
                 f"{report[SKIPPED]} skipped")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--site-packages", type=Path, required=True, help="site-packages holding AITER and vLLM")
    parser.add_argument("--state-dir", type=Path, required=True, help="this tool's state directory on the host")
    parser.add_argument("--host-arch", required=True,
                        help="the GPU arch the host probe saw ('none' when it found no GPU): on gfx90a a GPU that "
                             "cannot be used fails the GPU checks")
    parser.add_argument("--no-gpu-checks", action="store_true",
                        help="skip the GPU checks (only for hosts whose GPU is a stand-in, such as the lab's)")
    parser.add_argument("--expect-triton", default=DEFAULT_TRITON, help="triton version required (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per static-check child")
    parser.add_argument("--device-timeout", type=float, default=GpuLimits.device,
                        help="seconds for the GPU device probe child (%(default)g)")
    parser.add_argument("--warmup-timeout", type=float, default=GpuLimits.warmup,
                        help="seconds for the GPU warm-up child, which may JIT-build AITER modules (%(default)g)")
    parser.add_argument("--case-timeout", type=float, default=GpuLimits.case,
                        help="seconds for each GPU case after the warm-up (%(default)g)")
    parser.add_argument("--no-gpu", metavar="REASON",
                        help="no GPU can exist here (an image build): skip every GPU check with this reason")
    parser.add_argument("--json", action="store_true", help="print the JSON report on one line (for the deploy)")
    args = parser.parse_args(argv)
    limits = None if args.no_gpu_checks else GpuLimits(args.device_timeout, args.warmup_timeout, args.case_timeout)
    report = run_smoke(args.site_packages, args.state_dir, None if args.host_arch == "none" else args.host_arch,
                       args.expect_triton, args.timeout, limits, args.no_gpu)
    print(json.dumps(report, sort_keys=True) if args.json else json.dumps(report, indent=2, sort_keys=True))
    print("\n".join(summary_lines(report)), file=sys.stderr)
    return 1 if report[FAILED] or report[WRONG] else 0


if __name__ == "__main__":
    sys.exit(main())

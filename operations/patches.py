"""Patch AITER's and vLLM's arch gates on a host from a plan made on the controller (cdna2.patches)."""

from __future__ import annotations

import io
import json

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from cdna2.patches import PackagePlan
from cdna2.patches.contents import target_files
from operations.agent import agent_command, lease_command, run_tag
from operations.util import fail_host_command, first_pass


def probe_files(probe: dict, package: str) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """The target files' bytes and RECORD hashes of ``package`` as the probe of this host reported them (bytes it
    left out because the controller holds them come from the controller's copies)."""
    return target_files(host.name, probe["patch_targets"][package]["files"])


def absent_dirs(probe: dict, package: str) -> list[str]:
    """The directories adding ``package``'s absent target files would create on this host, shallowest first."""
    return probe["patch_targets"][package]["absent_dirs"]


def change_manifest(plan: PackagePlan, site_packages: str, state_dir: str) -> dict:
    """The transaction cdna2.host.txn runs: each staged file sits beside its target, or above the directories the
    transaction creates (same filesystem), named for this run in a shared environment (``run_tag``)."""
    return plan.transaction(site_packages, f"{state_dir}/backups/{plan.package}",
                            plan.staged_paths(site_packages, run_tag(state_dir)))


@operation()
def patched_package(plan: PackagePlan, site_packages: str, target_python: str, state_dir: str):
    """
    Apply a package's patch plan on the host, all or nothing, and make AITER's JIT forget what it built before.

    + plan: ``cdna2.patches.plan_package(...)`` for this host and package (made from the probe's file contents)
    + site_packages: the directory holding the package on the host (a develop AITER's checkout)
    + target_python: interpreter that runs the host agent
    + state_dir: the tool's state directory on the host (backups of the originals, staging)

    Transaction:
        every new file is uploaded beside its target (or, for a file in a directory the package lacks, in the deepest
        directory it has), then ``cdna2.host.txn apply`` checks every current and staged hash, and that each
        directory to create is absent, before changing anything; it records and creates those directories, keeps
        the pristine originals for rollback and journals the renames, so an interrupted run leaves the package
        either pristine or fully patched (rollback removes the directories again, each only if empty). JIT
        modules and build directories built from the changed inputs are removed afterwards (``cdna2.host.jit``).

    Dry run:
        the unified diff of every file is logged on the first pass (all of ``--dry``).

    **Example:**

    .. code:: python

        patched_package(
            name="patches: vllm arch gates are open for gfx90a",
            plan=plan_package(catalog, "vllm", "0.23.0", files, record, enabled_optional=[]),
            site_packages="/opt/venv/lib/python3.11/site-packages",
            target_python="/opt/venv/bin/python",
            state_dir="/var/lib/cdna2",
        )
    """
    label = f"{plan.package} {plan.installed_version}".strip()
    if plan.status == "patched":
        host.noop(f"{label} already patched ({', '.join(plan.sets)})")
        return
    if plan.status != "apply":
        message = f"patches: {label} refused, nothing written: " + "; ".join(plan.reasons)
        if first_pass():
            logger.warning(f"{host.print_prefix}{message}")
        yield fail_host_command(message)
        return
    if first_pass():
        logger.info(f"{host.print_prefix}patches: {label}: sets {', '.join(plan.sets)}, "
                    f"{len(plan.changes)} file(s) change:")
        for change in plan.changes:
            logger.info(change.diff)
        for directory in plan.new_directories:
            logger.info(f"{host.print_prefix}patches: {label}: creates directory {site_packages}/{directory}")
    manifest = change_manifest(plan, site_packages, state_dir)
    manifest_path = f"{state_dir}/staging/patch-{plan.package}{run_tag(state_dir)}.json"
    yield lease_command(target_python, state_dir)
    yield StringCommand("mkdir", "-p", QuoteString(f"{state_dir}/staging"))
    for change, entry in zip(plan.changes, manifest["changes"]):
        yield FileUploadCommand(io.BytesIO(change.new_bytes), entry["staged"])
    yield FileUploadCommand(io.BytesIO(json.dumps(manifest, indent=1).encode()), manifest_path)
    yield agent_command(target_python, state_dir, "txn", "apply", manifest_path)
    if plan.jit_invalidations:
        yield agent_command(target_python, state_dir, "jit", "--root", site_packages, *plan.jit_invalidations)


@operation()
def transaction_finished(backup_dir: str, target_python: str, state_dir: str):
    """
    Finish a patch transaction a killed command left journalled (``cdna2.host.txn recover``): its renames done, or
    done now, and its journal dropped. An apply does this first too; this is for a package the plan finds patched
    already, whose files were all renamed before the kill.

    + backup_dir: the package's backup directory, holding ``journal.json``
    + target_python, state_dir: run the host agent

    **Example:**

    .. code:: python

        transaction_finished(name="patches vllm: an interrupted transaction is finished",
                             backup_dir="/var/lib/cdna2/backups/vllm", target_python="/opt/venv/bin/python",
                             state_dir="/var/lib/cdna2")
    """
    yield lease_command(target_python, state_dir)
    yield agent_command(target_python, state_dir, "txn", "recover", "--backup-dir", backup_dir)

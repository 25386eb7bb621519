"""Return a host to stock AITER and vLLM, and prove it against their RECORD files."""

from __future__ import annotations

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation

from cdna2.drift import checkout_changes
from cdna2.reports.run import FAILED, RunReport
from cdna2.rollback import RollbackPlan
from cdna2.wheels import PipAction
from operations.agent import agent_command, lease_command
from operations.facts import host_probe
from operations.util import fail_host_command
from operations.wheels import pip_command, pip_temporary_dir


@operation()
def rolled_back(plan: RollbackPlan, triton: PipAction | None, target_python: str, state_dir: str):
    """
    Undo everything the deploy did on the host.

    + plan: ``cdna2.rollback.plan_rollback(...)`` for this host
    + triton: the pip action that restores the pre-deploy triton, or None
    + target_python: interpreter that runs the host agent
    + state_dir: the tool's state directory on the host, emptied last

    Order:
        patched files first (``cdna2.host.txn revert`` restores each original and checks it against the hash
        recorded before patching; a file edited since is refused, not overwritten), then the translated kernel
        trees, the JIT outputs built from patched inputs, triton, and last the tool's state directory (the agent
        that ran the earlier steps lives there).

    **Example:**

    .. code:: python

        rolled_back(
            name="rollback: AITER and vLLM are stock again",
            plan=plan_rollback(probe, probe["state_dir_used"], restore_triton=False, kernel_jit_patterns=[]),
            triton=None, target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2",
        )
    """
    if plan.problems:
        yield fail_host_command("rollback: " + "; ".join(plan.problems))
        return
    if plan.empty:
        host.noop("nothing to roll back: no patch backups, no gfx90a tree, no tool state")
        return
    yield lease_command(target_python, state_dir)
    for revert in plan.reverts:
        yield agent_command(target_python, state_dir, "txn", "revert", "--backup-dir", revert["backup_dir"],
                            "--root", revert["root"])
    if plan.remove_kernels:
        yield agent_command(target_python, state_dir, "kernels", "remove", "--hsa-root", plan.hsa_root,
                            "--state-dir", state_dir)
    if plan.jit_patterns:
        yield agent_command(target_python, state_dir, "jit", "--root", plan.site_packages, *plan.jit_patterns)
    if triton is not None:
        yield StringCommand("mkdir", "-p", QuoteString(pip_temporary_dir(state_dir)))
        yield pip_command(triton, state_dir, target_python)
    if plan.clear_state and plan.environment_dir:
        # A shared environment's directory of the tool (identity, state, agent): the environment is stock again.
        yield StringCommand("rm", "-rf", QuoteString(plan.environment_dir))
    elif plan.clear_state:
        # The state dir itself may be a mount point: empty it rather than remove it.
        yield StringCommand("find", QuoteString(state_dir), "-mindepth", "1", "-delete")


@operation()
def stock_files_verified(report: RunReport, packages: list[str], target_python: str, rocm_root: str,
                         state_dir: str, patched: dict[str, list[str]] | None = None):
    """
    Check, after the rollback ran, that every AITER and vLLM file matches its RECORD.

    + report: the run report, which gets a ``record`` column per host
    + packages: the distributions to check
    + target_python, rocm_root, state_dir: as for the host probe
    + patched: per package, the files the patch backups held before the rollback (paths under their root)

    The check reads the host (a fresh probe with a RECORD comparison) and changes nothing; it fails the host when
    any file differs. During ``--dry`` nothing has been rolled back yet, so it only says it will run. A develop
    AITER checkout is checked by ``git status`` instead: it fails on what the deploy wrote there (the patched
    files, the kernel trees) differing from HEAD; the operator's own changes are named, not failed.

    **Example:**

    .. code:: python

        stock_files_verified(
            name="rollback: every AITER and vLLM file matches RECORD", report=report,
            packages=["amd-aiter", "vllm"], target_python="/opt/venv/bin/python", rocm_root="/opt/rocm",
            state_dir="/var/lib/cdna2",
        )
    """
    if not state.is_executing:
        host.noop("RECORD check runs after the rollback")
        return
    probe = host_probe(host, state_dir, target_python=target_python, rocm_root=rocm_root, record_check=packages)
    lines, bad = [], []
    for package, result in sorted(probe["record_check"].items()):
        if "git" in result:
            left, others = ([result["error"]], []) if result["error"] else checkout_changes(
                result, set((patched or {}).get(package, ())))
            lines.append(f"{package}: checkout {result['git']} " + (
                f"differs from git HEAD where the deploy wrote: {', '.join(left[:10])}" if left
                else "is at git HEAD where the deploy wrote") + (
                f" (the operator's own changes, left: {', '.join(others[:10])})" if others else ""))
            bad.extend(f"{package} {path}" for path in left)
            continue
        if result["unproven"]:
            lines.append(f"{package}: unproven, {result['unproven']}; reinstall {package}")
            bad.append(f"{package} (nothing checked)")
            continue
        differing = result["mismatched"] + result["missing"]
        lines.append(f"{package}: {result['checked'] - len(differing)}/{result['checked']} files match RECORD")
        bad.extend(f"{package} {path}" for path in differing)
    # A package not installed has no file to be stock or not: named, so the line never reads as a check of it.
    lines += [f"{package}: not installed, nothing to check" for package in packages
              if package not in probe["record_check"]]
    report.step(host.name, "record", FAILED if bad else "ok", "; ".join(lines))
    if bad:
        yield fail_host_command(f"rollback: files differ from RECORD or cannot be checked: {', '.join(bad[:10])}")
        return
    host.noop("; ".join(lines))

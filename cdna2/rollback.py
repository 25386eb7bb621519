"""What a rollback must do on one host, decided from its probe alone (pure functions, no I/O).

Rollback returns a host to stock AITER and vLLM: every patched file restored from the pristine originals the
patch transactions kept, the translated hsa/gfx90a tree and its previous copy removed, the JIT outputs built from
patched inputs removed, triton restored to the pre-deploy version when asked, and the tool's state cleared. Each
part is planned only when the probe shows something to undo, so a host that was never provisioned, or only half,
gets exactly what it needs, and a second rollback plans nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RollbackPlan:
    reverts: list[dict[str, str]] = field(default_factory=list)  # {package, backup_dir, root}
    remove_kernels: bool = False
    hsa_root: str | None = None
    jit_patterns: list[str] = field(default_factory=list)
    site_packages: str | None = None
    restore_triton: str | None = None
    clear_state: bool = False
    environment_dir: str | None = None  # a shared environment's .cdna2, removed whole instead of the state emptied
    problems: list[str] = field(default_factory=list)  # what blocks the rollback (the host is failed, untouched)

    @property
    def empty(self) -> bool:
        return not (self.reverts or self.remove_kernels or self.restore_triton or self.clear_state)

    def describe(self) -> list[str]:
        lines = [f"restore the pristine {r['package']} files kept in {r['backup_dir']}" + (
            f", then remove the directories the patch created, each if empty: {', '.join(r['created_directories'])}"
            if r["created_directories"] else "") for r in self.reverts]
        if self.remove_kernels:
            lines.append(f"remove {self.hsa_root}/gfx90a and its previous copy")
        if self.jit_patterns:
            lines.append(f"remove JIT outputs built from patched inputs ({len(self.jit_patterns)} patterns)")
        if self.restore_triton:
            lines.append(f"reinstall triton=={self.restore_triton} (recorded before the first deploy)")
        if self.clear_state:
            lines.append(f"remove {self.environment_dir}" if self.environment_dir
                         else "clear the tool's state directory")
        return lines


def plan_rollback(probe: dict[str, Any], state_dir_used: bool, restore_triton: bool,
                  kernel_jit_patterns: list[str], environment_dir: str | None = None) -> RollbackPlan:
    """Plan the rollback of a probed host. ``state_dir_used``: the probe found the tool's state dir non-empty.
    ``environment_dir``: the shared environment's ``.cdna2`` when the state is there (its identity goes too)."""
    shared_left = bool(environment_dir) and bool((probe["python"] or {}).get("identity"))
    plan = RollbackPlan(clear_state=state_dir_used or shared_left, environment_dir=environment_dir)
    for package, backup in sorted(probe["backups"].items()):
        if backup["files"] or backup["journal"]:
            plan.reverts.append({"package": package, "backup_dir": backup["backup_dir"], "root": backup["root"],
                                 "created_directories": backup["created_directories"]})
            plan.jit_patterns.extend(backup["jit_invalidations"])
    aiter = probe["aiter"]
    if aiter and (aiter["gfx90a_digest"] is not None or aiter["gfx90a_previous"]):
        plan.remove_kernels, plan.hsa_root = True, aiter["hsa_root"]
        plan.jit_patterns.extend(kernel_jit_patterns)
    plan.jit_patterns = sorted(set(plan.jit_patterns))
    dist = probe["distributions"].get("amd-aiter")
    plan.site_packages = dist["location"] if dist else None
    baseline = (probe["state"] or {}).get("baseline") or {}
    triton_now = (probe["distributions"].get("triton") or {}).get("version")
    if restore_triton:
        if baseline.get("triton"):
            plan.restore_triton = baseline["triton"] if baseline["triton"] != triton_now else None
        elif state_dir_used:
            # Deployed, yet no baseline: guessing a version would be worse than saying so.
            plan.problems.append("rollback_restore_triton is on but this host's state records no pre-deploy triton "
                                 "version; reinstall the triton you want by hand")
        # Never deployed, or already rolled back: there is nothing to restore triton to.
    if plan.jit_patterns and plan.site_packages is None:
        plan.problems.append("JIT outputs must be removed but amd-aiter is not installed in the target environment")
    return plan

"""Drift: how a provisioned host differs now from what the deploy recorded it left there (pure, no I/O).

Verify reads a fresh probe and the ``deployed`` record the last deploy wrote on the host, re-plans the patch sets
against the files as they are, and names every difference an operator must act on: packages upgraded or replaced
underneath us, a patch lost or a patched file edited, kernels missing or altered, any other file no longer
matching its RECORD. A re-run of the deploy repairs what it can and refuses, naming the file, what it must not
overwrite.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Mapping

from cdna2.kernels import Policy
from cdna2.plan import installed_kernel_digest, installed_versions

# Untracked paths of a develop checkout that a deploy puts there: the translated tree and its previous copy.
CHECKOUT_TREES = ("hsa/gfx90a/", "hsa/.gfx90a.previous/")

# The fields of a recorded kernel policy (Policy.record), how drift names them, and where today's value comes from.
KERNEL_POLICY_FIELDS = (("policy", "kernel_hazard_policy", "host data"),
                        ("audit_version", "MFMA wait-state audit version", "this tool"),
                        ("pad_mfma_hazards", "pad_mfma_hazards", "host data"),
                        ("int8_k32_split", "int8_k32_split", "host data"))


def _shown(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def kernel_policy_drift(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[str]:
    """Each field of the kernel policy the installed tree was made under (the deployed record's
    ``kernel_hazards``) that differs from the policy a deploy would translate under now (Policy.record)."""
    if recorded is None:
        return [f"kernels made under a deploy without the MFMA wait-state audit; now kernel_hazard_policy "
                f"{now['policy']}, audit {now['audit_version']}: run the deploy to install the tree these give"]
    made = Policy.read_record(dict(recorded))
    return [f"{name}: recorded {_shown(made.get(key))}, {source} {_shown(now[key])}: run the deploy to install the "
            "tree these give" for key, name, source in KERNEL_POLICY_FIELDS if made.get(key) != now[key]]


def find_drift(probe: dict[str, Any], plans: Mapping[str, Any],
               kernel_policy: Mapping[str, Any] | None = None) -> list[str]:
    """Every drift of a probed host; ``plans`` maps each patched package to its fresh ``PackagePlan``;
    ``kernel_policy`` the kernel policy a deploy would translate under now (Policy.record)."""
    deployed = (probe["state"] or {}).get("deployed")
    if deployed is None:
        return ["not provisioned: no deployed state is recorded on this host (run the deploy)"]
    drift = []
    now = installed_versions(probe)
    for name, version in sorted(deployed["packages"].items()):
        if now.get(name) != version:
            found = now.get(name) or "absent"
            drift.append(f"{name} changed underneath us: deployed {version or 'absent'}, found {found}")
    expected_kernels = deployed["kernels"]
    found_kernels = installed_kernel_digest(probe)  # families the smoke step withheld are no drift
    if expected_kernels and found_kernels is None:
        drift.append("kernels missing: hsa/gfx90a is gone")
    elif expected_kernels and found_kernels != expected_kernels:
        drift.append(f"kernels altered: hsa/gfx90a digest {found_kernels[:12]}, deployed {expected_kernels[:12]}")
    if expected_kernels and kernel_policy is not None:
        drift += kernel_policy_drift(deployed.get("kernel_hazards"), kernel_policy)
    patched_files = set()
    for package, sets in sorted(deployed["patch_sets"].items()):
        plan = plans.get(package)
        if plan is None:
            drift.append(f"{package} patched at deploy but not installed now")
            continue
        patched_files.update(change.path for change in plan.changes)
        patched_files.update((probe["backups"].get(package) or {}).get("files", {}))
        if plan.status == "apply":
            drift.append(f"{package} patch lost: {', '.join(change.path for change in plan.changes)} "
                         f"no longer patched ({', '.join(sets)})")
        elif plan.status != "patched":
            drift.append(f"{package} patched files changed: {'; '.join(plan.reasons)}")
        elif sorted(plan.sets) != sorted(sets):
            drift.append(f"{package} patch sets are {', '.join(plan.sets)}, deployed {', '.join(sets)}")
    config_files = ((probe["patch_targets"].get("vllm") or {}).get("files") or {})
    for path, installed in sorted((deployed.get("fp8_block_configs") or {}).items()):
        name = path.rsplit("/", 1)[-1]
        if path not in config_files:
            drift.append(f"fp8 config {name} not checked: verify with the fp8_block_configs the deploy had")
        elif config_files[path] is None:
            drift.append(f"fp8 config {name} missing from vLLM's config directory")
        elif config_files[path]["current"] != installed:
            drift.append(f"fp8 config {name} edited since the deploy installed it")
    for package, result in sorted(probe["record_check"].items()):
        if "git" in result:  # a develop checkout: see checkout_changes
            if result["error"]:
                drift.append(f"{package} checkout {result['git']} not checked: {result['error']}")
            continue
        if result["unproven"]:
            drift.append(f"{package} not checked: {result['unproven']}; reinstall it, then run the deploy")
            continue
        edited = [path for path in result["mismatched"] if path not in patched_files]
        if edited or result["missing"]:
            drift.append(f"{package} files differ from RECORD: "
                         + ", ".join((edited + [f"{path} (missing)" for path in result["missing"]])[:10]))
    return drift


def checkout_changes(status: Mapping[str, Any], ours: Collection[str]) -> tuple[list[str], list[str]]:
    """A develop checkout's ``git status`` (the probe's ``checkout_status``) split into what this tool writes there
    (``ours``: files by their repository path, and the kernel trees) and the rest, the operator's own work in
    progress, which is named but never overwritten or counted as drift."""
    own, others = [], []
    for path in (*status["mismatched"], *status["missing"], *status["untracked"]):
        mine = path in ours or any(path.startswith(tree) for tree in CHECKOUT_TREES)
        (own if mine else others).append(path)
    return own, others

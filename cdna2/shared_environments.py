"""Hosts whose target environment is one directory on a shared filesystem: how a run tells them apart, why one is
refused, and what a host that does not write its environment checks. No pyinfra here; the host side is
cdna2/host/shared_env.py (layout) and cdna2/host/env_lock.py (lock, commands).

A run groups its hosts by the environment each probe found: by the identity a deploy wrote into it
(``<prefix>/.cdna2/identity.json``) once there is one, else by the directory's fingerprint (inode and mtime; see
cdna2/host/environment.py). The first host of a group in inventory order writes; with host data
``shared_environment`` the others wait for it and check the result through their own mounts, else they are refused.
"""

from __future__ import annotations

import os
from typing import Any

WRITER, CHECKER = "writer", "checker"


def environment_key(probe: dict[str, Any]) -> str | None:
    """What tells this host's environment from others in one run: its identity, else its fingerprint."""
    python = probe.get("python") or {}
    if python.get("identity"):
        return f"identity {python['identity']['id']}"
    return f"fingerprint {python['fingerprint']}" if python.get("fingerprint") else None


def shared_environment_refusal(probe: dict[str, Any], claimed_by: str | None, deployed_as_one: bool) -> str | None:
    """Why this host is refused when another host of the run (``claimed_by``, first in inventory order) writes the
    very directory its target environment is, and the two are not both marked ``shared_environment``: two writers
    in one environment would translate, swap, patch and record into the same files at once."""
    if claimed_by is None or deployed_as_one:
        return None
    prefix = probe["python"]["prefix"]
    return (f"its Python environment {prefix} is the directory host {claimed_by} provisions in this run (the same "
            f"environment on a shared filesystem: {environment_key(probe)}); set shared_environment: true for "
            f"every host that mounts it (inventory/slurm.py does) to deploy it once and check it on each, or run "
            f"with --limit {claimed_by}")


def role_summary(role: str, writer: str, probe: dict[str, Any], identity_id: str) -> dict[str, Any]:
    """The report's entry for a host of a shared environment."""
    return {"role": role, "writer": writer, "prefix": probe["python"]["prefix"], "identity": identity_id,
            "state_dir": probe["state_dir"]["path"]}


def checker_expectation(identity_id: str | None, writer: str, run: str, kernels: dict[str, str] | None,
                        plans: list[tuple[str, Any]]) -> dict[str, Any]:
    """What a host that does not write its environment must find there once the writer is done: the identity its
    probe found (None: the environment had none, and any the writer, or a concurrent run's writer, wrote will do),
    the writer's mark, the kernel tree (``{"hsa_root", "digest"}``) and every file the patch plans
    (``(site_packages, plan)``) change, at its new hash. Its plans are the writer's: both probed the same files."""
    files = {os.path.join(root, plan.host_path(change.path)): change.new_sha256
             for root, plan in plans for change in plan.changes}
    return {"identity": identity_id, "writer": writer, "run": run, "kernels": kernels, "files": files}

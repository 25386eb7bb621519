"""The nodes of a Slurm allocation and the host data they need, for inventory/slurm.py (no pyinfra here).

Inside an allocation (``salloc``, ``sbatch``) Slurm sets ``SLURM_JOB_NODELIST`` to a compressed host list such as
``nid[001007,001011-001012]``; ``scontrol show hostnames LIST`` expands it, one name a line. Slurm's own
expansion is used rather than a parser of ours: the syntax has more forms (several bracket groups, zero padding,
suffixes) than are worth re-implementing.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

NODELIST_VARIABLE = "SLURM_JOB_NODELIST"
# Set by the operator to name the nodes (compressed or not) instead of the allocation's.
GIVEN_NODELIST_VARIABLE = "CDNA2_NODELIST"
# How inventory/slurm.py reaches the nodes: job steps of the allocation (slurm), or SSH where the cluster allows it.
TRANSPORT_VARIABLE = "CDNA2_SLURM_TRANSPORT"
TRANSPORTS = ("slurm", "ssh")
# A node name as Slurm and DNS allow it; also what host data's ssh_hostname accepts.
NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


class SlurmError(RuntimeError):
    """No allocation, no scontrol, or an answer that is not a list of node names; the message says what to do."""


def nodelist_of(environ: Mapping[str, str]) -> tuple[str, str]:
    """(nodelist, where it came from): the operator's CDNA2_NODELIST, else the allocation's SLURM_JOB_NODELIST."""
    for variable in (GIVEN_NODELIST_VARIABLE, NODELIST_VARIABLE):
        if environ.get(variable, "").strip():
            return environ[variable].strip(), variable
    raise SlurmError(f"not inside a Slurm allocation: {NODELIST_VARIABLE} is not set. Run the deploy inside one "
                     f"(salloc -N <nodes> ..., then the command in that shell), or name the nodes in "
                     f"{GIVEN_NODELIST_VARIABLE} (e.g. {GIVEN_NODELIST_VARIABLE}='nid[001007,001011-001012]')")


def transport_of(environ: Mapping[str, str]) -> str:
    """``slurm`` (the default) or ``ssh``, from CDNA2_SLURM_TRANSPORT."""
    transport = environ.get(TRANSPORT_VARIABLE, "").strip() or TRANSPORTS[0]
    if transport not in TRANSPORTS:
        raise SlurmError(f"{TRANSPORT_VARIABLE}={transport!r}: give slurm (job steps of the allocation, the default) "
                         f"or ssh (where the cluster lets you log in to its nodes)")
    return transport


def expand_nodelist(nodelist: str, source: str, scontrol: str | None = None) -> list[str]:
    """The node names of ``nodelist``, in Slurm's order, from ``scontrol show hostnames``."""
    scontrol = scontrol or shutil.which("scontrol")
    if scontrol is None:
        raise SlurmError(f"scontrol is not on PATH: it expands {source} ({nodelist!r}); run on a node of the "
                         f"cluster (a login node or one of the allocation), or load the Slurm module")
    result = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SlurmError(f"scontrol show hostnames {nodelist!r} (from {source}) failed with exit "
                         f"{result.returncode}: {result.stderr.strip()[-300:]}")
    names = result.stdout.split()
    bad = [name for name in names if not NODE_NAME.match(name)]
    if not names or bad:
        raise SlurmError(f"scontrol show hostnames {nodelist!r} (from {source}) gave "
                         f"{'no node' if not names else 'names that are not host names: ' + ', '.join(bad[:5])}")
    if len(set(names)) != len(names):
        raise SlurmError(f"scontrol show hostnames {nodelist!r} (from {source}) names a node twice")
    return names


def node_state_dir(state_home: str, node: str) -> str:
    """The tool's state directory of ``node``: the home is shared by every node of an HPC cluster (NFS, Lustre), and
    each node keeps its own lease, lock and records, so each gets a directory of its own under it."""
    return f"{state_home}/cdna2/nodes/{node}"


def allocation_host_data(environ: Mapping[str, str]) -> dict:
    """The host data every node of the allocation shares: this user's login (no sudo), the environment this shell
    has active (or CDNA2_TARGET_PYTHON), ROCm from ROCM_PATH (else /opt/rocm), deployed as one shared environment.
    A state_home for node_state_dir."""
    target_python = environ.get("CDNA2_TARGET_PYTHON")
    for prefix_variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if not target_python and environ.get(prefix_variable):
            target_python = f"{environ[prefix_variable]}/bin/python"
    if not target_python:
        raise SlurmError("no Python environment to provision: activate it (source <env>/bin/activate, or conda "
                         "activate <env>) in this shell, or set CDNA2_TARGET_PYTHON to its interpreter")
    xdg = environ.get("XDG_STATE_HOME", "")
    home = environ.get("HOME") or str(Path.home())
    return {
        "ssh_user": environ.get("USER") or getpass.getuser(),
        "target_python": target_python,
        "rocm_root": environ.get("ROCM_PATH") or "/opt/rocm",
        # The environment on the shared filesystem is written once per run and checked by every node
        # (cdna2/shared_environments.py); an environment local to each node is told apart by its identity.
        "shared_environment": True,
        "state_home": xdg if os.path.isabs(xdg) else f"{home}/.local/state",
    }

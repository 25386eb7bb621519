"""pyinfra inventory of the nodes of the current Slurm allocation: an HPC cluster, no root, a shared environment.

Inside an allocation, with the Python environment to provision active in the shell:

    salloc -N 16 -p <partition> -t 1:00:00 --no-kill     # --no-kill: a failed node does not end the others' job
    source /project/<group>/venv-aiter/bin/activate
    .venv/bin/pyinfra inventory/slurm.py deploy.py --dry     # preview
    .venv/bin/pyinfra -y inventory/slurm.py deploy.py        # apply: one node writes, every node checks

Hosts: ``SLURM_JOB_NODELIST`` expanded by ``scontrol show hostnames`` (or the nodes named in ``CDNA2_NODELIST``),
one group ``slurm``. Each is reached through the allocation's job steps (``@slurm/<node>``, connectors/slurm.py):
no SSH daemon, key or known_hosts on the nodes; the phases every node runs alike share one job step. Clusters that
allow SSH to their nodes may choose it: ``CDNA2_SLURM_TRANSPORT=ssh``. Outside an allocation, or without scontrol,
the inventory stops with what to do. Per-host data, taken from this shell (cdna2/slurm/allocation.py) and checked
against cdna2/schemas/host-data-1.0.json like any other:

- ``slurm_job``: ``$SLURM_JOB_ID``; ``slurm_gpus``: the count in ``$SLURM_GPUS_PER_NODE`` where the allocation
  was made with ``--gpus-per-node`` (a step must then ask for the node's GPUs).
- over SSH only, ``ssh_user``: you (``$USER``), no ``_sudo``: nodes of one's own allocation take one's SSH key;
  nothing asks for root. Host keys are checked as usual (``ssh_strict_host_key_checking`` yes; clusters list their
  nodes' keys in /etc/ssh/ssh_known_hosts; ``CDNA2_KNOWN_HOSTS`` names another file).
- ``target_python``: ``$CDNA2_TARGET_PYTHON``, else the active venv's (``$VIRTUAL_ENV/bin/python``) or conda env's
  (``$CONDA_PREFIX/bin/python``): the same path on every node, as a shared filesystem mounts it.
- ``rocm_root``: ``$ROCM_PATH`` (set by the cluster's rocm module), else ``/opt/rocm``.
- ``shared_environment``: true. The environment is written once per run, by the allocation's first node, and
  every node checks it and smoke-tests its own GPUs; its records are in ``<prefix>/.cdna2/state``, where the
  nodes of a later allocation find them (README, "HPC clusters").
- ``state_dir``: ``<XDG state home>/cdna2/nodes/<node>``, for a run with ``--data shared_environment=false``
  (each node its own environment): your home is the same directory on every node, and each node keeps its own
  lease, lock and records there.

docs/slurm.md has what to load on LUMI and Frontier. Everything else is group_data/all.py's default (GPU smoke checks on: every node has its own GPUs) and may be set
with ``--data KEY=VALUE``.
"""

import os
import sys
from pathlib import Path

from pyinfra.api.exceptions import InventoryError

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # pyinfra executes this file without the repository on sys.path
    sys.path.insert(0, str(_REPO))

from cdna2.slurm.allocation import (SlurmError, allocation_host_data, expand_nodelist, node_state_dir,  # noqa: E402
                                    nodelist_of, transport_of)
from cdna2.slurm.steps import gpus_of, job_of  # noqa: E402


def _nodes() -> list[tuple[str, dict]]:
    try:
        transport = transport_of(os.environ)
        nodelist, source = nodelist_of(os.environ)
        names = expand_nodelist(nodelist, source)
        shared = allocation_host_data(os.environ)
        if transport == "slurm":
            shared.pop("ssh_user")
            shared["slurm_job"] = job_of(os.environ)
            shared["slurm_gpus"] = gpus_of(os.environ)
    except SlurmError as error:
        raise InventoryError(str(error)) from None
    state_home = shared.pop("state_home")
    if transport == "slurm":
        return [(f"@slurm/{name}", {**shared, "state_dir": node_state_dir(state_home, name)}) for name in names]
    known_hosts = ({"ssh_known_hosts_file": os.environ["CDNA2_KNOWN_HOSTS"]} if os.environ.get("CDNA2_KNOWN_HOSTS")
                   else {})
    return [(name, {**shared, **known_hosts, "ssh_strict_host_key_checking": "yes",
                    "state_dir": node_state_dir(state_home, name)}) for name in names]


slurm = _nodes()

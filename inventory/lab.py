"""YOUR CLUSTER: edit this file in place. The hosts below are an example; replace their names, addresses and paths.

`pyinfra inventory/lab.py deploy.py` is the command the docs tell you to type. (inventory/sim.py is the simulated
test lab, and inventory/slurm.py reads a Slurm allocation.)

Run against it with:

    .venv/bin/pyinfra inventory/lab.py deploy.py --dry     # preview every change, patches as diffs
    .venv/bin/pyinfra -y inventory/lab.py deploy.py        # apply

Each module-level list is a pyinfra group; every host is ``"name"`` or ``("name", {data})``. Group-wide values go
in ``group_data/<group>.py`` (``group_data/all.py`` holds the defaults for every host); per-host values go in the
host's dict here and win over group data. Every key is checked against cdna2/schemas/host-data-1.0.json before
anything runs, and docs/inventories.md lists them all with their defaults.

The deploy decides what to do on each host from what it finds there (GPU arch, ROCm version, installed
packages), not from the group a host is in: an MI300X listed under ``mi210`` by mistake is probed as gfx942 and
left alone for translation and patching. Groups are for data and for ``--limit``.
"""

# MI210 nodes reached as root with a deploy key. Host keys must already be in the known_hosts file named here:
# checking stays on (add them once with ssh-keyscan, and compare the fingerprints out of band).
mi210 = (
    [
        ("mi210-node01", {"ssh_hostname": "10.20.0.11"}),
        ("mi210-node02", {"ssh_hostname": "10.20.0.12"}),
        # This node runs ROCm as a Python wheel in its own environment instead of /opt/rocm.
        ("mi210-node03", {"ssh_hostname": "10.20.0.13", "target_python": "/opt/python/bin/python3"}),
    ],
    {
        "ssh_user": "root",
        "ssh_key": "~/.ssh/mi210_deploy_ed25519",
        "ssh_known_hosts_file": "~/.ssh/known_hosts",
        "ssh_strict_host_key_checking": "yes",
    },
)

# Nodes reached as an unprivileged user who may sudo without a password prompt.
mi210_sudo = (
    [
        ("mi210-node04", {"ssh_hostname": "10.20.0.14"}),
    ],
    {
        "ssh_user": "deploy",
        "ssh_key": "~/.ssh/mi210_deploy_ed25519",
        "ssh_strict_host_key_checking": "yes",
        "_sudo": True,
        # An air-gapped rack: wheels only from the operator's mirror.
        "wheel_index_url": "http://mirror.cluster.internal/simple/",
    },
)

# Nodes reached as a plain user without root or sudo, who owns the Python environment (as on an HPC cluster; for a
# Slurm allocation see inventory/slurm.py). The tool's state then lives in that user's XDG state directory
# (~/.local/state/cdna2) unless state_dir says otherwise; nothing else outside the environment is written.
mi210_user = (
    [
        ("mi210-node05", {"ssh_hostname": "10.20.0.15"}),
    ],
    {
        "ssh_user": "alice",
        "ssh_key": "~/.ssh/id_ed25519",
        "ssh_strict_host_key_checking": "yes",
        "target_python": "/home/alice/venvs/aiter/bin/python",
    },
)

"""One Python environment on a shared filesystem (NFS, Lustre) that many nodes provision: its identity, its state
directory and the lock that serialises the nodes' writes to it. This module is the layout, which the probe reads
too (so no json, re or threads here); the lock and the commands are in cdna2/host/env_lock.py.

Layout, inside the environment (``<prefix>/.cdna2/``):

- ``identity.json``: which environment this is, written once, by the first deploy that provisions it as shared.
  Every other node of the run then checks that it reads the same identity through its own mount: two nodes that
  see one identity see one directory; a local disk at the same path (a node cloned from one image) does not have
  it. It is made whole in a staged file and published with ``link()``, which fails when the name exists: atomic on
  a local disk, on NFSv3+ and on Lustre, so racing writers all end up reading the one that won.
- ``state/``: the environment's state directory (records, patch backups, the host agent) when the hosts sharing it
  are deployed as one (host data ``shared_environment``): any node of a later run, another allocation's included,
  finds what the last writer recorded, and can finish an interrupted transaction from its journal. Each node's
  smoke pass is recorded there under its own key (``NODE_RECORDS``), and read back as its plain one.
- ``lock/``: held while a command changes the environment. ``mkdir`` is the primitive, not ``flock``: Lustre gives
  ``flock`` only when mounted with ``-o flock`` (node-local with ``-o localflock``, ENOSYS without either) and NFS
  emulates it with byte-range locks that depend on lockd or v4 leases; ``mkdir`` is atomic on every one of them.
  The holder writes ``owner.json`` into it and touches it every ``HEARTBEAT_S`` (env_lock.py) from a thread. A
  waiter takes over a lock whose holder is gone: on its own node, when the holder's process has ended; from
  another node, when the owner file's mtime has not changed for ``STALE_S`` of the waiter's own clock (values are
  compared, never clocks, so the nodes' clock skew does not matter).
"""

from __future__ import annotations

import os

from cdna2.host.jsontext import json_loads

ENV_DIR = ".cdna2"
IDENTITY = "identity.json"
STATE = "state"
# Records that stay per node in a shared state directory, each under "<key>@<node>": a node's GPUs are its own.
NODE_RECORDS = frozenset({"smoke"})


# Paths as strings (os.path): pathlib imports re, which the probe does without (cdna2/host/probe.py).
def environment_dir(prefix: str | os.PathLike) -> str:
    return os.path.join(prefix, ENV_DIR)


def shared_state_dir(prefix: str | os.PathLike) -> str:
    return os.path.join(prefix, ENV_DIR, STATE)


def shared_environment_of(state_dir: str | os.PathLike) -> str | None:
    """The environment's ``.cdna2`` directory when ``state_dir`` is a shared environment's state directory."""
    parent, name = os.path.split(os.fspath(state_dir).rstrip("/"))
    return parent if name == STATE and os.path.basename(parent) == ENV_DIR else None


def this_node() -> dict[str, str]:
    """The node a command runs on: its host name and the kernel's boot id (a rebooted node is another node)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as stream:
            boot_id = stream.read().strip()
    except OSError:
        boot_id = ""
    return {"name": os.uname().nodename, "boot_id": boot_id}


def read_identity(prefix: str | os.PathLike) -> dict | None:
    try:
        with open(os.path.join(prefix, ENV_DIR, IDENTITY), encoding="utf-8") as stream:
            identity = json_loads(stream.read())
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) and isinstance(identity.get("id"), str) else None


def node_record_key(key: str, node_name: str) -> str:
    return f"{key}@{node_name}" if key in NODE_RECORDS else key


def node_view(state: dict | None, node_name: str) -> dict | None:
    """A shared state directory's records as one node reads them: its own per-node records under their plain keys,
    the other nodes' left out."""
    if state is None:
        return None
    view = {key: value for key, value in state.items() if key.partition("@")[0] not in NODE_RECORDS}
    for key in NODE_RECORDS:
        if node_record_key(key, node_name) in state:
            view[key] = state[node_record_key(key, node_name)]
    return view

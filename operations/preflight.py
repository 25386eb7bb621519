"""Checks that run before the first change on any host."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Callable
from weakref import WeakKeyDictionary

import gevent
from pyinfra.api import Inventory
from pyinfra.api.exceptions import PyinfraError

from cdna2.fp8_configs import Fp8ConfigError, load_configs
from cdna2.hostdata import HostDataError, validate_hosts
from cdna2.patches import Catalog, PatchDataError, load_catalog
from cdna2.patches.releases import Releases, load_releases
from cdna2.shared_environments import environment_key
from cdna2.wheels import Matrix, MatrixError, WheelPlan, WheelPlanError, load_matrix, pins_from_host_data, plan_wheels


def validate_inventory(inventory: Inventory) -> None:
    """Validate every host's data, not just this one's: one invalid host stops the run before any host changes.

    pyinfra runs the deploy file once per host; the inventory is validated on the first call and the outcome
    reused, so N hosts cost N validations, not N squared.
    """
    if inventory not in _validated:
        try:
            validate_hosts((host.name, host.data.dict()) for host in inventory)
            _validated[inventory] = None
        except HostDataError as error:
            _validated[inventory] = str(error)
    if _validated[inventory] is not None:
        raise PyinfraError(_validated[inventory])


# Inventory -> its validation error (None: valid), for the life of the inventory object.
_validated: WeakKeyDictionary[Inventory, str | None] = WeakKeyDictionary()


@cache
def _catalog() -> Catalog:
    return load_catalog()


@cache
def release_data() -> Releases:
    """The releases refused by name (cdna2/data/releases.yaml), validated; a broken file stops the run for every
    host, as a broken patch set does."""
    try:
        return load_releases()
    except PatchDataError as error:
        raise PyinfraError(f"invalid data file, no host was changed: {error}") from error


@cache
def _matrix(path: str | None) -> Matrix:
    return load_matrix(path)


@cache
def _fp8_configs(directory: str) -> dict[str, bytes]:
    return load_configs(directory)


def fp8_configs_of(data) -> dict[str, bytes]:
    """The tuned block-FP8 configs this host's data names (``fp8_block_configs``), checked; {} when unset. A file
    vLLM would not use stops the run for every host, as a broken data file does."""
    if not data.fp8_block_configs:
        return {}
    try:
        return _fp8_configs(data.fp8_block_configs)
    except Fp8ConfigError as error:
        raise PyinfraError(f"invalid data file, no host was changed: {error}") from error


def load_data_files(data) -> tuple[Catalog, Callable[[dict], WheelPlan | WheelPlanError]]:
    """The patch catalog and this host's wheel planner, with their YAML validated before anything changes.

    A broken data file stops the run for every host. A plan that cannot be made for one host (its ROCm is not in
    the matrix, say) is returned as the error, for the deploy's preflight to fail that host alone.
    """
    try:
        catalog, matrix = _catalog(), _matrix(data.wheel_matrix)
    except (PatchDataError, MatrixError) as error:
        raise PyinfraError(f"invalid data file, no host was changed: {error}") from error

    def wheel_plan_for(probe: dict) -> WheelPlan | WheelPlanError:
        try:
            return plan_wheels(matrix, probe, pins=pins_from_host_data(data.dict()), index_url=data.wheel_index_url,
                               find_links=data.wheel_find_links, install_vllm=data.install_vllm)
        except WheelPlanError as error:
            return error

    return catalog, wheel_plan_for


@dataclass
class _Environments:
    """One run's view of its hosts' environments: whose probe is under way, the environment each found
    (``cdna2.shared_environments.environment_key``), the host chosen to write each (fixed once chosen), and the
    identity each is given."""

    probing: set[str] = field(default_factory=set)
    keys: dict[str, str | None] = field(default_factory=dict)
    writers: dict[str, str] = field(default_factory=dict)
    identities: dict[str, str] = field(default_factory=dict)


_environments: WeakKeyDictionary[Inventory, _Environments] = WeakKeyDictionary()


def probe_announced(inventory: Inventory, host_name: str, probe_host: Callable[[], dict]) -> dict:
    """``probe_host()``, with the environment it found announced to the other hosts of the run, also when it fails
    (as none): ``environment_claimed_by`` waits for the announcement of every probe under way."""
    environments = _environments.setdefault(inventory, _Environments())
    environments.probing.add(host_name)
    probe = None
    try:
        probe = probe_host()
        return probe
    finally:
        environments.keys[host_name] = environment_key(probe or {})


def environment_claimed_by(inventory: Inventory, host_name: str) -> str | None:
    """The host of this run that writes this host's target environment, or None: this host is that host, or
    the environment is its own.

    pyinfra runs the deploy file for the hosts at once (a greenlet each, as many at a time as ``--parallel``
    allows), so this first waits, cooperatively, for every probe already under way; the host chosen is then the
    first in inventory order among those that found this environment, and stays chosen for the rest of the run.
    With every host loaded at once (pyinfra's default) that is the first host in inventory order whatever order
    the probes came back in; with fewer at a time, a host whose probe starts after the choice defers to it.
    Either way exactly one host per environment is chosen. Hosts waiting for a pool slot are not waited for:
    they cannot start while this one holds its slot.
    """
    environments = _environments.setdefault(inventory, _Environments())
    while not environments.probing <= environments.keys.keys():
        gevent.sleep(0.02)
    key = environments.keys.get(host_name)
    if not key:
        return None
    first = next(host.name for host in inventory if environments.keys.get(host.name) == key)
    writer = environments.writers.setdefault(key, first)
    return None if writer == host_name else writer


def environment_identity(inventory: Inventory, probe: dict) -> str:
    """The identity of this host's environment: the one written into it, else the one this run gives it (the same
    for every host of the run that found that environment)."""
    identity = (probe["python"].get("identity") or {}).get("id")
    if identity:
        return identity
    return _environments[inventory].identities.setdefault(environment_key(probe), uuid.uuid4().hex)

"""Checks that run before the first change on any host."""

from __future__ import annotations

from functools import cache

import gevent
from weakref import WeakKeyDictionary
from typing import Callable

from pyinfra.api import Inventory
from pyinfra.api.exceptions import PyinfraError

from cdna2.fp8_configs import Fp8ConfigError, load_configs
from cdna2.hostdata import HostDataError, validate_hosts
from cdna2.patches import Catalog, PatchDataError, load_catalog
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


# Inventory -> {host name: its environment's fingerprint (None: none found, or the probe failed)}.
_fingerprints: WeakKeyDictionary[Inventory, dict[str, str | None]] = WeakKeyDictionary()


def probe_announced(inventory: Inventory, host_name: str, probe_host: Callable[[], dict]) -> dict:
    """``probe_host()``, with the environment fingerprint it found announced to the other hosts of the run, also
    when it fails: ``environment_claimed_by`` waits for every host's announcement."""
    probe = None
    try:
        probe = probe_host()
        return probe
    finally:
        _fingerprints.setdefault(inventory, {})[host_name] = ((probe or {}).get("python") or {}).get("fingerprint")


def environment_claimed_by(inventory: Inventory, host_name: str) -> str | None:
    """The host of this run that provisions this host's target environment (the first host, in inventory order,
    whose probe found the same fingerprint), or None: this host is that host, or the environment is its own.

    pyinfra runs the deploy file for every host at once (a greenlet each), so this waits, cooperatively, until
    every active host of the run has announced its fingerprint (``probe_announced``); the choice is then the same
    whatever order the probes came back in.
    """
    announced = _fingerprints.setdefault(inventory, {})
    while True:
        running = [host.name for host in inventory if host in inventory.state.active_hosts]
        if all(name in announced for name in running):
            break
        gevent.sleep(0.02)
    fingerprint = announced.get(host_name)
    if not fingerprint:
        return None
    first = next(name for name in running if announced.get(name) == fingerprint)
    return None if first == host_name else first

"""Checks that run before the first change on any host."""

from __future__ import annotations

from pyinfra.api import Inventory
from pyinfra.api.exceptions import PyinfraError

from cdna2.hostdata import HostDataError, validate_hosts


def validate_inventory(inventory: Inventory) -> None:
    """Validate every host's data, not just this one's: one invalid host stops the run before any host changes."""
    try:
        validate_hosts((host.name, host.data.dict()) for host in inventory)
    except HostDataError as error:
        raise PyinfraError(str(error)) from error

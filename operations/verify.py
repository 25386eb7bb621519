"""Fail the hosts that drifted from what the deploy left there; change nothing anywhere."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from operations.util import fail_host_command


@operation()
def drift_free(drift: list[str]):
    """
    Fail this host when it drifted; otherwise report it clean. Never changes the host.

    + drift: ``cdna2.drift.find_drift(...)`` for this host (empty when clean)

    **Example:**

    .. code:: python

        drift_free(name="verify: the host is as deployed", drift=find_drift(probe, plans))
    """
    if not drift:
        host.noop("no drift: packages, kernels and patches are as deployed")
        return
    yield fail_host_command("verify: drift: " + "; ".join(drift))

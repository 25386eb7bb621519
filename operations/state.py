"""Record what the deploy did in the host's state file (<state_dir>/state.json), for verify and rollback."""

from __future__ import annotations

import json
from typing import Any

from pyinfra import host
from pyinfra.api import operation

from operations.agent import agent_command


def record_needed(key: str, value: Any, current_state: dict | None, once: bool = False) -> bool:
    """Whether ``recorded`` would write: the entry differs from ``value`` (or, with ``once``, is absent)."""
    current = (current_state or {}).get(key)
    return current is None if once else current != value


@operation()
def recorded(key: str, value: Any, current_state: dict | None, target_python: str, state_dir: str,
             once: bool = False):
    """
    Record one entry of the tool's state on the host.

    + key: the entry (``baseline``: what the host had before the first deploy; ``deployed``: what it got)
    + value: the JSON-able value to record
    + current_state: the host's state as the probe read it (None when there is none)
    + target_python: interpreter that runs the host agent
    + state_dir: the tool's state directory on the host
    + once: record only when the entry is absent (a baseline is never overwritten by later runs)

    **Example:**

    .. code:: python

        recorded(
            name="state: the pre-deploy baseline is recorded",
            key="baseline", value={"triton": "3.7.0"}, current_state=probe["state"],
            target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2", once=True,
        )
    """
    if not record_needed(key, value, current_state, once):
        host.noop(f"state {key} in {state_dir} is already recorded")
        return
    yield agent_command(target_python, state_dir, "state", "set-once" if once else "set", "--state-dir", state_dir,
                        key, json.dumps(value, sort_keys=True))

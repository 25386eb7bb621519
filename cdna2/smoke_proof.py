"""What a recorded smoke pass proves, and whether the one recorded on a host proves a given deployed state.

The deploy records a pass as ``state.json["smoke"]`` (``operations.smoke.smoke_passed``); the deploy reuses it
when nothing changed, and the benchmarks run only where it proves the deployed state with its GPU checks run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def proof_key(deployed: dict[str, Any], gpu_checks: bool) -> str:
    """What a smoke pass proves: the deployed state it ran against (packages, kernel tree, patch sets), and whether
    its GPU checks ran (a pass without them never stands for one with them)."""
    proved = {"deployed": deployed, "gpu_checks": gpu_checks}
    return hashlib.sha256(json.dumps(proved, sort_keys=True).encode()).hexdigest()


def recorded_proof(deployed: dict[str, Any], gpu_checks: bool, current_state: dict | None) -> dict | None:
    """The smoke pass recorded on the host (``state.json["smoke"]``) when it proves this very deployed state."""
    recorded_smoke = (current_state or {}).get("smoke")
    key = proof_key(deployed, gpu_checks)
    return recorded_smoke if recorded_smoke and recorded_smoke.get("proves") == key else None

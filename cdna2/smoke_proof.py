"""What a recorded smoke pass proves, and whether the one recorded on a host proves a given deployed state.

The deploy records a pass as ``state.json["smoke"]`` (``operations.smoke.smoke_passed``); the deploy reuses it
when nothing changed, and the benchmarks run only where it proves the deployed state with its GPU checks run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cdna2.host.window_proof import CHECK as WINDOW_CHECK

TRITON_OPS_SET = "vllm-aiter-triton-ops"  # its guard reads the sliding-window record (cdna2/host/window_proof.py)
WRITE_RECORD, REMOVE_RECORD = "write", "remove"


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


def window_record_action(patch_sets: dict[str, list[str]], shared_environment: bool, writes: bool) -> str | None:
    """What a smoke run does with the sliding-window record beside vLLM: WRITE_RECORD its check's outcome where this
    host's vLLM takes vllm-aiter-triton-ops and is its own; REMOVE_RECORD where the environment is shared (one file
    would speak for every node's GPU) or the set is not there, by the host that writes the environment; else None."""
    if "vllm" not in patch_sets:  # no vLLM patched on this host: no guard reads a record
        return None
    if TRITON_OPS_SET in patch_sets["vllm"] and not shared_environment:
        return WRITE_RECORD
    return REMOVE_RECORD if writes else None


def window_record_note(check: dict | None, action: str | None) -> str | None:
    """The report's line on what the record now lets ROCM_AITER_UNIFIED_ATTN do on this host (None: no record)."""
    if action == REMOVE_RECORD:
        return ("sliding-window record: none (a shared environment, or no vllm-aiter-triton-ops): "
                "ROCM_AITER_UNIFIED_ATTN declines sliding-window models")
    if action != WRITE_RECORD or check is None:
        return None
    if check["status"] == "passed":
        return (f"sliding-window record: {WINDOW_CHECK} passed on this host's GPU: ROCM_AITER_UNIFIED_ATTN serves "
                f"sliding-window models here, for this AITER and triton")
    return (f"sliding-window record: {WINDOW_CHECK} {check['status']}: ROCM_AITER_UNIFIED_ATTN declines "
            f"sliding-window models here")

"""The Triton compile proof of each host's AITER tree, once per distinct (triton version, tree digest) per run."""

from __future__ import annotations

import threading

from pyinfra import logger
from pyinfra.api.host import Host

from cdna2.patches import Catalog, PackagePlan
from cdna2.triton.hosts import SET, adds_refusal, proven_tree, triton_after
from cdna2.triton.proof import ProofError
from cdna2.triton.toolchain import ToolchainError
from operations.kernels import FetchError, fetch_directory

# deploy.py runs once per host in parallel greenlets: the first host with a given tree proves it, the others wait
# for it and take its result (as the kernel translation does, operations/kernels.py).
_proof_locks: dict[tuple[str, str], threading.Lock] = {}
_proofs: dict[tuple[str, str], dict] = {}


def host_tree_proof(source_host: Host, probe: dict, triton_version: str) -> dict:
    """The proof of the host's AITER Triton tree with ``triton_version``, made or found once per run per distinct
    pair."""
    key = (triton_version, probe["triton_sources"])
    with _proof_locks.setdefault(key, threading.Lock()):
        if key not in _proofs:
            site_packages = probe["distributions"]["amd-aiter"]["location"]
            _proofs[key] = proven_tree(*key, lambda archive: fetch_directory(
                source_host, f"{site_packages}/aiter/ops", "triton", archive, probe["state_dir"]["path"]),
                progress=lambda line: logger.info(f"{source_host.print_prefix}triton proof: {line}"))
            logger.info(f"{source_host.print_prefix}triton proof: AITER Triton tree {key[1][:12]} with triton "
                        f"{key[0]}: {len(_proofs[key]['files'])} configs derived ({_proofs[key]['source']})")
    return _proofs[key]


def triton_proof_or_refusal(source_host: Host, probe: dict, catalog: Catalog, plan: PackagePlan | None,
                            wheel_requirements: list[str]) -> tuple[dict | None, str | None]:
    """Where ``plan`` (the host's amd-aiter patch plan) takes the aiter-triton-gfx90a set: the host tree's proof with
    the triton the host runs after this run's wheels step, or why that set cannot go on this host (the host then
    fails in preflight, before anything on it changes)."""
    if plan is None or SET not in plan.sets:
        return None, None
    triton_version = triton_after((probe["distributions"].get("triton") or {}).get("version"), wheel_requirements)
    if triton_version is None:
        return None, (f"{SET}: no triton is installed, and its configs are proven for the host's triton; install "
                      f"triton (install_wheels) or remove {SET} from optional_patch_sets")
    if not probe["triton_sources"]:
        return None, f"{SET}: AITER has no aiter/ops/triton package; remove {SET} from optional_patch_sets"
    try:
        proof = host_tree_proof(source_host, probe, triton_version)
    except ToolchainError as error:
        return None, (f"{SET}: the controller has no triton {triton_version} to prove "
                      f"the host's configs with: {error}")
    except (ProofError, FetchError) as error:
        return None, f"{SET}: the host's AITER Triton tree cannot be proven: {error}"
    return proof, adds_refusal(proof, catalog.by_name(SET).variant(plan.variants[SET]))

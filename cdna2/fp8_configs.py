"""Tuned MI210 block-FP8 GEMM configs for vLLM: read from the operator's directory, checked, planned per host.

vLLM looks a config up by file name in ``vllm/model_executor/layers/quantization/utils/configs/``
(``N=4096,K=5120,device_name=AMD_Instinct_MI210,dtype=fp8_w8a8,block_shape=[128,128].json``) and warns "Using
default W8A8 Block FP8 kernel config" without one. Each file here must have that name, for
the MI210 (vLLM's device name ``AMD_Instinct_MI210``), and the JSON shape vLLM passes to its Triton kernel
(``cdna2/schemas/fp8-block-config-1.0.json``), with tiles that divide by the block shape as vLLM requires.

They are installed like patches: planned as a ``PackagePlan`` of their own (``vllm-fp8-configs``), written through
the same transaction (``cdna2.host.txn``: new files recorded, rollback removes them), and recorded in the deployed
state, so verify names one that went missing or was edited.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path

from cdna2.host.digests import record_hash
from cdna2.patches.planner import FileChange, PackagePlan, sha256_hex
from cdna2.schema import first_violation

CONFIG_DIR = "vllm/model_executor/layers/quantization/utils/configs"  # under vLLM's site-packages
PLAN_NAME = "vllm-fp8-configs"  # the plan's package name: its backups live in <state_dir>/backups/vllm-fp8-configs
DEVICE_NAME = "AMD_Instinct_MI210"
FILE_NAME = re.compile(r"N=(?P<n>[1-9][0-9]*),K=(?P<k>[1-9][0-9]*),device_name=(?P<device>[A-Za-z0-9_]+),"
                       r"dtype=fp8_w8a8,block_shape=\[(?P<block_n>[1-9][0-9]*),(?P<block_k>[1-9][0-9]*)\]\.json")


class Fp8ConfigError(ValueError):
    pass


@cache
def _schema() -> dict:
    return json.loads(resources.files("cdna2").joinpath("schemas", "fp8-block-config-1.0.json").read_text())


def check_config(name: str, data: bytes) -> None:
    """Raise Fp8ConfigError naming the file and the reason unless vLLM would use it on an MI210."""
    match = FILE_NAME.fullmatch(name)
    if match is None:
        raise Fp8ConfigError(f"{name}: not a vLLM block-FP8 config name (N=<n>,K=<k>,device_name={DEVICE_NAME},"
                             f"dtype=fp8_w8a8,block_shape=[<n>,<k>].json)")
    if match["device"] != DEVICE_NAME:
        raise Fp8ConfigError(f"{name}: device_name is {match['device']}; vLLM names the MI210 {DEVICE_NAME}, so "
                             f"an MI210 would never read this file")
    try:
        document = json.loads(data)
    except ValueError as error:
        raise Fp8ConfigError(f"{name}: not JSON: {error}") from error
    violation = first_violation(document, _schema())
    if violation:
        raise Fp8ConfigError(f"{name}: {violation}")
    block_n, block_k = int(match["block_n"]), int(match["block_k"])
    for batch, config in document.items():
        if config["BLOCK_SIZE_N"] % block_n or config["BLOCK_SIZE_K"] % block_k:
            raise Fp8ConfigError(f"{name}: batch {batch}: BLOCK_SIZE_N {config['BLOCK_SIZE_N']} and BLOCK_SIZE_K "
                                 f"{config['BLOCK_SIZE_K']} must be multiples of the block shape "
                                 f"[{block_n},{block_k}] (vLLM's kernel reads one scale per block)")


def load_configs(directory: str) -> dict[str, bytes]:
    """Every config file of ``directory`` (the ``fp8_block_configs`` data key), by its path under site-packages,
    each checked; Fp8ConfigError names the directory, the file and the reason."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise Fp8ConfigError(f"fp8_block_configs: {root} is not a directory on the controller")
    configs = {}
    for path in sorted(root.iterdir()):
        if path.name.startswith("."):
            continue
        if not path.is_file():
            raise Fp8ConfigError(f"fp8_block_configs: {path} is not a file; the directory holds config files only")
        try:
            check_config(path.name, path.read_bytes())
        except Fp8ConfigError as error:
            raise Fp8ConfigError(f"fp8_block_configs: {root}/{error}") from None
        configs[f"{CONFIG_DIR}/{path.name}"] = path.read_bytes()
    if not configs:
        raise Fp8ConfigError(f"fp8_block_configs: {root} holds no config file")
    return configs


def plan_configs(configs: Mapping[str, bytes], files: Mapping[str, bytes | None],
                 installed: Mapping[str, dict]) -> PackagePlan:
    """Write each config whose file is absent or holds an earlier config of ours; refuse, by name, one that holds
    something else. ``files``: the probe's bytes of every config path (None: absent); ``installed``: the config
    transaction's backup record on the host (``probe["backups"]["vllm-fp8-configs"]["files"]``), if any."""
    plan = PackagePlan(package=PLAN_NAME, installed_version="", status="refused")
    for path, data in sorted(configs.items()):
        current = files[path]
        if current == data:
            continue
        ours = installed.get(path, {})
        if current is not None and (ours.get("original_sha256") is not None
                                    or ours.get("patched_sha256") != sha256_hex(current)):
            plan.reasons.append(f"{path}: exists and is not a config this tool installed (sha256 "
                                f"{sha256_hex(current)}): remove it, or leave it out of fp8_block_configs")
            continue
        plan.changes.append(FileChange(path, sha256_hex(current) if current is not None else None, data,
                                       sha256_hex(data), f"{'replace' if current else 'add'} {path}\n"))
    if plan.reasons:
        plan.changes = []
        return plan
    plan.sets = [PLAN_NAME]
    plan.status = "apply" if plan.changes else "patched"
    return plan


def with_config_targets(patch_files: Mapping[str, list[str]], configs: Mapping[str, bytes]) -> dict[str, list[str]]:
    """The probe's ``patch_files`` plus the config paths under vLLM: the probe reports their hashes (and bytes
    only where the controller lacks them)."""
    return {package: [*paths, *(sorted(configs) if package == "vllm" else ())]
            for package, paths in patch_files.items()}


def installed_hashes(configs: Mapping[str, bytes]) -> dict[str, str]:
    """What the deployed record keeps of the configs: their RECORD-style hashes, as the probe reports files."""
    return {path: record_hash(data) for path, data in sorted(configs.items())}

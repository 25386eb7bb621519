"""Tuned MI210 block-FP8 configs on the lab (``fp8_block_configs``): installed into vLLM's config directory on the
gfx90a hosts that have vLLM, recorded like patches, a missing or edited one named by verify, removed by rollback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdna2.fp8_configs import CONFIG_DIR
from tests.lab.deploy_runner import lab_hosts, run_pyinfra, site_packages

pytestmark = pytest.mark.lab

NAMES = ("N=5120,K=5120,device_name=AMD_Instinct_MI210,dtype=fp8_w8a8,block_shape=[128,128].json",
         "N=17408,K=5120,device_name=AMD_Instinct_MI210,dtype=fp8_w8a8,block_shape=[128,128].json")
# Made up for the test, in the shape vLLM reads (there is no MI210 here to tune on).
CONFIG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 2},
          "256": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8, "num_warps": 8,
                  "num_stages": 2}}


def test_configs_are_installed_verified_and_removed_by_rollback(lab: dict, tmp_path: Path) -> None:
    directory = tmp_path / "mi210-configs"
    directory.mkdir()
    for name in NAMES:
        (directory / name).write_text(json.dumps(CONFIG, indent=1))
    data = ("--data", f"fp8_block_configs={directory}")
    with_vllm = lab_hosts(lab, "gfx90a")
    others = lab_hosts(lab, other_than="gfx90a")

    deployed = run_pyinfra("-y", "deploy.py", *data, report_dir=tmp_path)
    assert deployed.returncode == 0, deployed.output[-4000:]
    for host in with_vllm:
        assert deployed.row(host["name"])["steps"]["fp8 configs"]["status"] in ("changed", "unchanged")
        for name in NAMES:
            assert (site_packages(host) / CONFIG_DIR / name).read_bytes() == (directory / name).read_bytes()
    for host in others:
        assert "fp8 configs" not in deployed.row(host["name"])["steps"], "gfx942 hosts are left alone"
    again = run_pyinfra("-y", "deploy.py", *data, report_dir=tmp_path)
    assert {row["host"]: row["changes"] for row in again.report["hosts"] if row["changes"]} == {}

    assert run_pyinfra("-y", "verify.py", *data, report_dir=tmp_path).returncode == 0
    edited = site_packages(with_vllm[0]) / CONFIG_DIR / NAMES[0]
    removed = site_packages(with_vllm[1]) / CONFIG_DIR / NAMES[1]
    original = edited.read_bytes()
    edited.write_text("{}")
    removed.unlink()
    drifted = run_pyinfra("-y", "verify.py", *data, report_dir=tmp_path)
    assert drifted.returncode != 0
    assert f"fp8 config {NAMES[0]} edited since the deploy installed it" in \
        drifted.row(with_vllm[0]["name"])["steps"]["verify"]["detail"]
    assert f"fp8 config {NAMES[1]} missing from vLLM's config directory" in \
        drifted.row(with_vllm[1]["name"])["steps"]["verify"]["detail"]

    refused = run_pyinfra("-y", "deploy.py", *data, report_dir=tmp_path)
    assert refused.row(with_vllm[0]["name"])["steps"]["fp8 configs"]["status"] == "failed", "an edited one is not ours"
    assert "exists and is not a config this tool installed" in \
        refused.row(with_vllm[0]["name"])["steps"]["fp8 configs"]["detail"]
    assert removed.read_bytes() == (directory / NAMES[1]).read_bytes(), "a missing one is put back"
    edited.write_bytes(original)
    assert run_pyinfra("-y", "verify.py", *data, report_dir=tmp_path).returncode == 0

    rolled_back = run_pyinfra("-y", "rollback.py", report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    for host in with_vllm:
        assert not [name for name in NAMES if (site_packages(host) / CONFIG_DIR / name).exists()], host["name"]

"""The smoke test run as the deploy runs it: a fresh target interpreter, the agent on PYTHONPATH, JSON on stdout.

The target environment is a real venv (no pip), whose path reaches the fixture host's site-packages and the cached
triton 3.7.1 from the lab wheelhouse through .pth files; the agent directory holds only cdna2/__init__.py and
cdna2/host/*.py, as the agent bundle does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import wheelhouse
from tests.unit.smoke.conftest import make_agent, make_target_python, run_smoke_command, statuses


@pytest.fixture
def target_python(tmp_path: Path, host) -> Path:
    return make_target_python(tmp_path / "venv", [host.site, wheelhouse.installed_tree(wheelhouse.TRITON_PINNED)])


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    return make_agent(tmp_path / "state-agent")


def run_smoke(python: Path, agent: Path, host) -> tuple[int, dict, str]:
    return run_smoke_command(python, agent, host, "--host-arch", "none")


def test_cli_on_a_provisioned_host_then_after_tampering(target_python: Path, agent: Path, host) -> None:
    code, report, stderr = run_smoke(target_python, agent, host)
    assert code == 0, json.dumps(report, indent=1)
    assert statuses(report) == {
        "gfx90a_tree": "passed", "code_objects_gfx90a": "passed", "manifests_complete": "passed",
        "patch_sets_applied": "passed", "record_pristine": "passed", "triton_version": "passed",
        "triton_autotuner_import": "passed", "import_aiter": "skipped", "jit_no_stale_modules": "passed",
        "jit_modules_after_kernels": "passed", "jit_no_orphan_lock": "passed", "fmha_v3_fwd_bf16_hd128": "skipped",
        "fmha_v3_fwd_bf16_hd128_causal": "skipped", "fmha_v3_fwd_bf16_hd128_partial_tile": "skipped",
        "fmha_v3_fwd_varlen_group": "skipped", "pa_fwd_asm_bf16_block16_gqa8": "skipped",
        "sliding_window_attention": "skipped", "triton_gemm_a16w16_small": "skipped",
        "triton_gemm_a16w16_large": "skipped"}
    assert (report["passed"], report["failed"], report["skipped"], report["wrong"], report["device"]) == \
        (10, 0, 9, 0, None)
    assert "smoke: 10 passed, 0 failed, 0 wrong, 9 skipped" in stderr

    (host.tree / "pa" / "pa_bf16_noquant_gqa8_1tg_4w.co").unlink()
    (host.site / "aiter" / "ops" / "mha.py").write_text("ret = True\n")
    code, report, stderr = run_smoke(target_python, agent, host)
    assert code == 1
    failed = {name for name, status in statuses(report).items() if status == "failed"}
    assert failed == {"gfx90a_tree", "manifests_complete", "patch_sets_applied"}, json.dumps(report, indent=1)
    assert "failed  static manifests_complete" in stderr

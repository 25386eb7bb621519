"""The smoke test run as the deploy runs it: a fresh target interpreter, the agent on PYTHONPATH, JSON on stdout.

The target environment is a real venv (no pip), whose path reaches the fixture host's site-packages and the cached
triton 3.7.1 from the lab wheelhouse through .pth files; the agent directory holds only cdna2/__init__.py and
cdna2/host/*.py, as the agent bundle does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import wheelhouse

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def target_python(tmp_path: Path, host) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "cdna2-fixture-host.pth").write_text(f"{host.site}\n")
    Path(purelib, "triton.pth").write_text(f"{wheelhouse.installed_tree(wheelhouse.TRITON_PINNED)}\n")
    return python


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    agent = tmp_path / "state-agent"
    (agent / "cdna2" / "host").mkdir(parents=True)
    shutil.copyfile(ROOT / "cdna2" / "__init__.py", agent / "cdna2" / "__init__.py")
    for module in (ROOT / "cdna2" / "host").glob("*.py"):
        shutil.copyfile(module, agent / "cdna2" / "host" / module.name)
    return agent


def run_smoke(python: Path, agent: Path, host) -> tuple[int, dict, str]:
    completed = subprocess.run(
        ["env", f"PYTHONPATH={agent}", str(python), "-B", "-m", "cdna2.host.smoke", "--site-packages",
         str(host.site), "--state-dir", str(host.state_dir), "--expect-triton", "3.7.1", "--json"],
        capture_output=True, text=True, timeout=600)
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, f"--json prints exactly one line on stdout, got: {completed.stdout[:2000]}"
    return completed.returncode, json.loads(lines[0]), completed.stderr


def statuses(report: dict) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}


def test_cli_on_a_provisioned_host_then_after_tampering(target_python: Path, agent: Path, host) -> None:
    code, report, stderr = run_smoke(target_python, agent, host)
    assert code == 0, json.dumps(report, indent=1)
    assert statuses(report) == {
        "gfx90a_tree": "passed", "code_objects_gfx90a": "passed", "manifests_complete": "passed",
        "patch_sets_applied": "passed", "record_pristine": "passed", "triton_version": "passed",
        "triton_autotuner_import": "passed", "import_aiter": "skipped", "jit_no_stale_modules": "passed",
        "jit_no_orphan_lock": "passed", "fmha_v3_fwd_bf16_hd128": "skipped",
        "fmha_v3_fwd_bf16_hd128_causal": "skipped", "pa_fwd_asm_bf16_block16_gqa8": "skipped",
        "sliding_window_attention": "skipped"}
    assert (report["passed"], report["failed"], report["skipped"], report["wrong"], report["device"]) == \
        (9, 0, 5, 0, None)
    assert "smoke: 9 passed, 0 failed, 0 wrong, 5 skipped" in stderr

    (host.tree / "pa" / "pa_bf16_noquant_gqa8_1tg_4w.co").unlink()
    (host.site / "aiter" / "ops" / "mha.py").write_text("ret = True\n")
    code, report, stderr = run_smoke(target_python, agent, host)
    assert code == 1
    failed = {name for name, status in statuses(report).items() if status == "failed"}
    assert failed == {"gfx90a_tree", "manifests_complete", "patch_sets_applied"}, json.dumps(report, indent=1)
    assert "failed  static manifests_complete" in stderr

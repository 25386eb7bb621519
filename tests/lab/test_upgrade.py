"""End-to-end on a one-host scratch lab: a patched package that the wheels step upgrades (vLLM 0.23.0 -> 0.26.0 with
install_vllm on) is patched again on the next run, and a rollback then gives back 0.26.0's own files, not a mix with
the 0.23.0 originals kept when it was first patched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.lab.deploy_runner import dist_version, run_pyinfra

pytestmark = pytest.mark.lab


def test_upgraded_package_is_patched_next_run_and_rolls_back_to_its_own_files(scratch_lab: dict,
                                                                            tmp_path: Path) -> None:
    (lab_host,) = scratch_lab["hosts"]
    name = lab_host["name"]
    reports = tmp_path / "reports"
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("CDNA2_LAB_DIR", scratch_lab["lab_dir"])
        first = run_pyinfra("-y", "deploy.py", report_dir=reports)
        assert first.returncode == 0, first.output[-4000:]
        assert dist_version(lab_host, "vllm") == "0.23.0" and first.row(name)["steps"]["patches vllm"]["status"] == "changed"

        upgrade = run_pyinfra("-y", "deploy.py", "--data", "install_vllm=true", report_dir=reports)
        assert upgrade.returncode == 0, upgrade.output[-4000:]
        assert dist_version(lab_host, "vllm") == "0.26.0"
        row = upgrade.row(name)
        assert row["status"] == "ok" and row["packages"]["vllm"] == "0.23.0 -> 0.26.0", row
        for step in ("patches vllm", "smoke"):
            assert row["steps"][step]["status"] == "skipped", row["steps"][step]
            assert "vllm (re)installed by this run: run the deploy again" in row["steps"][step]["detail"]

        repatched = run_pyinfra("-y", "deploy.py", "--data", "install_vllm=true", report_dir=reports)
        assert repatched.returncode == 0, repatched.output[-4000:]
        row = repatched.row(name)
        assert row["steps"]["patches vllm"]["status"] == "changed" and row["steps"]["smoke"]["status"] == "ok", row

        rolled_back = run_pyinfra("-y", "rollback.py", report_dir=reports)
        assert rolled_back.returncode == 0, rolled_back.output[-4000:]
        detail = rolled_back.row(name)["steps"]["record"]["detail"]
        checked = re.search(r"vllm: (\d+)/(\d+) files match RECORD", detail)
        assert checked and checked.group(1) == checked.group(2), detail
        assert dist_version(lab_host, "vllm") == "0.26.0"

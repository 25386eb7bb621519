"""End-to-end on the simulated lab: triton 3.7.0 is replaced by 3.7.1 from the lab's mirror and proven importable,
a second run installs nothing, and a host whose ROCm is not in the matrix fails untouched while the others finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import mirror
from tests.lab.deploy_runner import dist_version, host_snapshot, run_pyinfra, ssh

pytestmark = pytest.mark.lab


def put_back_broken_triton(lab: dict, lab_host: dict) -> None:
    wheels = Path(lab["lab_dir"]) / "mirror" / "wheels"
    result = ssh(lab, lab_host, f"PIP_CONFIG_FILE=/dev/null /opt/venv/bin/python -m pip install -q --no-index "
                                f"--find-links {wheels} --no-deps triton==3.7.0")
    assert result.returncode == 0, result.stderr


def test_triton_370_is_replaced_from_the_mirror_and_a_rerun_installs_nothing(lab: dict, tmp_path: Path) -> None:
    target = lab["hosts"][0]
    put_back_broken_triton(lab, target)
    assert dist_version(target, "triton") == "3.7.0"
    first = run_pyinfra("-y", "-v", "deploy.py", report_dir=tmp_path)
    assert first.returncode == 0, first.output[-4000:]
    assert dist_version(target, "triton") == "3.7.1"
    row = first.row(target["name"])
    assert row["packages"]["triton"] == "3.7.0 -> 3.7.1" and row["steps"]["wheels"]["status"] == "changed"
    pip_lines = [line for line in first.output.splitlines()
                 if f"[{target['name']}]" in line and "-m pip install" in line]
    assert pip_lines, "the planned pip command is shown to the operator"
    mirror_wheels = str(Path(lab["lab_dir"]) / "mirror" / "wheels")
    for line in pip_lines:
        # The lab hosts take wheels from the lab mirror and from nowhere else.
        assert "PIP_CONFIG_FILE=/dev/null" in line and f"--no-index --find-links {mirror_wheels}" in line, line
        assert "https://" not in line
    second = run_pyinfra("-y", "-v", "deploy.py", report_dir=tmp_path)
    assert second.returncode == 0, second.output[-4000:]
    assert not [line for line in second.output.splitlines() if "-m pip install" in line], \
        "a second run must issue no pip command on any host"
    assert all(row["steps"]["wheels"]["status"] == "unchanged" for row in second.report["hosts"])


def test_host_with_rocm_outside_the_matrix_fails_untouched(lab: dict, tmp_path: Path) -> None:
    narrow = mirror.build(tmp_path / "mirror-rocm64", rocm_versions=("6.4",))
    outside = [host for host in lab["hosts"] if not host["rocm_version"].startswith("6.4")]
    inside = [host for host in lab["hosts"] if host["rocm_version"].startswith("6.4")]
    assert outside and inside
    for lab_host in outside:
        put_back_broken_triton(lab, lab_host)
    before = {host["name"]: host_snapshot(host) for host in outside}
    run = run_pyinfra("-y", "deploy.py", "--data", f"wheel_matrix={narrow / 'wheel-matrix.yaml'}",
                      report_dir=tmp_path / "reports")
    assert run.returncode != 0, "a failed host makes the run exit non-zero"
    for lab_host in outside:
        row = run.row(lab_host["name"])
        assert row["status"] == "failed"
        detail = row["steps"]["preflight"]["detail"]
        assert f"ROCm {lab_host['rocm_version']}" in detail and str(narrow / "wheel-matrix.yaml") in detail, detail
        assert host_snapshot(lab_host) == before[lab_host["name"]], f"{lab_host['name']} must not change"
        assert dist_version(lab_host, "triton") == "3.7.0"
    for lab_host in inside:
        assert run.row(lab_host["name"])["status"] == "ok"
    # Leave the lab as the other tests expect it: provisioned from the lab's own matrix.
    assert run_pyinfra("-y", "deploy.py", report_dir=tmp_path / "reports").returncode == 0

"""End-to-end on the simulated lab: deploy, verify clean; tamper, verify names each drift; deploy repairs; rollback
leaves every host RECORD-pristine; a second rollback changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.lab.deploy_runner import dist_version, lab_hosts, run_pyinfra, site_packages, ssh

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def gfx90a_hosts(lab: dict) -> list[dict]:
    hosts = [host for host in lab["hosts"] if host["arch"] == "gfx90a"]
    assert len(hosts) >= 2, "the default lab has two MI210 hosts"
    return hosts


def test_tamper_verify_repair_rollback(lab: dict, gfx90a_hosts: list[dict], tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    deployed = run_pyinfra("-y", "deploy.py", report_dir=reports)
    assert deployed.returncode == 0, deployed.output[-4000:]
    clean = run_pyinfra("-y", "verify.py", report_dir=reports)
    assert clean.returncode == 0, clean.output[-4000:]
    assert all(row["steps"]["verify"]["status"] == "ok" for row in clean.report["hosts"])
    for lab_host in gfx90a_hosts:  # the families as the deploy's smoke step judged them: unproven in the lab
        row = clean.row(lab_host["name"])
        assert any(note.startswith("kernel families: ") and "unproven" in note for note in row["notes"]), row["notes"]
        assert {entry["verdict"] for entry in row["details"]["families"].values()} == {"unproven"}

    # Tamper: lose a patch (the pristine file back, as a reinstall would do), delete a kernel, replace triton.
    first, second = gfx90a_hosts[:2]
    first_site, second_site = site_packages(first), site_packages(second)
    original = Path(first["binds"]["/var/lib/cdna2"]) / "backups/vllm/originals/vllm/_aiter_ops.py"
    shutil.copyfile(original, first_site / "vllm/_aiter_ops.py")
    kernel = sorted((second_site / "aiter_meta/hsa/gfx90a").rglob("*.co"))[0]
    kernel.unlink()
    mirror = Path(lab["lab_dir"]) / "mirror" / "wheels"
    replaced = ssh(lab, first, f"PIP_CONFIG_FILE=/dev/null /opt/venv/bin/python -m pip install -q --no-index "
                               f"--find-links {mirror} --no-deps triton==3.7.0")
    assert replaced.returncode == 0, replaced.stderr

    drifted = run_pyinfra("-y", "verify.py", report_dir=reports)
    assert drifted.returncode != 0, "verify must exit non-zero on drift"
    first_drift = drifted.row(first["name"])["steps"]["verify"]["detail"]
    assert "triton changed underneath us: deployed 3.7.1, found 3.7.0" in first_drift
    assert "vllm patch lost: vllm/_aiter_ops.py" in first_drift
    assert "kernels altered" in drifted.row(second["name"])["steps"]["verify"]["detail"]

    repaired = run_pyinfra("-y", "deploy.py", report_dir=reports)
    assert repaired.returncode == 0, repaired.output[-4000:]
    assert run_pyinfra("-y", "verify.py", report_dir=reports).returncode == 0, "the deploy repairs every drift"
    assert kernel.exists()

    rolled_back = run_pyinfra("-y", "rollback.py", report_dir=reports)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    for lab_host in lab_hosts(lab):
        row = rolled_back.row(lab_host["name"])
        assert row["steps"]["record"]["status"] == "ok", row["steps"]
        site = site_packages(lab_host)
        assert not (site / "aiter_meta/hsa/gfx90a").exists() and not (site / "aiter_meta/hsa/.gfx90a.previous").exists()
        assert not any(Path(lab_host["binds"]["/var/lib/cdna2"]).iterdir()), "the tool's state is cleared"
    for lab_host in gfx90a_hosts:
        detail = rolled_back.row(lab_host["name"])["steps"]["record"]["detail"]
        assert "amd-aiter: 9100/9100 files match RECORD" in detail and "vllm:" in detail

    again = run_pyinfra("-y", "rollback.py", report_dir=reports)
    assert again.returncode == 0, again.output[-4000:]
    assert {row["host"]: row["changes"] for row in again.report["hosts"] if row["changes"]} == {}
    assert all(row["steps"]["rollback"]["detail"] == "nothing to undo" for row in again.report["hosts"])


def test_rollback_restores_the_pre_deploy_triton_when_asked(lab: dict, gfx90a_hosts: list[dict], tmp_path: Path) -> None:
    target = gfx90a_hosts[0]
    mirror = Path(lab["lab_dir"]) / "mirror" / "wheels"
    assert run_pyinfra("-y", "rollback.py", report_dir=tmp_path).returncode == 0
    downgraded = ssh(lab, target, f"PIP_CONFIG_FILE=/dev/null /opt/venv/bin/python -m pip install -q --no-index "
                                  f"--find-links {mirror} --no-deps triton==3.7.0")
    assert downgraded.returncode == 0, downgraded.stderr
    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert deployed.returncode == 0 and deployed.row(target["name"])["packages"]["triton"] == "3.7.0 -> 3.7.1"

    restored = run_pyinfra("-y", "rollback.py", "--data", "rollback_restore_triton=true", report_dir=tmp_path)
    assert restored.returncode == 0, restored.output[-4000:]
    assert "reinstall triton==3.7.0 (recorded before the first deploy)" in \
        restored.row(target["name"])["steps"]["rollback"]["detail"]
    assert dist_version(target, "triton") == "3.7.0"

    # Rolled back, the host has no state and no baseline left: a second rollback with the flag changes nothing.
    again = run_pyinfra("-y", "rollback.py", "--data", "rollback_restore_triton=true", report_dir=tmp_path)
    assert again.returncode == 0, again.output[-4000:]
    assert {row["host"]: row["changes"] for row in again.report["hosts"] if row["changes"]} == {}
    assert run_pyinfra("-y", "deploy.py", report_dir=tmp_path).returncode == 0, "leave the lab provisioned"

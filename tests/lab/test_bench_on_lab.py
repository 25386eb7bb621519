"""End-to-end on the simulated lab: a deploy, then ``pyinfra inventory/sim.py bench.py``.

The lab's GPUs are stand-ins (a scripted rocminfo, no device, no ROCm torch), so inventory/sim.py turns the smoke
test's GPU checks off: no gfx90a host holds a smoke pass made with them, and the bench report must name every case
of every host as skipped with that reason (the gfx942 host with its arch), run nothing on any host, draw no picture,
and fail no host. ``bench_on_deploy`` in the deploy reports the same reason in its bench step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdna2.bench import load_cases
from tests.lab.deploy_runner import host_snapshot, lab_hosts, run_pyinfra

pytestmark = pytest.mark.lab

CASE_NAMES = [case["name"] for case in load_cases()["cases"]]
STAND_IN = "ran without GPU checks (smoke_gpu_checks is off: its GPU is a stand-in)"


def test_bench_after_a_lab_deploy_names_every_case_skipped_with_the_reason(lab: dict, tmp_path: Path) -> None:
    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert deployed.returncode == 0, deployed.output[-4000:]
    before = {host["name"]: host_snapshot(host) for host in lab["hosts"]}

    benched = run_pyinfra("-y", "bench.py", report_dir=tmp_path)
    assert benched.returncode == 0, benched.output[-4000:]
    assert {host["name"]: host_snapshot(host) for host in lab["hosts"]} == before, "bench.py changed a host"
    report = json.loads((tmp_path / "bench-latest.json").read_text())
    markdown = (tmp_path / "bench-latest.md").read_text()
    assert report["picture"] is None and "No picture: no host has a figure for any case." in markdown
    assert {entry["host"] for entry in report["hosts"]} == {host["name"] for host in lab["hosts"]}
    for lab_host in lab_hosts(lab):
        entry = next(entry for entry in report["hosts"] if entry["host"] == lab_host["name"])
        reason = STAND_IN if lab_host["arch"] == "gfx90a" else f"not a gfx90a host (the probe saw {lab_host['arch']})"
        assert entry["status"] == "skipped" and reason in entry["reason"], entry
        assert [case["case"] for case in entry["cases"]] == CASE_NAMES
        assert all(case["status"] == "skipped" and reason in case["detail"] for case in entry["cases"])
        assert f"Skipped: {', '.join(CASE_NAMES)}: " in markdown
        assert benched.row(lab_host["name"])["steps"]["bench"]["status"] == "skipped"
    assert "cdna2.host.bench" not in benched.output, "no host ran the bench runner"

    on_deploy = run_pyinfra("-y", "deploy.py", "--data", "bench_on_deploy=true", report_dir=tmp_path)
    assert on_deploy.returncode == 0, on_deploy.output[-4000:]
    for lab_host in lab_hosts(lab, "gfx90a"):
        step = on_deploy.row(lab_host["name"])["steps"]["bench"]
        assert step["status"] == "skipped" and "smoke_gpu_checks is off" in step["detail"], step

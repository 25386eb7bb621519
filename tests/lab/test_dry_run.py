"""End-to-end on the simulated lab: --dry previews every change (patches as unified diffs, the kernel upload, the
pip commands) and changes nothing; the real run then applies exactly that, and leaves the gfx942 host alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.deploy_runner import host_snapshot, lab_hosts, run_pyinfra

pytestmark = pytest.mark.lab


def test_dry_run_shows_diffs_and_changes_nothing_then_deploy_applies(lab: dict, tmp_path: Path) -> None:
    assert run_pyinfra("-y", "rollback.py", report_dir=tmp_path).returncode == 0
    before = {host["name"]: host_snapshot(host) for host in lab["hosts"]}

    dry = run_pyinfra("deploy.py", "--dry", report_dir=tmp_path)
    assert dry.returncode == 0, dry.output[-4000:]
    assert {host["name"]: host_snapshot(host) for host in lab["hosts"]} == before, "--dry changed a host"
    assert dry.report["mode"] == "deploy" and dry.report["executed"] is False
    for lab_host in lab_hosts(lab, "gfx90a"):
        name = lab_host["name"]
        lines = [line.split("]", 1)[1].strip() for line in dry.output.splitlines() if f"[{name}]" in line]
        assert any(line.startswith("patches: vllm ") for line in lines), lines
        assert any(line.startswith("kernels: upload gfx90a-") for line in lines), lines
        row = dry.row(name)
        assert row["steps"]["kernels"]["status"] == "planned"
        diffs = [change["diff"] for change in row["details"]["patches vllm"]["changes"]]
        assert diffs and all(diff.startswith("--- a/vllm/") for diff in diffs)
        # pyinfra indents the first line of a log message; every diff's body is printed as it is in the report.
        assert all(diff.split("\n", 1)[1] in dry.output for diff in diffs), "every diff is printed"
    assert "--- a/vllm/v1/attention/backends/rocm_aiter_fa.py" in dry.output

    applied = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert applied.returncode == 0, applied.output[-4000:]
    for lab_host in lab_hosts(lab):
        after = host_snapshot(lab_host)
        if lab_host["arch"] == "gfx90a":
            assert after["hsa"] != before[lab_host["name"]]["hsa"], "kernels installed"
            steps = applied.row(lab_host["name"])["steps"]
            assert steps["patches vllm"]["status"] == steps["patches amd-aiter"]["status"] == "changed"
        else:
            steps = applied.row(lab_host["name"])["steps"]
            assert steps["kernels"]["status"] == "skipped" and "left alone" in steps["kernels"]["detail"]
            assert "patches amd-aiter" in steps and steps["patches amd-aiter"]["status"] == "skipped"
            # AITER left alone; its wheels (triton 3.7.1 after amd-aiter, on every arch) change only where the dry
            # run planned them, so the test holds whether or not an earlier test already upgraded this host.
            was = before[lab_host["name"]]
            assert (after["hsa"], after["aiter"]) == (was["hsa"], was["aiter"]), "gfx942 host's AITER left alone"
            planned_wheels = dry.row(lab_host["name"])["steps"]["wheels"]["status"] == "planned"
            assert (after["dist-info"] != was["dist-info"]) == planned_wheels, \
                (dry.row(lab_host["name"])["steps"]["wheels"], after["dist-info"])
            assert steps["wheels"]["status"] == ("changed" if planned_wheels else "unchanged"), steps["wheels"]


def test_without_a_usable_llvm_the_gfx90a_hosts_fail_in_preflight_naming_what_was_tried(
        lab: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No LLVM on the controller is the controller's problem, said per gfx90a host before anything on it changes
    (it was a traceback through pyinfra); the gfx942 host, which needs no translation, is planned as usual."""
    monkeypatch.setenv("ROCM_LLVM_BIN", str(tmp_path / "no-llvm-here"))
    dry = run_pyinfra("deploy.py", "--dry", report_dir=tmp_path)
    # A dry run executes nothing, the preflight's failure included: the report says which hosts would fail.
    assert "Traceback" not in dry.output and dry.report["executed"] is False
    gfx90a = sorted(h["name"] for h in lab["hosts"] if h["arch"] == "gfx90a")
    assert sorted(dry.report["failed_hosts"]) == gfx90a
    for name in gfx90a:
        detail = dry.row(name)["steps"]["preflight"]["detail"]
        assert detail.startswith("the controller cannot translate kernels: no usable LLVM found"), detail
        assert f"{tmp_path / 'no-llvm-here'}: missing llvm-mc" in detail and "ROCM_LLVM_BIN" in detail
    for other in (h["name"] for h in lab["hosts"] if h["arch"] != "gfx90a"):
        assert dry.row(other)["status"] == "ok"

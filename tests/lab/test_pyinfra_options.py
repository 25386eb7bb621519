"""pyinfra's own options an operator will try on the deploy: each works on the deployed lab, and the report says
what ran. Runs on the shared lab (tests/lab/conftest.py), deployed first if it is not (a no-op when it is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.deploy_runner import host_snapshot, run_pyinfra

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def deployed(lab: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    first = run_pyinfra("-y", "deploy.py", report_dir=tmp_path_factory.mktemp("deploy"))
    assert first.returncode == 0, first.output[-4000:]
    return lab


def snapshots(lab: dict) -> dict:
    return {host["name"]: host_snapshot(host) for host in lab["hosts"]}


def test_limit_to_a_group_runs_that_group_only(deployed: dict, tmp_path: Path) -> None:
    gfx942 = sorted(host["name"] for host in deployed["hosts"] if host["group"] == "mi300x")
    limited = run_pyinfra("-y", "deploy.py", "--limit", "mi300x", report_dir=tmp_path)
    assert limited.returncode == 0, limited.output[-4000:]
    assert [row["host"] for row in limited.report["hosts"]] == gfx942
    assert limited.report["summary"]["text"] == f"{len(gfx942)} host{'s' * (len(gfx942) > 1)}: " \
                                                f"{len(gfx942)} left alone (gfx942), 0 failed"


@pytest.mark.parametrize("options", [("--serial",), ("--parallel", "1"), ("--diff",)])
def test_serial_parallel_and_diff_runs_are_the_same_no_op(deployed: dict, tmp_path: Path,
                                                          options: tuple[str, ...]) -> None:
    before = snapshots(deployed)
    run = run_pyinfra("-y", "deploy.py", *options, report_dir=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(row["host"] for row in run.report["hosts"]) == sorted(before)
    assert {row["host"]: row["changes"] for row in run.report["hosts"] if row["changes"]} == {}
    assert all(row["status"] == "ok" for row in run.report["hosts"]), run.report["hosts"]
    assert snapshots(deployed) == before


def test_debug_operations_prints_the_plan_and_executes_nothing(deployed: dict, tmp_path: Path) -> None:
    before = snapshots(deployed)
    run = run_pyinfra("deploy.py", "--debug-operations", report_dir=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert "--> Beginning operation run..." not in run.output
    assert run.report["executed"] is False, "the report must not claim anything was executed"
    assert snapshots(deployed) == before

"""operations.rollback.stock_files_verified, run by real pyinfra (API mode) against @fake hosts that answer the host
probe with a RECORD comparison: a package whose RECORD proves nothing fails the host instead of "0/0 files match"."""

from __future__ import annotations

import json

from pyinfra.api import State
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from cdna2.reports.run import RunReport
from operations import rollback
from tests.unit.operations.fake_hosts import fake_host

PROBE_OPTIONS = '"record_check"'  # a substring of the probe's command line: its JSON options


def verify_stock(record_check: dict) -> tuple[State, object, RunReport]:
    output = json.dumps({"record_check": record_check})
    state, host = fake_host({PROBE_OPTIONS: output})
    report = RunReport(mode="rollback", inventory="test")
    add_op(state, rollback.stock_files_verified, report=report, packages=["amd-aiter", "vllm"],
           target_python="/opt/venv/bin/python", rocm_root="/opt/rocm", state_dir="/var/lib/cdna2", host=[host])
    run_ops(state)
    return state, host, report


def test_a_package_whose_record_proves_nothing_fails_the_rollback_proof() -> None:
    unproven = "no file of /opt/venv/site checked: its RECORD is missing, unreadable or lists no file with a hash"
    state, host, report = verify_stock({"amd-aiter": {"checked": 0, "mismatched": [], "missing": [],
                                                      "unproven": unproven}})
    assert host in state.failed_hosts
    step = report.host("@fake/a").steps["record"]
    assert step.status == "failed"
    assert step.detail == f"amd-aiter: unproven, {unproven}; reinstall amd-aiter; vllm: not installed, nothing to check"


def test_every_file_matching_its_record_is_the_proof() -> None:
    state, host, report = verify_stock({"amd-aiter": {"checked": 12, "mismatched": [], "missing": [],
                                                      "unproven": None}})
    assert host not in state.failed_hosts
    assert report.host("@fake/a").steps["record"].detail == ("amd-aiter: 12/12 files match RECORD; vllm: not "
                                                             "installed, nothing to check")

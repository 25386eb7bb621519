"""operations.smoke.smoke_passed, run by real pyinfra (API mode) against @fake hosts that answer the smoke fact
with what the real smoke command printed on a fixture host (in a target venv with no torch).

What this pins down: a gfx90a host whose GPU cannot be used fails and gets no recorded pass; a pass records what
it proves, including whether its GPU checks ran; the fact's command carries the probed arch.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra.api import State
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from cdna2.host.smoke import GPU_CHECKS
from cdna2.reports.run import RunReport
from operations import smoke
from operations.facts import SmokeResult
from lab import wheelhouse
from tests.unit.operations.fake_hosts import fake_host
from tests.unit.smoke.conftest import make_agent, make_target_python, provisioned_host, run_smoke_command

DEPLOYED = {"kernels": "ab" * 32, "packages": {"amd-aiter": "0.1.7.post2.dev18"}}
SMOKE_COMMAND = "cdna2.host.smoke --site-packages"


def smoke_output(tmp_path: Path, *options: str) -> str:
    """The real smoke command's JSON line on a provisioned fixture host whose environment has triton 3.7.1 and no
    torch (exit status ignored, as the fact does)."""
    host = provisioned_host(tmp_path)
    python = make_target_python(tmp_path / "venv", [host.site, wheelhouse.installed_tree(wheelhouse.TRITON_PINNED)])
    _, report, _ = run_smoke_command(python, make_agent(tmp_path / "agent"), host, *options)
    return json.dumps(report)


def run_smoke_op(output: str, **arguments) -> tuple[State, object, RunReport]:
    state, host = fake_host({SMOKE_COMMAND: output})
    report = RunReport(mode="deploy", inventory="test")
    add_op(state, smoke.smoke_passed, report=report, deployed=DEPLOYED, current_state=None,
           site_packages="/opt/venv/site", target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2",
           host=[host], **arguments)
    run_ops(state)
    return state, host, report


def recorded(host) -> list[str]:
    return [command for command in host.connector.executed_commands if "cdna2.host.state" in command]


def test_a_gfx90a_host_whose_gpu_cannot_be_used_fails_and_records_no_pass(tmp_path: Path) -> None:
    output = smoke_output(tmp_path, "--host-arch", "gfx90a")  # the device probe finds no torch
    state, host, report = run_smoke_op(output, host_arch="gfx90a")
    assert host in state.failed_hosts
    assert recorded(host) == [], "no pass may be recorded"
    step = report.host("@fake/a").steps["smoke"]
    # import_aiter and every GPU check
    assert step.status == "failed" and f"{len(GPU_CHECKS) + 1} failed" in step.detail, step


def test_the_smoke_fact_passes_the_probed_arch_and_the_gpu_switch() -> None:
    def command(**arguments) -> str:
        return SmokeResult().command(target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2",
                                     site_packages="/opt/venv/site", expect_triton="3.7.1", **arguments).get_raw_value()
    assert "--host-arch gfx90a --expect-triton" in command(host_arch="gfx90a", gpu_checks=True)
    assert "--host-arch none --no-gpu-checks" in command(host_arch=None, gpu_checks=False)


def test_gpu_checks_reported_skipped_on_a_gfx90a_host_still_fail_it(tmp_path: Path) -> None:
    # What an agent that ignored the arch would print: every GPU check skipped, exit 0.
    output = smoke_output(tmp_path, "--host-arch", "none")
    state, host, _ = run_smoke_op(output, host_arch="gfx90a")
    assert host in state.failed_hosts and recorded(host) == []


def test_a_pass_without_gpu_checks_records_that_it_was_made_without_them(tmp_path: Path) -> None:
    output = smoke_output(tmp_path, "--host-arch", "gfx90a", "--no-gpu-checks")
    state, host, report = run_smoke_op(output, host_arch="gfx90a", gpu_checks=False)
    assert host not in state.failed_hosts, report.host("@fake/a").steps["smoke"]
    [command] = recorded(host)
    passed = json.loads(shlex.split(command)[-1])
    assert passed["proves"] == smoke.proof_key(DEPLOYED, gpu_checks=False)
    assert passed["proves"] != smoke.proof_key(DEPLOYED, gpu_checks=True), "a pass without GPU checks stands alone"
    assert smoke.recorded_proof(DEPLOYED, True, {"smoke": passed}) is None
    assert smoke.recorded_proof(DEPLOYED, False, {"smoke": passed}) == passed

"""The deploy over a real Slurm, the way a LUMI user runs it: inside an allocation, every node reached through job
steps (the @slurm connector), no SSH at all (each node's sshd is stopped before the first run).

The lab is four MI210 hosts sharing one Python environment (``./lab/up 4 --shared 4 --slurm``: Debian's slurmctld
and a slurmd in each host's namespaces, lab/slurm.py), brought up as the session's lab tests start (early_labs in
tests/lab/conftest.py), shared by the tests of this module and stopped at its end.
The tests run in file order: the last one kills a node's slurmd for good.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cdna2.host.digests import tree_digest
from lab import kinds, slurm
from lab.labstate import LabPaths
from lab.processes import wait_gone
from tests.lab.conftest import early_lab, run_lab_command
from tests.lab.deploy_runner import (PYINFRA, REPO, data_args, run_in_allocation, site_packages,
                                     slurm_environment)

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SUBNET = f"{kinds.LAB_NET}.80"
NODES = ["mi210-a", "mi210-b", "mi210-c", "mi210-d"]
WRITER = NODES[0]
TIME_LIMIT_JOB = "cdna2-test-time-limit"


@early_lab("slurm_lab", "slurm")
def _slurm_lab_up(lab_dir: Path) -> dict:
    run_lab_command("up", str(len(NODES)), "--shared", str(len(NODES)), "--slurm", "--subnet", SUBNET,
                    lab_dir=lab_dir)
    lab = json.loads((lab_dir / "lab.json").read_text())
    for host in lab["hosts"]:  # Slurm alone from here: the namespaces stay, held by each host's slurmd
        os.kill(host["pid"], signal.SIGTERM)
        assert wait_gone(host["pid"], 10), f"{host['name']}: sshd pid {host['pid']} still running"
    lab["paths"] = LabPaths(lab_dir)
    lab["time_limit_run"] = _start_time_limit_run(lab)
    return lab


@pytest.fixture(scope="module")
def slurm_lab(early_labs: dict, in_background) -> dict:
    lab_dir, bring_up = early_labs["slurm_lab"]
    time_limit_run = None
    try:
        lab = bring_up.result()
        time_limit_run = lab["time_limit_run"]
        yield lab
    finally:
        if time_limit_run is not None and time_limit_run[0].poll() is None:  # the test did not run to read it
            time_limit_run[0].kill()
            time_limit_run[0].wait()
        in_background.submit(run_lab_command, "down", lab_dir=lab_dir, check=False)


def environment_snapshot(lab: dict) -> dict[str, str]:
    """Digests of the shared environment (every host's /opt/venv is the first host's directory)."""
    site = site_packages(lab["hosts"][0])
    return {"aiter": tree_digest(site / "aiter"), "hsa": tree_digest(site / "aiter_meta" / "hsa"),
            "dist-info": "".join(sorted(p.name for p in site.glob("*.dist-info")))}


def _start_time_limit_run(lab: dict) -> tuple[subprocess.Popen, str]:
    """A command over the @slurm connector that outlives its allocation's time limit (1 minute, Slurm's least;
    slurmctld enforces it on its next periodic check, so 60 to 90 s): started with the lab, so that the wait
    overlaps the other tests; test_a_step_past_its_time_limit reads its outcome."""
    environment = slurm.client_environment(lab["paths"])
    granted = subprocess.run(["salloc", "--no-shell", "-N1", "-w", NODES[1], "-t", "1", "-J", TIME_LIMIT_JOB],
                             capture_output=True, text=True, env=environment, timeout=60)
    found = re.search(r"Granted job allocation (\d+)", granted.stderr)
    assert granted.returncode == 0 and found, granted.stderr
    job = found.group(1)
    process = subprocess.Popen([str(PYINFRA), "-y", "inventory/slurm.py", "exec", "--", "sleep", "600"], cwd=REPO,
                               env={**slurm_environment(lab), "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": NODES[1]},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, job


def test_outside_any_allocation_the_run_stops_and_changes_nothing(slurm_lab: dict, tmp_path: Path) -> None:
    before = environment_snapshot(slurm_lab)
    environment = slurm_environment(slurm_lab, CDNA2_REPORT_DIR=str(tmp_path), CDNA2_NODELIST=",".join(NODES))
    result = subprocess.run([str(PYINFRA), "-y", "inventory/slurm.py", "deploy.py", *data_args(environment)],
                            cwd=REPO, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode != 0
    assert "not inside a Slurm allocation: SLURM_JOB_ID is not set" in result.stdout + result.stderr, (
        result.stdout[-2000:] + result.stderr[-2000:])
    assert environment_snapshot(slurm_lab) == before


def test_deploy_redeploy_verify_and_rollback_over_slurm_alone(slurm_lab: dict, tmp_path: Path) -> None:
    before = environment_snapshot(slurm_lab)
    dry = run_in_allocation(slurm_lab, "-y", "deploy.py", "--dry", report_dir=tmp_path, nodes=len(NODES))
    assert dry.returncode == 0 and not dry.report["executed"], dry.output[-3000:]
    assert environment_snapshot(slurm_lab) == before, "--dry changed nothing"
    assert dry.report["transport"]["steps"] == 1, dry.report["transport"]  # the probe, one step for 4 nodes

    deployed = run_in_allocation(slurm_lab, "-y", "deploy.py", report_dir=tmp_path, nodes=len(NODES))
    assert deployed.returncode == 0, deployed.output[-4000:]
    assert [deployed.row(node)["outcome"] for node in NODES] == ["provisioned"] * 4
    steps = deployed.report["transport"]
    # One writer: every step on a single node is the writer's own work; each phase the checkers run alike (probe,
    # check of the writer's result, smoke) is one step across the nodes.
    assert list(steps["node_steps_by_node"]) == [WRITER] and steps["node_steps"] > 0, steps
    assert 1 <= steps["fanout_steps"] <= 5 and steps["fanout_nodes"] >= 3 * steps["fanout_steps"], steps
    (environment,) = deployed.report["shared_environments"]
    assert environment["writer"] == WRITER and sorted(environment["verified_by"]) == NODES, environment
    assert environment_snapshot(slurm_lab) != before

    again = run_in_allocation(slurm_lab, "-y", "deploy.py", report_dir=tmp_path, nodes=len(NODES))
    assert again.returncode == 0 and all(again.row(node)["changes"] == [] for node in NODES), again.output[-3000:]
    assert again.report["transport"]["steps"] == 1, again.report["transport"]

    verified = run_in_allocation(slurm_lab, "-y", "verify.py", report_dir=tmp_path, nodes=len(NODES))
    assert verified.returncode == 0, verified.output[-3000:]
    assert all(verified.row(node)["steps"]["verify"]["status"] == "ok" for node in NODES)
    assert verified.report["transport"]["steps"] == 1, verified.report["transport"]

    limited = run_in_allocation(slurm_lab, "-y", "verify.py", "--limit", NODES[2], report_dir=tmp_path,
                                nodes=len(NODES))
    assert limited.returncode == 0 and [row["host"] for row in limited.report["hosts"]] == [NODES[2]], (
        limited.output[-3000:])

    rolled_back = run_in_allocation(slurm_lab, "-y", "rollback.py", report_dir=tmp_path, nodes=len(NODES))
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    after = environment_snapshot(slurm_lab)
    assert (after["aiter"], after["hsa"]) == (before["aiter"], before["hsa"]), "rollback restores AITER as it was"


def test_uploads_and_downloads_are_byte_identical(slurm_lab: dict, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 64 + b"\r\n\x00no newline at the end"
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    node = NODES[3]
    environment = slurm_environment(slurm_lab)
    for args in (["files.put", f"src={source}", "dest=/tmp/payload.bin"],
                 ["files.get", "src=/tmp/payload.bin", f"dest={tmp_path / 'back.bin'}"]):
        result = subprocess.run(["salloc", "-Q", "-N1", "-w", node, str(PYINFRA), "-y", "inventory/slurm.py", *args],
                                cwd=REPO, capture_output=True, text=True, env=environment, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    on_node = Path(next(host for host in slurm_lab["hosts"] if host["name"] == node)["binds"]["/tmp"])
    assert (on_node / "payload.bin").read_bytes() == payload
    assert (tmp_path / "back.bin").read_bytes() == payload


def test_a_step_past_its_time_limit_fails_its_node_with_slurms_words(slurm_lab: dict) -> None:
    process, job = slurm_lab["time_limit_run"]
    output, _ = process.communicate(timeout=240)
    assert process.returncode != 0
    assert (f"{NODES[1]}: Slurm refused or ended the job step (job {job}): " in output
            and "DUE TO TIME LIMIT" in output), output[-3000:]
    # The allocation has ended: a later run in it stops at connecting, with Slurm's answer.
    ended = subprocess.run([str(PYINFRA), "-y", "inventory/slurm.py", "exec", "--", "true"], cwd=REPO,
                           capture_output=True, text=True, timeout=120,
                           env={**slurm_environment(slurm_lab), "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": NODES[1]})
    assert ended.returncode != 0
    assert re.search(rf"{NODES[1]}: (job {job} is TIMEOUT .*its allocation has ended|scontrol show job {job}: "
                     rf"slurm_load_jobs error: Invalid job id)", ended.stdout + ended.stderr), (
        ended.stdout[-2000:] + ended.stderr[-2000:])


def _job_steps(environment: dict[str, str], name: str) -> list[str]:
    listed = subprocess.run(["squeue", "--steps", "-h", "-n", name, "-o", "%N"], capture_output=True, text=True,
                            env=environment, timeout=30)
    return listed.stdout.split()


def test_a_node_whose_slurmd_dies_mid_run_fails_alone(slurm_lab: dict, tmp_path: Path) -> None:
    """A full deploy (the environment is pristine again after the rollback); once the writer runs its own steps,
    the last node's slurmd is killed: the writer and the other checkers complete, the report names the node with
    Slurm's words, and the environment is whole (verify on the others finds it as deployed)."""
    lost = NODES[-1]
    name = f"cdna2-test-{uuid.uuid4().hex[:8]}"
    environment = slurm_environment(slurm_lab, CDNA2_REPORT_DIR=str(tmp_path))
    run = subprocess.Popen(["salloc", "-Q", "--no-kill", f"-N{len(NODES)}", "-J", name, str(PYINFRA), "-y",
                            "inventory/slurm.py", "deploy.py", *data_args(environment)], cwd=REPO,
                           env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while WRITER not in _job_steps(environment, name):  # a step on the writer alone: its own work has begun
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before the writer's steps"
        time.sleep(0.05)
    os.kill(slurm_lab["slurm"]["slurmd_pids"][lost], signal.SIGKILL)
    output, _ = run.communicate(timeout=600)
    report = json.loads((tmp_path / "latest.json").read_text())
    rows = {row["host"]: row for row in report["hosts"]}
    assert run.returncode != 0, output[-3000:]
    assert [rows[node]["outcome"] for node in NODES[:-1]] == ["provisioned"] * 3, output[-4000:]
    assert rows[lost]["status"] == "failed"
    assert any("Slurm refused or ended the job step" in error for error in rows[lost]["errors"]), rows[lost]

    verified = run_in_allocation(slurm_lab, "-y", "verify.py", report_dir=tmp_path, nodes=len(NODES) - 1,
                                 salloc=("-w", ",".join(NODES[:-1])))
    assert verified.returncode == 0, verified.output[-3000:]
    assert all(verified.row(node)["steps"]["verify"]["status"] == "ok" for node in NODES[:-1])

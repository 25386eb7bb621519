"""Run pyinfra against the simulated lab the way an operator does, and read what the run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from cdna2.host.digests import tree_digest
from lab import slurm
from lab.labctl import ssh_argv
from lab.processes import namespace_processes

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")


@dataclass
class DeployRun:
    returncode: int
    output: str
    report: dict | None

    def row(self, host: str) -> dict:
        assert self.report is not None, f"the run wrote no report:\n{self.output[-3000:]}"
        return next(row for row in self.report["hosts"] if row["host"] == host)


def run_pyinfra(*args: str, report_dir: Path, inventory: str = "inventory/sim.py", timeout: int = 900) -> DeployRun:
    """``pyinfra INVENTORY ARGS`` from the repository root (where group_data/ is), reports into report_dir."""
    environment = dict(os.environ, CDNA2_REPORT_DIR=str(report_dir), PYINFRA_PROGRESS="off")
    result = subprocess.run([str(PYINFRA), inventory, *args], cwd=REPO, capture_output=True, text=True,
                            env=environment, timeout=timeout, stdin=subprocess.DEVNULL)
    latest = report_dir / "latest.json"
    report = json.loads(latest.read_text()) if latest.exists() else None
    if latest.exists():
        latest.unlink()  # the next run in this directory must write its own
    return DeployRun(result.returncode, result.stdout + result.stderr, report)


def slurm_environment(lab: dict, **extra: str) -> dict[str, str]:
    """The environment of a run in the lab's Slurm (``lab``: its lab.json with ``paths``): the client commands'
    configuration, the lab's Python environment and its mirror's wheels."""
    mirror = Path(lab["lab_dir"]) / "mirror"
    return {**slurm.client_environment(lab["paths"]), "CDNA2_TARGET_PYTHON": "/opt/venv/bin/python",
            "PYINFRA_PROGRESS": "off", "CDNA2_LAB_DIR": lab["lab_dir"], **extra,
            "CDNA2_DATA": f"wheel_matrix={mirror / 'wheel-matrix.yaml'} wheel_find_links={mirror / 'wheels'}"}


def data_args(environment: dict[str, str]) -> list[str]:
    return [arg for pair in environment["CDNA2_DATA"].split() for arg in ("--data", pair)] + [
        "--data", "smoke_gpu_checks=false"]  # the lab's GPUs are stand-ins


def run_in_allocation(lab: dict, *args: str, report_dir: Path, nodes: int,
                      salloc: tuple[str, ...] = (), timeout: int = 900) -> DeployRun:
    """``salloc -N NODES pyinfra inventory/slurm.py ARGS``: a real allocation, the inventory inside it."""
    environment = slurm_environment(lab, CDNA2_REPORT_DIR=str(report_dir))
    result = subprocess.run(["salloc", "-Q", f"-N{nodes}", *salloc, str(PYINFRA), "inventory/slurm.py", *args,
                             *data_args(environment)], cwd=REPO, capture_output=True, text=True, env=environment,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    latest = report_dir / "latest.json"
    report = json.loads(latest.read_text()) if latest.exists() else None
    latest.unlink(missing_ok=True)
    return DeployRun(result.returncode, result.stdout + result.stderr, report)


def lab_hosts(lab: dict, arch: str | None = None, other_than: str | None = None) -> list[dict]:
    """The lab's hosts (of ``arch``, or of any arch but ``other_than``); never none: a loop over no host proves
    nothing, so a lab that lost the hosts a test is about fails it."""
    hosts = [host for host in lab["hosts"]
             if (arch is None or host["arch"] == arch) and (other_than is None or host["arch"] != other_than)]
    assert hosts, f"the lab has no host{' of ' + arch if arch else ''}{' but ' + other_than if other_than else ''}"
    return hosts


def site_packages(lab_host: dict) -> Path:
    venv = Path(lab_host["binds"]["/opt/venv"])
    return next(venv.glob("lib/python3*/site-packages"))


def dist_version(lab_host: dict, distribution: str) -> str:
    """The version of ``distribution`` on a lab host, read from its one dist-info directory (a second one fails)."""
    (dist_info,) = site_packages(lab_host).glob(f"{distribution}-*.dist-info")
    return dist_info.name.removeprefix(f"{distribution}-").removesuffix(".dist-info")


def host_snapshot(lab_host: dict) -> dict[str, str | None]:
    """Digests of everything the deploy may change on a lab host, read through its bind-mount sources."""
    site = site_packages(lab_host)
    state = Path(lab_host["binds"]["/var/lib/cdna2"])
    return {
        "state": tree_digest(state) if state.exists() else None,
        "hsa": tree_digest(site / "aiter_meta" / "hsa"),
        "dist-info": "".join(sorted(p.name for p in site.glob("*.dist-info"))),
        "aiter": tree_digest(site / "aiter"),
    }


def ssh(lab: dict, lab_host: dict, command: str) -> subprocess.CompletedProcess:
    """Run ``command`` on a lab host as an operator would: real ssh, the lab key, host-key checking on."""
    return subprocess.run(ssh_argv(lab, lab_host, command), capture_output=True, text=True, timeout=300)


def assert_redeploy_verify_rollback(lab_host: dict, report_dir: Path, before: dict[str, str | None]) -> None:
    """After a deploy of ``lab_host``: a second deploy changes nothing, verify finds it as deployed, and rollback
    leaves AITER as ``before`` (a ``host_snapshot`` from before the deploy) and checks it against RECORD."""
    name = lab_host["name"]
    again = run_pyinfra("-y", "deploy.py", report_dir=report_dir)
    assert again.returncode == 0 and again.row(name)["changes"] == [], again.row(name)
    verified = run_pyinfra("-y", "verify.py", report_dir=report_dir)
    assert verified.returncode == 0 and verified.row(name)["steps"]["verify"] == {
        "status": "ok", "detail": "as deployed"}, verified.output[-3000:]
    rolled_back = run_pyinfra("-y", "rollback.py", report_dir=report_dir)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    assert rolled_back.row(name)["steps"]["record"]["status"] == "ok", rolled_back.row(name)
    after = host_snapshot(lab_host)
    assert (after["hsa"], after["aiter"]) == (before["hsa"], before["aiter"]), "rollback left AITER stock"


def tree_files(tree: Path) -> frozenset[str] | None:
    """The files of a directory tree, read through one directory descriptor: a rename or exchange of the tree's
    path while it is read cannot mix two trees into one answer (a path-based walk could)."""
    try:
        descriptor = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        return frozenset(os.path.normpath(os.path.join(top, name)) for top, _, files, _ in os.fwalk(dir_fd=descriptor)
                         for name in files if "__pycache__" not in top)
    finally:
        os.close(descriptor)


class TreeWatcher(threading.Thread):
    """Samples a host's ``hsa/gfx90a`` file list continuously, until stopped."""

    def __init__(self, tree: Path):
        super().__init__(daemon=True)
        self.tree, self.seen, self.samples, self.done = tree, set(), 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.seen.add(tree_files(self.tree))
            self.samples += 1

    def stop(self) -> set:
        self.done.set()
        self.join()
        return self.seen


def wait_sessions_gone(lab_host: dict, timeout_s: float = 60) -> None:
    """Wait until the host runs nothing but its sshd (a command of a killed controller may still be finishing: its
    session's sshd has exited, so it is no longer below the host's sshd, but it is still in the host's namespace)."""
    deadline = time.monotonic() + timeout_s
    while namespace_processes(lab_host["pid"]):
        assert time.monotonic() < deadline, f"{lab_host['name']}: sessions still running after {timeout_s} s"
        time.sleep(0.2)


class Controller:
    """``pyinfra inventory/sim.py ARGS`` running in the background, its output going to a file (a pipe nobody reads
    would fill up and stall it)."""

    def __init__(self, *args: str, report_dir: Path):
        report_dir.mkdir(parents=True, exist_ok=True)
        self.log = report_dir / f"pyinfra-{uuid.uuid4().hex[:8]}.log"
        environment = dict(os.environ, CDNA2_REPORT_DIR=str(report_dir), PYINFRA_PROGRESS="off",
                           PYTHONUNBUFFERED="1")
        with open(self.log, "w") as output:
            self.process = subprocess.Popen([str(PYINFRA), "inventory/sim.py", *args], cwd=REPO, env=environment,
                                            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text()

    def wait_until(self, condition, what: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process.poll() is None, f"the run ended before {what}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} after {timeout_s} s:\n{self.output()[-3000:]}"
            time.sleep(0.05)

    def finish(self, timeout_s: float = 600) -> int:
        return self.process.wait(timeout=timeout_s)

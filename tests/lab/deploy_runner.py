"""Run pyinfra against the simulated lab the way an operator does, and read what the run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cdna2.host.digests import tree_digest
from lab.labctl import ssh_argv

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

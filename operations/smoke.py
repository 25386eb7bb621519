"""Prove the result on the host with the smoke test, without counting as a change."""

from __future__ import annotations

from pyinfra import host, state

from pyinfra.api import operation

from cdna2.report import FAILED, RunReport
from operations.facts import SmokeResult
from operations.util import fail_host_command


@operation()
def smoke_passed(report: RunReport, site_packages: str, target_python: str, state_dir: str,
                 expect_triton: str = "3.7.1"):
    """
    Run the on-host smoke test after this run's changes, record every check in the report, fail on any failure.

    + report: the run report (gets the ``smoke`` column and the per-check details)
    + site_packages: the directory holding AITER and vLLM on the host
    + target_python: interpreter that runs the host agent (the smoke test runs in a fresh process of it)
    + state_dir: the tool's state directory on the host
    + expect_triton: the triton version the host must have

    The test reads the host and changes nothing, so a clean host shows no change. GPU checks report "skipped: no
    gfx90a device" where there is none, never "passed". During ``--dry`` nothing has run yet, so it only says so.

    **Example:**

    .. code:: python

        smoke_passed(name="smoke: the host proves the ASM path", report=report,
                     site_packages="/opt/venv/lib/python3.11/site-packages", target_python="/opt/venv/bin/python",
                     state_dir="/var/lib/cdna2")
    """
    if not state.is_executing:
        host.noop("smoke tests run after the changes")
        return
    result = host.get_fact(SmokeResult, target_python=target_python, state_dir=state_dir,
                           site_packages=site_packages, expect_triton=expect_triton)
    bad = [check for check in result["checks"] if check["status"] in ("failed", "wrong")]
    summary = (f"{result['passed']} passed, {result['failed']} failed, {result['wrong']} wrong, "
               f"{result['skipped']} skipped")
    gpu_skips = [check["detail"] for check in result["checks"] if check["kind"] == "gpu" and check["status"] == "skipped"]
    if gpu_skips:
        summary += f" (GPU checks {gpu_skips[0]})"
    report.step(host.name, "smoke", FAILED if bad else "ok", summary)
    report.host(host.name).details["smoke"] = result
    if bad:
        yield fail_host_command("smoke: " + "; ".join(f"{c['name']} {c['status']}: {c['detail']}" for c in bad))
        return
    host.noop(f"smoke: {summary}")

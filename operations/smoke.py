"""Prove the result on the host with the smoke test, once per provisioned state."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any
from weakref import WeakKeyDictionary

from pyinfra import host, state
from pyinfra.api import operation
from pyinfra.facts.server import Command

from cdna2.families import host_families
from cdna2.host.families import WITHHELD, verdict_line
from cdna2.host.distributions import RECORDED_PACKAGES
from cdna2.images.runtime import (Launch, RuntimeCheckError, hash_command, hash_problem, launch_of, probe_command,
                                  read_probe, read_report, smoke_command)
from cdna2.reports.run import FAILED, RunReport
from cdna2.smoke_proof import WINDOW_CHECK, WRITE_RECORD, proof_key, recorded_proof, window_record_note
from operations.agent import agent_command
from operations.facts import SmokeResult
from operations.util import fail_host_command


def reused_proof_summary(proof: dict) -> str:
    """The report's smoke entry for a run that reuses a recorded pass."""
    return f"{proof['summary']}, at {proof['at']} for this same state (nothing changed since)"


def report_families(report: RunReport, host_name: str, families: dict | None) -> None:
    """Each installed kernel family's verdict into the host's report row (JSON ``details.families``), and a note
    naming the families kept without proof, on every run that has them."""
    if families is None:
        return
    report.host(host_name).details["families"] = families
    kept = [name for name, entry in families.items() if entry.get("kept_by_host_data")]
    if kept:
        report.host(host_name).notes.append(f"kernel families kept without proof (smoke_keep_unproven_families): "
                                            f"{', '.join(kept)}")


def changed_this_run() -> bool:
    """Whether an earlier operation of this run changed the current host (read at execute time)."""
    return any(data.operation_meta.is_complete() and data.operation_meta.did_change()
               for data in state.ops[host].values())


def smoke_verdict(result: dict, host_arch: str | None, gpu_checks: bool) -> tuple[list[dict], str]:
    """The checks of a smoke report that fail the host, and the report's summary of them (kernel families apart)."""
    # A check of a family withheld for it is answered by the withholding: AITER no longer holds that family's kernels.
    answered = {check for name, entry in result.get("families", {}).items() if entry["verdict"] == WITHHELD
                for check in entry["checks"]}
    bad = [check for check in result["checks"] if check["status"] in ("failed", "wrong")
           and check["name"] not in answered]
    gpu_skips = [check for check in result["checks"] if check["kind"] == "gpu" and check["status"] == "skipped"
                 and check["name"] not in answered]
    if host_arch == "gfx90a" and gpu_checks:  # on a gfx90a host only a GPU check that ran can be part of a pass
        bad += [dict(check, status="failed", detail=f"skipped on a host probed as gfx90a: {check['detail']}")
                for check in gpu_skips]
    summary = (f"{result['passed']} passed, {result['failed']} failed, {result['wrong']} wrong, "
               f"{result['skipped']} skipped")
    if gpu_skips:
        summary += f" (GPU checks {gpu_skips[0]['detail']})"
    return bad, summary


@operation()
def smoke_passed(report: RunReport, deployed: dict[str, Any], current_state: dict | None, site_packages: str,
                 target_python: str, state_dir: str, host_arch: str | None, gpu_checks: bool = True,
                 expect_triton: str = "3.7.1", no_gpu_reason: str | None = None, hsa_root: str | None = None,
                 keep_families: list[str] = (), window_record: str | None = None,
                 vllm_site_packages: str | None = None):
    """
    Prove the host's provisioned state with the on-host smoke test, record every check, fail on any failure.

    + report: the run report (gets the ``smoke`` column and the per-check details)
    + deployed: the state this run leaves on the host (``cdna2.plan.deployed_record``): what a pass proves
    + current_state: the host's state as the probe read it (its ``smoke`` entry is the last recorded pass)
    + site_packages: the directory holding AITER and vLLM on the host
    + target_python: interpreter that runs the host agent (the smoke test runs in a fresh process of it)
    + state_dir: the tool's state directory on the host
    + host_arch: the GPU arch the host probe saw (None: no GPU); on gfx90a an unusable GPU fails the smoke test
    + gpu_checks: run the GPU checks (off only for hosts whose GPU is a stand-in, such as the lab's)
    + expect_triton: the triton version the host must have
    + no_gpu_reason: why no GPU can exist on the target (an image build): the GPU checks are skipped with it
    + hsa_root: AITER's ``hsa`` directory on the host (where families are withheld from ``gfx90a``)
    + keep_families: kernel families to keep although no GPU check proves them (host data)
    + window_record: what to do with the sliding-window record beside vLLM (``cdna2.smoke_proof``
      ``window_record_action``): write the outcome of this run's sliding-window check, remove it, or None
    + vllm_site_packages: the directory holding vLLM on the host (where that record goes)

    Kernel families:
        each installed family (cdna2/data/kernel-families.yaml) gets a verdict: proven, withheld or unproven, with
        the reason. Where the GPU checks ran, the families to withhold leave ``hsa/gfx90a`` in one atomic swap
        (``cdna2.host.families withhold``); a failed check of a family withheld so does not fail the host.

    Once per state:
        the test runs when this run changed the host, or when no pass is recorded for the state it leaves there;
        a pass is then recorded on the host. A re-run that changes nothing reuses that proof (``verify.py`` is
        the read-only check for drift since). On a host the probe saw as gfx90a, a GPU that cannot be used
        fails the GPU checks, so no pass is recorded; they are "skipped" only where there is no GPU, or with
        ``gpu_checks`` off, never "passed". During ``--dry`` nothing has run yet, so it only says so.

    **Example:**

    .. code:: python

        smoke_passed(name="smoke: the host proves the ASM path", report=report, deployed=record,
                     current_state=probe["state"], site_packages="/opt/venv/lib/python3.11/site-packages",
                     target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2", host_arch="gfx90a")
    """
    if not state.is_executing:
        host.noop("smoke tests run after the changes")
        return
    proof = recorded_proof(deployed, gpu_checks, current_state)
    if not changed_this_run() and proof:
        report.step(host.name, "smoke", "ok", reused_proof_summary(proof))
        report_families(report, host.name, proof.get("families"))
        host.noop(f"smoke passed at {proof['at']} for this same state; nothing changed since")
        return
    families = host_families()
    result = host.get_fact(SmokeResult, target_python=target_python, state_dir=state_dir,
                           site_packages=site_packages, expect_triton=expect_triton, host_arch=host_arch,
                           gpu_checks=gpu_checks, no_gpu_reason=no_gpu_reason, families=families,
                           keep_families=list(keep_families))
    bad, summary = smoke_verdict(result, host_arch, gpu_checks)
    summary += f"; {verdict_line(result.get('families', {}))}"
    report.step(host.name, "smoke", FAILED if bad else "ok", summary)
    report.host(host.name).details["smoke"] = result
    report_families(report, host.name, result.get("families"))
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # vllm-aiter-triton-ops' guard reads this run's sliding-window check, failed or not, before the host may fail.
    window_check = next((check for check in result["checks"] if check["name"] == WINDOW_CHECK), None)
    if window_record == WRITE_RECORD and window_check is not None:
        yield agent_command(target_python, state_dir, "window_proof", "write", "--site-packages", vllm_site_packages,
                            "--state-dir", state_dir, "--check", json.dumps(window_check, sort_keys=True), "--at", at)
    elif window_record is not None:
        yield agent_command(target_python, state_dir, "window_proof", "remove", "--site-packages",
                            vllm_site_packages, "--state-dir", state_dir)
    note = window_record_note(window_check, window_record)
    if note:
        report.host(host.name).notes.append(note)
    if bad:
        yield fail_host_command("smoke: " + "; ".join(f"{c['name']} {c['status']}: {c['detail']}" for c in bad))
        return
    if result.get("withhold"):
        yield agent_command(target_python, state_dir, "families", "withhold", "--site-packages", site_packages,
                            "--hsa-root", hsa_root, "--state-dir", state_dir,
                            "--families", json.dumps(families, sort_keys=True),
                            "--reasons", json.dumps(result["withhold"], sort_keys=True))
    passed = {"proves": proof_key(deployed, gpu_checks), "summary": summary, "at": at,
              "families": result.get("families", {})}
    yield agent_command(target_python, state_dir, "state", "set", "--state-dir", state_dir, "smoke",
                        json.dumps(passed, sort_keys=True))


# Per run (pyinfra's State), per distinct pair of files (paths, identities as the nodes saw them, recorded SHA-256):
# the node that hashed them and what differs from the record (None: nothing). The first host to need a pair hashes it
# on its node; hosts of the same pair wait for it (pyinfra's greenlets) and take its verdict; when the hashing host
# fails (its step refused, its connection lost), the next one hashes.
_hashes: WeakKeyDictionary = WeakKeyDictionary()  # state -> {files: (lock, {"by": node, "problem": text or None})}


def image_launch(image: str) -> Launch:
    """What runs ``image`` with its layer on the current node (its runtime, read there), the image and the layer
    hashed on one node per distinct pair of files; or RuntimeCheckError."""
    probe = host.get_fact(Command, probe_command(image)) or ""
    launch = launch_of(host.name, image, read_probe(probe.splitlines()))
    lock, verdict = _hashes.setdefault(host.state, {}).setdefault(launch.files(), (threading.Lock(), {}))
    with lock:
        if not verdict:
            output = host.get_fact(Command, hash_command(launch)) or ""
            verdict.update(by=host.name, problem=hash_problem(launch, output.splitlines()))
    if verdict["problem"] is not None:
        raise RuntimeCheckError(f"{host.name}: {verdict['problem']}" + (
            "" if verdict["by"] == host.name else f" (hashed on {verdict['by']}, which sees the same file)"))
    return replace(launch, hashed_by=verdict["by"])


def smoke_inside(report: RunReport, launch: Launch, host_arch: str | None, gpu_checks: bool,
                 expect_triton: str) -> dict:
    """The smoke report printed inside the node's runtime (the files' identities checked first), or
    RuntimeCheckError; the host's row gets the runtime, the report, and the image's Python and packages in place of
    the node's."""
    output = host.get_fact(Command, smoke_command(launch, host_arch, gpu_checks, expect_triton)) or ""
    result = read_report(host.name, launch, output.splitlines(), "smoke")
    row = report.host(host.name)
    row.details["runtime"], row.details["smoke"] = launch.report(), result
    # What ran is the image's Python with the image's packages, not the node's (a layer's agent from before the
    # smoke report named them leaves them unknown rather than showing the node's).
    row.python = f"{launch.python} (inside {launch.image})"
    row.packages = {name: (result.get("versions") or {}).get(name) for name in RECORDED_PACKAGES}
    return result


@operation()
def smoke_passed_inside_image(report: RunReport, image: str, host_arch: str | None, gpu_checks: bool = True,
                              expect_triton: str = "3.7.1"):
    """
    Run the smoke test, GPU checks included, inside the node's Singularity/Apptainer with the image's layer; record
    which runtime ran it; fail the host on any failure. Never changes the node.

    + report: the run report (the ``verify`` step, and ``runtime`` in the host's details)
    + image: the ``.sif`` on the node (host data ``sif_image``), its layer and record beside it
    + host_arch: the GPU arch the node's probe saw (None: no GPU); on gfx90a a GPU check that did not run fails
    + gpu_checks: run the GPU checks (off only where the GPU is a stand-in, such as the lab's)
    + expect_triton: the triton version the image with its layer must have

    No runtime on the node, no layer record, or an image or layer whose SHA-256 differs from the record fails the
    host by name (cdna2/images/runtime.py): never "passed". The files are hashed on one node per distinct file (the
    nodes of a shared filesystem see one), and every node checks that its files' identity is the one hashed. During
    ``--dry`` nothing runs.

    **Example:**

    .. code:: python

        smoke_passed_inside_image(name="verify: the image's smoke test passes inside its runtime", report=report,
                                  image="/project/images/vllm.sif", host_arch="gfx90a")
    """
    if not state.is_executing:
        host.noop(f"the smoke test runs inside the node's runtime with {image} and its layer")
        return
    try:
        launch = image_launch(image)
        result = smoke_inside(report, launch, host_arch, gpu_checks, expect_triton)
    except RuntimeCheckError as error:
        report.step(host.name, "verify", FAILED, str(error))
        yield fail_host_command(f"verify: {error}")
        return
    bad, summary = smoke_verdict(result, host_arch, gpu_checks)
    report.step(host.name, "verify", FAILED if bad else "ok", f"smoke inside {launch.version}: {summary}")
    if bad:
        yield fail_host_command("verify: smoke inside the image: "
                                + "; ".join(f"{c['name']} {c['status']}: {c['detail']}" for c in bad))
        return
    host.noop(f"the smoke test passed inside {launch.version} with {launch.layer}")

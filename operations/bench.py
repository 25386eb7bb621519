"""Run the benchmarks on the host and collect every host's figures in the bench report, written when the run ends."""

from __future__ import annotations

import atexit
import sys
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FactBase, StringCommand, operation
from pyinfra.api.exceptions import FactProcessError
from pyinfra.api.state import State
from pyinfra.facts.server import Command
from typing_extensions import override

from cdna2.bench import GPU_ARCH, host_command, parse_host_output
from cdna2.images.runtime import RuntimeCheckError, bench_command, read_report
from cdna2.reports.bench import BenchReport
from cdna2.host.bench import PROBLEMS
from cdna2.reports.run import FAILED, PLANNED, SKIPPED, RunReport
from operations.agent import agent_command
from operations.report import inventory_argument, report_dir
from operations.smoke import image_launch, smoke_inside, smoke_verdict
from operations.util import fail_host_command


class BenchResult(FactBase[dict]):
    """
    Returns the on-host bench runner's JSON (cdna2/host/bench.py), run from the installed agent:
    ``{"cases": [{"case", "kind", "status", "detail", ...figures}], "counts", "device", "host_arch", "elapsed_s"}``.

    The runner exits 1 when a case is wrong, crashed, hung or failed; the fact still returns its JSON so the report
    can name them.
    """

    @override
    def command(self, target_python: str, state_dir: str, site_packages: str, host_arch: str | None,
                cases: list[dict]) -> StringCommand:
        return StringCommand(agent_command(target_python, state_dir, "bench",
                                           *host_command(site_packages, state_dir, host_arch, cases)),
                             "|| true")

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return parse_host_output("\n".join(output))
        except ValueError as error:
            raise FactProcessError(str(error)) from error


class BenchRecorder:
    """The bench report of one pyinfra run; ``BenchRecorder.install`` returns it from every host's pass."""

    _current: BenchRecorder | None = None

    def __init__(self, state: State, plan: dict, on_deploy: bool):
        self.state = state
        self.on_deploy = on_deploy  # in a deploy, only hosts whose data sets bench_on_deploy run benchmarks
        self.report = BenchReport(inventory=inventory_argument(sys.argv[1:]), budget_seconds=plan["budget_seconds"],
                                  cases=plan["cases"])

    @classmethod
    def install(cls, state: State, plan: dict, on_deploy: bool = False) -> BenchRecorder:
        if cls._current is None or cls._current.state is not state:
            cls._current = cls(state, plan, on_deploy)
            atexit.register(cls._current.finish)
        return cls._current

    def finish(self) -> None:
        # Hosts that failed before their bench step said anything (in a deploy, only those whose data asked for it).
        for failed in self.state.failed_hosts:
            if failed.name not in self.report.hosts and (not self.on_deploy or failed.data.get("bench_on_deploy")):
                self.report.fail(failed.name, "the host failed before its benchmarks ran (see the run report)")
        json_path, markdown_path = self.report.write(report_dir())
        logger.info(f"--> Bench report written to {markdown_path} and {json_path}")


@operation()
def benchmarked(bench: BenchReport, report: RunReport, skip_reason: str | None, cases: list[dict],
                site_packages: str | None, target_python: str, state_dir: str, host_arch: str | None,
                after_smoke_step: bool = False):
    """
    Run the benchmarks on the host, record its figures in the bench report, fail it on a wrong or broken case.

    + bench: the bench report (gets this host's results, or its skip reason)
    + report: the run report (gets the ``bench`` column)
    + skip_reason: why this host runs no benchmark (``cdna2.bench.skip_reason``), or None
    + cases: the cases (``cdna2.bench.load_cases``), defaults filled in
    + site_packages: the directory holding AITER on the host
    + target_python: interpreter that runs the host agent (the cases run in fresh processes of it)
    + state_dir: the tool's state directory on the host
    + host_arch: the GPU arch the host probe saw
    + after_smoke_step: run only if this run's smoke step passed (the deploy's ``bench_on_deploy``)

    Read-only:
        the benchmarks change nothing on the host; a skipped host is named with its reason in both reports.
        During ``--dry`` nothing runs, and the report says so. A case that is wrong, crashed, hung or failed
        fails the host; a "fallback" case (correct, no load proof) is named in the report but does not.

    **Example:**

    .. code:: python

        benchmarked(name="bench: the host's figures are measured", bench=bench, report=report, skip_reason=None,
                    cases=load_cases()["cases"], site_packages="/opt/venv/lib/python3.11/site-packages",
                    target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2", host_arch="gfx90a")
    """
    if after_smoke_step and not skip_reason and state.is_executing:
        smoke = report.host(host.name).steps.get("smoke")
        if smoke is None or smoke.status != "ok":
            skip_reason = f"the smoke step did not pass in this run ({smoke.cell() if smoke else 'it did not run'})"
    if skip_reason:
        bench.skip(host.name, skip_reason)
        report.step(host.name, "bench", SKIPPED, skip_reason)
        host.noop(f"benchmarks skipped: {skip_reason}")
        return
    if not state.is_executing:  # a dry run, or a run not yet confirmed: execution replaces both entries
        report.step(host.name, "bench", PLANNED, f"{len(cases)} cases run at execution")
        bench.skip(host.name, "not run: the benchmarks run at execution (a dry run, or a run not confirmed)")
        host.noop("benchmarks run at execution")
        return
    result = host.get_fact(BenchResult, target_python=target_python, state_dir=state_dir,
                           site_packages=site_packages, host_arch=host_arch, cases=cases)
    bench.add(host.name, result)
    yield from judged(report, result)


def judged(report: RunReport, result: dict, where: str = ""):
    """The runner's result into the run report's ``bench`` column (``where``: the runtime that ran it); a wrong or
    broken case fails the host."""
    counts = ", ".join(f"{count} {status}" for status, count in result["counts"].items() if count)
    bad = [case for case in result["cases"] if case["status"] in PROBLEMS]
    report.step(host.name, "bench", FAILED if bad else "ok", f"{counts} in {result['elapsed_s']:.0f} s{where}")
    if bad:
        yield fail_host_command("bench: " + "; ".join(f"{case['case']} {case['status']}: {case['detail']}"
                                                      for case in bad))
        return
    host.noop(f"benchmarks measured{where}: {counts}")


@operation()
def benchmarked_inside_image(bench: BenchReport, report: RunReport, image: str, cases: list[dict],
                             host_arch: str | None, gpu_checks: bool = True, expect_triton: str = "3.7.1"):
    """
    Run the benchmarks inside the node's Singularity/Apptainer with the image's layer, correctness first: the smoke
    test inside the runtime, then the cases; record which runtime ran them; fail the node on a wrong or broken case.

    + bench: the bench report (this node's results or skip reason, and ``runtime``)
    + report: the run report (the ``smoke`` and ``bench`` columns, ``runtime`` in the host's details)
    + image: the ``.sif`` on the node (host data ``sif_image``), its layer and record beside it
    + cases: the cases (``cdna2.bench.load_cases``), defaults filled in
    + host_arch: the GPU arch the node's probe saw (None: no GPU)
    + gpu_checks: the smoke test's GPU checks (off only where the GPU is a stand-in, such as the lab's)
    + expect_triton: the triton version the image with its layer must have

    Correctness first:
        a layer is read-only, so no smoke pass can be recorded on the node: the smoke test, GPU checks included, runs
        inside the runtime first in the same run, and the cases run only when it passes. A node that is not
        gfx90a runs nothing; with the GPU checks off (a stand-in GPU) the smoke test runs and every case is
        skipped, saying so. No runtime, no layer record, an image or layer whose SHA-256 differs from the record
        (hashed on one node per distinct file, its identity checked on every node before each launch), or a
        smoke test that fails: the node fails by name, nothing is timed. Never changes the node. During
        ``--dry`` nothing runs.

    **Example:**

    .. code:: python

        benchmarked_inside_image(name="bench: the image's figures are measured inside its runtime", bench=bench,
                                 report=report, image="/project/images/vllm.sif", cases=load_cases()["cases"],
                                 host_arch="gfx90a")
    """
    if host_arch != GPU_ARCH:
        reason = f"not a {GPU_ARCH} node (the probe saw {host_arch})" if host_arch else "the probe found no GPU"
        bench.skip(host.name, reason)
        report.step(host.name, "bench", SKIPPED, reason)
        host.noop(f"benchmarks skipped: {reason}")
        return
    if not state.is_executing:
        report.step(host.name, "bench", PLANNED, f"the smoke test, then {len(cases)} cases, inside the node's "
                                                 f"runtime with {image} and its layer, at execution")
        bench.skip(host.name, "not run: the benchmarks run at execution (a dry run, or a run not confirmed)")
        host.noop("benchmarks run inside the image's runtime at execution")
        return
    launch = None
    try:
        launch = image_launch(image)
        smoke = smoke_inside(report, launch, host_arch, gpu_checks, expect_triton)
        bad, summary = smoke_verdict(smoke, host_arch, gpu_checks)
        report.step(host.name, "smoke", FAILED if bad else "ok", f"inside {launch.version}: {summary}")
        if bad:
            raise RuntimeCheckError(f"{host.name}: the smoke test inside {launch.version} with {launch.layer} failed "
                                    f"(" + "; ".join(f"{c['name']} {c['status']}: {c['detail']}" for c in bad) +
                                    "): no benchmark of an unproven kernel; run verify.py, then deploy the layer again")
        if not gpu_checks:
            reason = (f"the smoke test inside {launch.version} ran without GPU checks (smoke_gpu_checks is off: its "
                      "GPU is a stand-in), so nothing proves the ASM path runs there")
            bench.skip(host.name, reason, launch.report())
            report.step(host.name, "bench", SKIPPED, reason)
            host.noop(f"benchmarks skipped: {reason}")
            return
        result = read_report(host.name, launch, (host.get_fact(
            Command, bench_command(launch, host_arch, cases)) or "").splitlines(), "bench")
    except RuntimeCheckError as error:
        bench.fail(host.name, str(error), launch.report() if launch else None)
        report.step(host.name, "bench", FAILED, str(error))
        yield fail_host_command(f"bench: {error}")
        return
    bench.add(host.name, result, launch.report())
    yield from judged(report, result, f" inside {launch.version}")

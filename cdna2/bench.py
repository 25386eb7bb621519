"""Benchmarks per host, correctness first: the cases (data), which hosts may run them, and ``python -m cdna2 bench``.

The cases live in ``cdna2/data/bench-cases.yaml`` and are checked against ``cdna2/schemas/bench-cases-1.0.json``
when loaded; each case leaves with the defaults filled in, as the on-host runner (``cdna2.host.bench``) takes it.
A host runs them only when it is gfx90a, provisioned by this tool, and holds a smoke pass recorded for its deployed
state with the GPU checks run: anywhere else a figure would say nothing about the ASM path (a stand-in GPU, a
fallback the smoke test never ruled out).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cdna2.reports.bench import BenchReport
from cdna2.host import state as host_state
from cdna2.host.bench import host_cases
from cdna2.host.gpus import KFD_TOPOLOGY, read_gpus
from cdna2.plan import hidden_gpu_refusal
from cdna2.schema import first_violation, load_yaml
from cdna2.smoke_proof import recorded_proof

SCHEMA_FILE = "bench-cases-1.0.json"
CASES_FILE = "bench-cases.yaml"
GPU_ARCH = "gfx90a"
REPOSITORY = Path(__file__).resolve().parent.parent  # holds cdna2/host, as <state_dir>/agent does on a host


class BenchDataError(ValueError):
    """A cases file that cannot be read or breaks its schema; nothing ran anywhere."""


def load_cases(path: Path | None = None) -> dict[str, Any]:
    """The cases file (default: the packaged one), validated, each case with the defaults filled in.

    Returns ``{"budget_seconds": float, "cases": [case, ...], "source": str}``; raises BenchDataError naming the
    file and the first violation.
    """
    source = path or Path(str(resources.files("cdna2").joinpath("data", CASES_FILE)))
    try:
        document = load_yaml(Path(source).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise BenchDataError(f"{source}: cannot read the bench cases: {error}") from error
    schema = json.loads(resources.files("cdna2").joinpath("schemas", SCHEMA_FILE).read_text())
    violation = first_violation(document, schema)
    if violation:
        raise BenchDataError(f"{source}: invalid bench cases, nothing was run: {violation}")
    names = [case["name"] for case in document["cases"]]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise BenchDataError(f"{source}: case names must be unique: {', '.join(repeated)} repeated")
    cases = [{**document["defaults"], **case} for case in document["cases"]]
    missing = [case["name"] for case in cases if not {"warmup", "repeats", "case_timeout_seconds"} <= set(case)]
    if missing:
        raise BenchDataError(f"{source}: warmup, repeats and case_timeout_seconds need a value in `defaults` or in "
                             f"each case: missing in {', '.join(missing)}")
    return {"budget_seconds": document["budget_seconds"], "cases": cases, "source": str(source)}


def skip_reason(arch: str | None, tool_state: dict | None) -> str | None:
    """Why a host does not run the benchmarks (None: it does), from the arch its probe saw and its tool state."""
    if arch != GPU_ARCH:
        return f"not a {GPU_ARCH} host (the probe saw {arch})" if arch else "the probe found no GPU"
    deployed = (tool_state or {}).get("deployed")
    if not deployed:
        return "not provisioned: no deployed state is recorded on it (run deploy.py first)"
    if recorded_proof(deployed, True, tool_state):
        return None
    if recorded_proof(deployed, False, tool_state):
        return ("its smoke pass for the deployed state ran without GPU checks (smoke_gpu_checks is off: its GPU is "
                "a stand-in), so nothing proves the ASM path runs there")
    return "no smoke pass is recorded for its deployed state (run deploy.py: its smoke step records one)"


def deploy_skip_reason(arch: str | None, gpu_checks: bool, reinstalled: list[str]) -> str | None:
    """Why the deploy's bench step (``bench_on_deploy``) skips a host, as far as the plan can tell before anything
    runs; the step also skips a host whose smoke step did not pass in the run."""
    if arch != GPU_ARCH:
        return f"not a {GPU_ARCH} host (the probe saw {arch})" if arch else "the probe found no GPU"
    if not gpu_checks:
        return ("the smoke step runs without GPU checks on this host (smoke_gpu_checks is off, or no GPU at build "
                "time), so nothing proves the ASM path runs there")
    if reinstalled:
        return f"{', '.join(reinstalled)} (re)installed by this run: run the deploy again, then bench.py"
    return None


def host_command(site_packages: str, state_dir: str, host_arch: str | None, cases: list[dict],
                 case_timeout: float | None = None) -> list[str]:
    """The on-host runner's arguments after ``<python> -B -m cdna2.host.bench``."""
    return ["--site-packages", site_packages, "--state-dir", state_dir, "--host-arch", host_arch or "none",
            "--cases-json", json.dumps(cases, sort_keys=True),
            *(["--case-timeout", f"{case_timeout:g}"] if case_timeout else []), "--json"]


def parse_host_output(stdout: str) -> dict:
    """The runner's JSON report: its last line of stdout."""
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise ValueError(f"the bench runner printed no JSON report: {stdout[-500:]!r}")
    return json.loads(lines[-1])


def bench_cmd(args: argparse.Namespace) -> int:
    """Run the benchmarks on this machine and write the bench report."""
    try:
        plan = load_cases(args.cases)
    except BenchDataError as error:
        print(error, file=sys.stderr)
        return 2
    errors: list[str] = []
    gpus = read_gpus(args.rocm_root, KFD_TOPOLOGY, errors)
    arch = gpus["arch"]
    try:
        tool_state = host_state.read_state(Path(args.state_dir))
    except (OSError, ValueError) as error:
        print(f"{args.state_dir}/state.json: unreadable tool state: {error}", file=sys.stderr)
        return 1
    name = args.host_name or socket.gethostname()
    report = BenchReport(inventory="local", budget_seconds=plan["budget_seconds"], cases=plan["cases"])
    # gfx90a GPUs on the PCI bus that rocminfo does not list: a broken GPU fails, never "skipped".
    broken = hidden_gpu_refusal({"gpu": gpus, "errors": errors}, container=False)
    reason = skip_reason(arch, tool_state)
    if broken:
        report.fail(name, broken)
    elif reason:
        report.skip(name, reason)
    else:
        completed = subprocess.run(
            [args.python, "-B", "-m", "cdna2.host.bench",
             *host_command(args.site_packages, args.state_dir, arch,
                           host_cases(plan["cases"], tool_state.get("deployed")), args.case_timeout)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
        try:
            report.add(name, parse_host_output(completed.stdout))
        except ValueError as error:
            report.fail(name, f"{error}; stderr: {completed.stderr[-500:]}")
    json_path, markdown_path = report.write(Path(args.report_dir))
    print(markdown_path.read_text(), file=sys.stderr)
    print(f"bench report written to {markdown_path} and {json_path}", file=sys.stderr)
    return 1 if report.problems() else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help=bench_cmd.__doc__, description=bench_cmd.__doc__)
    parser.add_argument("--site-packages", required=True, help="site-packages of the environment holding AITER")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of that environment, which runs the cases (default: this one)")
    parser.add_argument("--state-dir", default="/var/lib/cdna2", help="this tool's state directory (%(default)s)")
    parser.add_argument("--rocm-root", default="/opt/rocm", help="ROCm root, for rocminfo (%(default)s)")
    parser.add_argument("--cases", type=Path, help=f"cases file (default: the packaged cdna2/data/{CASES_FILE})")
    parser.add_argument("--case-timeout", type=float, help="seconds for every case, instead of each case's own")
    parser.add_argument("--report-dir", default=os.environ.get("CDNA2_REPORT_DIR") or "reports",
                        help="where the report goes (%(default)s)")
    parser.add_argument("--host-name", help="the name the report gives this machine (default: its hostname)")
    parser.set_defaults(func=bench_cmd)


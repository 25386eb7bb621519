"""operations.bench.benchmarked, run by real pyinfra (API mode) against @fake hosts that answer the bench fact with
a runner's JSON: a skipped host is named with its reason, a wrong case fails the host, figures reach the report."""

from __future__ import annotations

import json

from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from cdna2.bench import deploy_skip_reason, load_cases
from cdna2.reports.bench import BenchReport
from cdna2.reports.run import RunReport
from operations import bench
from tests.unit.operations.fake_hosts import fake_host

BENCH_COMMAND = "cdna2.host.bench --site-packages"
CASES = load_cases()["cases"][:2]
TIMING = {"median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1, "runs": 20, "spread_pct": 20.0}


def runner_output(first_status: str) -> str:
    first = {"case": CASES[0]["name"], "kind": "prefill", "status": first_status, "detail": f"{first_status} case"}
    if first_status == "ok":
        first.update(asm=TIMING, fallback=dict(TIMING, median_ms=1.5), speedup=1.5, figure=84.0, unit="TFLOP/s",
                     loaded=["/s/hsa/gfx90a/fmha_v3_fwd/x.co"])
    second = {"case": CASES[1]["name"], "kind": "prefill", "status": "ok", "detail": "ok", "asm": TIMING,
              "fallback": dict(TIMING, median_ms=1.4), "speedup": 1.4, "figure": 83.0, "unit": "TFLOP/s", "loaded": []}
    counts = {"ok": 1 + (first_status == "ok"), first_status: 1 + (first_status == "ok")}
    return json.dumps({"cases": [first, second], "counts": counts, "device": {"name": "MI210"}, "host_arch": "gfx90a",
                       "elapsed_s": 80.0})


def run_bench_op(output: str = "", smoke_status: str | None = None, **arguments):
    state, host = fake_host({BENCH_COMMAND: output})
    report = RunReport(mode="bench", inventory="test")
    if smoke_status:
        report.step("@fake/a", "smoke", smoke_status, "12 passed")
    bench_report = BenchReport(inventory="test", budget_seconds=120, cases=CASES)
    add_op(state, bench.benchmarked, bench=bench_report, report=report, cases=CASES, site_packages="/opt/venv/site",
           target_python="/opt/venv/bin/python", state_dir="/var/lib/cdna2", host_arch="gfx90a", host=[host],
           **arguments)
    run_ops(state)
    return state, host, report, bench_report


def ran_bench(host) -> bool:
    return any(BENCH_COMMAND in command for command in host.connector.executed_commands)


def test_a_skipped_host_runs_nothing_and_is_named_with_its_reason() -> None:
    state, host, report, bench_report = run_bench_op(skip_reason="not a gfx90a host (the probe saw gfx942)")
    assert host not in state.failed_hosts and not ran_bench(host)
    assert report.host("@fake/a").steps["bench"].status == "skipped"
    assert [case["detail"] for case in bench_report.hosts["@fake/a"]["cases"]] == \
        ["skipped: not a gfx90a host (the probe saw gfx942)"] * 2


def test_figures_reach_the_bench_report_and_the_host_passes() -> None:
    state, host, report, bench_report = run_bench_op(runner_output("ok"), skip_reason=None)
    assert host not in state.failed_hosts and ran_bench(host)
    assert bench_report.hosts["@fake/a"]["status"] == "benchmarked"
    assert report.host("@fake/a").steps["bench"].cell() == "ok: 2 ok in 80 s"


def test_a_wrong_case_fails_the_host_naming_it() -> None:
    state, host, report, bench_report = run_bench_op(runner_output("wrong"), skip_reason=None)
    assert host in state.failed_hosts
    assert report.host("@fake/a").steps["bench"].status == "failed"
    assert bench_report.problems()[0]["status"] == "wrong"


def test_after_the_smoke_step_a_host_whose_smoke_step_did_not_pass_is_skipped() -> None:
    state, host, report, _ = run_bench_op(runner_output("ok"), smoke_status="skipped", skip_reason=None,
                                          after_smoke_step=True)
    assert not ran_bench(host) and host not in state.failed_hosts
    assert report.host("@fake/a").steps["bench"].detail == \
        "the smoke step did not pass in this run (skipped: 12 passed)"
    state, host, _, _ = run_bench_op(runner_output("ok"), smoke_status="ok", skip_reason=None, after_smoke_step=True)
    assert ran_bench(host)


def test_the_deploy_skips_hosts_whose_smoke_step_cannot_prove_the_asm_path() -> None:
    assert deploy_skip_reason("gfx942", True, []) == "not a gfx90a host (the probe saw gfx942)"
    assert "smoke_gpu_checks is off" in deploy_skip_reason("gfx90a", False, [])
    assert "amd-aiter (re)installed by this run" in deploy_skip_reason("gfx90a", True, ["amd-aiter"])
    assert deploy_skip_reason("gfx90a", True, []) is None

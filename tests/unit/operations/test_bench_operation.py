"""operations.bench.benchmarked, run by real pyinfra (API mode) against @fake hosts that answer the bench fact with
a runner's JSON: a skipped host is named with its reason, a wrong case fails the host, figures reach the report.
benchmarked_inside_image likewise, the fake host answering as a node's Singularity would (a test double)."""

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


# A node running an image: what its Singularity/Apptainer (a test double: the fake host's answers) would print.
IMAGE = "/project/images/vllm.sif"
RECORD = {"image_sha256": "a" * 64, "layer_sha256": "b" * 64, "layer": "vllm.gfx90a-layer.sqsh",
          "files": ["opt/venv/lib/python3.11/site-packages/aiter_meta/hsa/gfx90a/fmha.co"]}
IDENTITY = "4711 1234 1796680000.000000000 1796680000.000000000"  # inode, size, mtime, ctime (ns)
PROBE = (f"runtime=/usr/bin/singularity\nversion=singularity-ce version 4.1.0\nimage=found\n"
         f"image_identity={IDENTITY}\nlayer_identity={IDENTITY}\n--- record\n{json.dumps(RECORD)}")
HASHED = f"file0={IDENTITY}|{'b' * 64}|{IDENTITY}\nfile1={IDENTITY}|{'a' * 64}|{IDENTITY}"  # both as recorded
IMAGE_BENCH = "-m cdna2.host.bench --site-packages"


def smoke_report(gpu_status: str) -> str:
    checks = [{"name": "gfx90a_tree", "kind": "static", "status": "passed", "detail": "178 code objects"},
              {"name": "fmha_fwd", "kind": "gpu", "status": gpu_status, "detail": f"{gpu_status} on the GPU"}]
    return json.dumps({"checks": checks, "passed": 1 + (gpu_status == "passed"), "failed": gpu_status == "failed",
                       "wrong": 0, "skipped": 0, "families": {}})


def run_image_bench_op(smoke: str, host_arch: str = "gfx90a", hashed: str = HASHED):
    state, host = fake_host({"command -v singularity": PROBE, "sha256sum <": hashed, "-m cdna2.host.smoke": smoke,
                             IMAGE_BENCH: runner_output("ok")})
    report = RunReport(mode="bench", inventory="test")
    bench_report = BenchReport(inventory="test", budget_seconds=120, cases=CASES)
    add_op(state, bench.benchmarked_inside_image, bench=bench_report, report=report, image=IMAGE, cases=CASES,
           host_arch=host_arch, host=[host])
    run_ops(state)
    return state, host, report, bench_report


def ran_in_image(host, module: str) -> bool:
    return any(f"-m {module} " in command for command in host.connector.executed_commands)


def test_inside_an_image_the_cases_run_after_the_smoke_test_passed_there_and_the_runtime_is_named() -> None:
    state, host, report, bench_report = run_image_bench_op(smoke_report("passed"))
    assert host not in state.failed_hosts and ran_in_image(host, "cdna2.host.bench")
    entry = bench_report.hosts["@fake/a"]
    assert entry["status"] == "benchmarked" and entry["runtime"]["version"] == "singularity-ce version 4.1.0"
    assert (entry["runtime"]["image"], entry["runtime"]["layer_sha256"]) == (IMAGE, "b" * 64)
    assert entry["runtime"]["hashed_by"] == "@fake/a" and ran_in_image(host, "cdna2.host.smoke")
    assert report.host("@fake/a").steps["bench"].cell() == "ok: 2 ok in 80 s inside singularity-ce version 4.1.0"
    assert report.host("@fake/a").details["runtime"] == entry["runtime"]
    assert "- @fake/a: singularity-ce version 4.1.0 (/usr/bin/singularity)" in bench_report.to_markdown(None)


def test_inside_an_image_a_layer_that_differs_from_its_record_fails_the_node_and_nothing_runs() -> None:
    state, host, report, bench_report = run_image_bench_op(smoke_report("passed"),
                                                           hashed=HASHED.replace("b" * 64, "c" * 64))
    assert host in state.failed_hosts and not ran_in_image(host, "cdna2.host.smoke")
    assert bench_report.hosts["@fake/a"]["reason"].startswith(
        "@fake/a: /project/images/vllm.gfx90a-layer.sqsh: SHA-256 differs from /project/images/vllm.gfx90a-layer.json")


def test_inside_an_image_a_failing_smoke_test_fails_the_node_and_nothing_is_timed() -> None:
    state, host, report, bench_report = run_image_bench_op(smoke_report("failed"))
    assert host in state.failed_hosts and not ran_in_image(host, "cdna2.host.bench")
    assert report.host("@fake/a").steps["smoke"].status == "failed"
    reason = bench_report.hosts["@fake/a"]["reason"]
    assert reason.startswith("@fake/a: the smoke test inside singularity-ce version 4.1.0 with "
                             "/project/images/vllm.gfx90a-layer.sqsh failed (fmha_fwd failed: failed on the GPU)")
    assert "no benchmark of an unproven kernel" in reason and bench_report.hosts["@fake/a"]["runtime"]


def test_inside_an_image_a_node_that_is_not_gfx90a_runs_nothing() -> None:
    state, host, report, bench_report = run_image_bench_op(smoke_report("passed"), host_arch="gfx942")
    assert host not in state.failed_hosts and not host.connector.executed_commands
    assert bench_report.hosts["@fake/a"]["reason"] == "not a gfx90a node (the probe saw gfx942)"

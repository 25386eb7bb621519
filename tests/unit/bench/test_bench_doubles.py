"""The on-host bench runner end to end, through its real GPU children, on the smoke test's doubles.

Only what cannot exist here is a test double, the same two the smoke test uses (tests/unit/smoke/doubles): AITER
(its ``slow``, ``crash``, ``hang``, ``five_percent`` and ``fallback`` faults, ``paged_attention_rocm``, the decode
fallback, and ``gemm_a8w8_CK``) and the MI210 (CPU torch presented as one gfx90a device, its events on the issuing
thread's CPU clock, its SDPA made ``CDNA2_DEVICE_DOUBLE_SDPA_MS`` slower, so that "fast" and "slow" do not hang on
what other processes take of a loaded machine). Everything else is real: the runner, its children and their
process groups, the pass rule, the load-line proof, the timings.

Unproven without an MI210: every figure, and that the real fallbacks meet the pass rule on the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdna2.host import state
from cdna2.smoke_proof import proof_key
from tests.unit.smoke.test_gpu_doubles import Lab
from tests.unit.test_probe import FIXTURES, install_rocminfo

pytestmark = pytest.mark.slow  # one child per case, each imports torch

SDPA_MS = 100  # the device double's SDPA; the AITER double's "slow" adds SLOW_MS (300) to each call
HANG_LIMIT = 20


def case(name: str, seqlen: int, **changes) -> dict:
    """A small batched prefill case (GQA 8, hd 128): the doubles key their faults by seqlen. Its output is over
    1 MiB, so the device double's caching allocator (as HIP's) hands AITER a freed NaN-filled block of its size."""
    return {"name": name, "kind": "prefill", "what": f"prefill 4x{seqlen}", "batch": 4, "seqlen": seqlen,
            "heads_q": 16, "heads_kv": 2, "head_dim": 128, "causal": False, "fallback": "torch SDPA (bf16)",
            "proof": r"^fmha_v3_fwd/(?!.*_group\.co$)", "warmup": 1, "repeats": 5, "case_timeout_seconds": 120,
            **changes}


CASES = [
    case("correct_fast", 136),
    case("correct_slow", 144),
    case("wrong_fast", 152),
    case("no_load_line", 160),
    case("crashed", 168),
    case("hung", 176, case_timeout_seconds=HANG_LIMIT),
    {"name": "decode", "kind": "decode", "what": "decode 3 sequences", "contexts": [16, 57, 129], "heads_q": 32,
     "heads_kv": 4, "head_dim": 128, "block": 16, "fallback": "paged_attention_rocm (HIP)", "proof": "^pa/",
     "warmup": 1, "repeats": 3, "case_timeout_seconds": 120},
    {"name": "varlen", "kind": "prefill_varlen", "what": "varlen 129+200", "lengths": [129, 200], "heads_q": 16,
     "heads_kv": 2, "head_dim": 128, "fallback": "torch SDPA per sequence (bf16)",
     "proof": r"^fmha_v3_fwd/.*_group\.co$", "warmup": 1, "repeats": 3, "case_timeout_seconds": 120},
    {"name": "gemm", "kind": "gemm_int8", "what": "INT8 GEMM 1024x1024x256", "m": 1024, "n": 1024, "k": 256,
     "fallback": "torch bf16 GEMM", "proof_module": "module_gemm_a8w8", "warmup": 1, "repeats": 3,
     "case_timeout_seconds": 120},
]
FAULTS = {"flash_attn_func:full:144": "slow", "flash_attn_func:full:152": "five_percent",
          "flash_attn_func:full:160": "fallback", "flash_attn_func:full:168": "crash",
          "flash_attn_func:full:176": "hang"}


def run_bench(lab: Lab, cases: list[dict], faults: dict, device: str = "gfx90a") -> tuple[int, dict, str]:
    """The runner as bench.py runs it on a host: the agent on PYTHONPATH, JSON on one line of stdout."""
    completed = subprocess.run(
        ["env", f"PYTHONPATH={lab.agent}", f"CDNA2_DEVICE_DOUBLE={device}", f"CDNA2_DEVICE_DOUBLE_SDPA_MS={SDPA_MS}",
         f"CDNA2_AITER_DOUBLE={json.dumps({'faults': faults})}", str(lab.python), "-B", "-m", "cdna2.host.bench",
         "--site-packages", str(lab.host.site), "--state-dir", str(lab.host.state_dir), "--host-arch", "gfx90a",
         "--cases-json", json.dumps(cases), "--json"],
        capture_output=True, text=True, timeout=900, cwd=lab.home)
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, f"--json prints exactly one line on stdout: {completed.stdout[-2000:]}{completed.stderr}"
    return completed.returncode, json.loads(lines[0]), completed.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    return Lab(tmp_path_factory.mktemp("bench-doubles"))


@pytest.fixture(scope="module")
def bench_run(lab: Lab) -> tuple[int, dict, str, float]:
    started = time.monotonic()
    code, report, stderr = run_bench(lab, CASES, FAULTS)
    return code, report, stderr, time.monotonic() - started


def results(report: dict) -> dict[str, dict]:
    return {result["case"]: result for result in report["cases"]}


def test_correct_and_fast_is_measured_faster_than_the_fallback(bench_run) -> None:
    result = results(bench_run[1])["correct_fast"]
    assert result["status"] == "ok", result
    assert result["speedup"] > 1.0, result
    assert result["asm"]["runs"] == 5 and result["fallback"]["median_ms"] >= SDPA_MS
    assert result["loaded"] and all("/hsa/gfx90a/fmha_v3_fwd/" in path for path in result["loaded"]), result


def test_correct_and_slow_is_measured_and_said_to_be_slower(bench_run) -> None:
    result = results(bench_run[1])["correct_slow"]
    assert result["status"] == "ok" and result["speedup"] < 1.0, result
    assert result["asm"]["median_ms"] >= 300 and "slower than the fallback" in result["detail"]


def test_wrong_and_fast_is_wrong_and_has_no_figure(bench_run) -> None:
    result = results(bench_run[1])["wrong_fast"]
    assert result["status"] == "wrong" and result["detail"].startswith("WRONG: "), result
    assert not {"asm", "fallback", "speedup", "figure"} & set(result)


def test_no_load_line_is_fallback_not_asm(bench_run) -> None:
    result = results(bench_run[1])["no_load_line"]
    assert result["status"] == "fallback" and "no load line at all" in result["detail"], result
    assert "speedup" not in result


def test_a_crashed_case_is_crashed_and_the_next_cases_still_run(lab: Lab, bench_run) -> None:
    found = results(bench_run[1])
    assert found["crashed"]["status"] == "crashed" and "SIGSEGV" in found["crashed"]["detail"], found["crashed"]
    assert found["decode"]["status"] == "ok" and found["varlen"]["status"] == "ok", (found["decode"], found["varlen"])
    assert found["decode"]["unit"] == "GB/s" and any("/hsa/gfx90a/pa/" in p for p in found["decode"]["loaded"])
    assert any(path.endswith("_group.co") for path in found["varlen"]["loaded"])
    assert found["gemm"]["status"] == "ok" and found["gemm"]["unit"] == "TOP/s", found["gemm"]
    assert found["gemm"]["loaded"] == [f"{lab.host.site}/aiter/jit/module_gemm_a8w8.so"], "the CK module's import"


def test_a_hung_case_is_killed_at_its_limit_with_what_it_started(lab: Lab, bench_run) -> None:
    result = results(bench_run[1])["hung"]
    assert result["status"] == "hung" and f"timed out after {HANG_LIMIT} s" in result["detail"], result
    assert "killed its process group (2 processes" in result["detail"], result
    assert not (lab.host.site / "aiter" / "jit" / "build" / "lock_module_fmha_v3_fwd").exists()
    assert bench_run[3] < 600


def test_the_runner_exits_1_and_counts_every_status(bench_run) -> None:
    code, report, stderr, _ = bench_run
    assert code == 1, "wrong, crashed and hung cases fail the host"
    assert report["counts"] == {"ok": 5, "wrong": 1, "fallback": 1, "crashed": 1, "hung": 1, "failed": 0,
                                "skipped": 0}, report["counts"]
    assert "bench:    wrong  wrong_fast: WRONG:" in stderr


def test_a_gpu_that_cannot_be_used_fails_every_case(lab: Lab) -> None:
    code, report, _ = run_bench(lab, CASES[:2], {}, device="none")
    assert code == 1
    assert {result["status"] for result in report["cases"]} == {"failed"}
    assert all("the host probe saw gfx90a but its GPU cannot be used: no device" in result["detail"]
               for result in report["cases"])


def test_python_m_cdna2_bench_on_this_machine_writes_the_report_with_its_picture(lab: Lab, tmp_path: Path) -> None:
    """The local command: rocminfo a stand-in listing two MI210s (the probe's fixture), the tool state holding a
    smoke pass with GPU checks for its deployed state, the cases a small file; figures, picture and WRONG named."""
    install_rocminfo(tmp_path / "rocm", FIXTURES / "rocminfo-2x-mi210.txt")
    state_dir = tmp_path / "state"
    state.update_state(state_dir, "deployed", {"kernels": "ab" * 32})
    state.update_state(state_dir, "smoke", {"proves": proof_key({"kernels": "ab" * 32}, True)})
    cases = tmp_path / "cases.yaml"
    cases.write_text(json.dumps({"format": 1, "budget_seconds": 120, "defaults": {},
                                 "cases": [CASES[0], CASES[2]]}))
    completed = subprocess.run(
        [sys.executable, "-m", "cdna2", "bench", "--python", str(lab.python), "--site-packages", str(lab.host.site),
         "--state-dir", str(state_dir), "--rocm-root", str(tmp_path / "rocm"), "--cases", str(cases),
         "--report-dir", str(tmp_path / "reports"), "--host-name", "this-mi210"],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "CDNA2_DEVICE_DOUBLE": "gfx90a", "CDNA2_DEVICE_DOUBLE_SDPA_MS": str(SDPA_MS),
             "CDNA2_AITER_DOUBLE": json.dumps({"faults": FAULTS})})
    assert completed.returncode == 1, f"a WRONG case fails the run:\n{completed.stderr[-3000:]}"
    report = json.loads((tmp_path / "reports" / "bench-latest.json").read_text())
    [entry] = report["hosts"]
    assert entry["host"] == "this-mi210" and [case["status"] for case in entry["cases"]] == ["ok", "wrong"]
    assert report["picture"] and (tmp_path / "reports" / report["picture"]["path"]).stat().st_size > 0
    assert f"![per-case speedup over the hosts]({report['picture']['path']})" in completed.stderr

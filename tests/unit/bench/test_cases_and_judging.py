"""The bench cases as data, which hosts run them, and the judging of a case from its child's report.

The child reports here are written as test doubles in the shape ``cdna2.host.bench_gpu`` prints (no GPU exists
here); ``test_bench_doubles.py`` runs the real children on the AITER and device doubles.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdna2.bench import BenchDataError, host_cases, load_cases, skip_reason
from cdna2.host import bench, gpu_run
from cdna2.smoke_proof import proof_key

CASE = {"name": "prefill_4x1024", "kind": "prefill", "what": "prefill 4x1024", "batch": 4, "seqlen": 1024,
        "heads_q": 32, "heads_kv": 4, "head_dim": 128, "causal": False, "fallback": "torch SDPA (bf16)",
        "proof": r"^fmha_v3_fwd/(?!.*_group\.co$)", "warmup": 3, "repeats": 20, "case_timeout_seconds": 60}
CHECK_PASSED = {"elements": 100, "bad_elements": 0, "unwritten": 0, "worst_row_rel_rms": 3e-3, "worst_row": 0,
                "rel_rms": 2e-3}
CHECK_WRONG = {**CHECK_PASSED, "bad_elements": 40, "worst_row_rel_rms": 0.05, "rel_rms": 0.05,
               "first_bad_element": {"index": 7, "got": 1.05, "ref": 1.0}}


def make_run(tmp_path: Path) -> gpu_run.GpuRun:
    site = tmp_path / "site-packages"
    (site / "aiter_meta" / "hsa" / "gfx90a").mkdir(parents=True)
    return gpu_run.GpuRun(tmp_path, site, site / "aiter_meta" / "hsa" / "gfx90a", gpu_run.GpuLimits())


def child_report(run: gpu_run.GpuRun, asm_check: dict = CHECK_PASSED, load: str | None = "fwd_hd128_bf16_rtna.co",
                 asm_ms: float = 1.0, fallback_ms: float = 1.6) -> dict:
    """What bench_gpu prints for one case; a wrong ASM output is reported as the child does (nothing timed), but
    with timings added, to show that the judge never reports them."""
    captured = (f"[aiter] hipModuleLoad: {run.tree}/fmha_v3_fwd/MI300/{load} GetFunction: _ZN5aiterE Success"
                if load else "")
    return {"case": CASE["name"], "error": None, "aiter_file": str(run.site_packages / "aiter" / "__init__.py"),
            "aiter_asm_dir": f"{run.tree}/", "asm": {**asm_check, "prefilled": True}, "fallback": CHECK_PASSED,
            "asm_ms": [asm_ms * factor for factor in (0.98, 1.0, 1.02)],
            "fallback_ms": [fallback_ms * factor for factor in (0.99, 1.0, 1.01)], "captured": captured}


def test_the_packaged_cases_load_with_their_defaults_filled_in() -> None:
    plan = load_cases()
    names = [case["name"] for case in plan["cases"]]
    assert {"prefill_4x1024", "prefill_16x1024", "prefill_1x8192_causal", "decode_128x1024",
            "decode_32x4096"} <= set(names)
    assert all(case["warmup"] == 3 and case["repeats"] == 20 for case in plan["cases"])
    assert plan["budget_seconds"] == 120
    assert next(case for case in plan["cases"] if case["name"] == "decode_32x4096")["mi210"] == \
        {"figure": 1052, "unit": "GB/s", "speedup": 1.72}


@pytest.mark.parametrize("change, message", [
    ({"cases": [{**CASE, "seqlenn": 5}]}, "Additional properties are not allowed ('seqlenn' was unexpected)"),
    ({"cases": [{**CASE, "kind": "decode"}]}, "$.cases[0]"),  # a decode case needs block and context
    ({"cases": [CASE, CASE]}, "case names must be unique: prefill_4x1024 repeated"),
    ({"defaults": {}, "cases": [{key: value for key, value in CASE.items() if key != "warmup"}]},
     "missing in prefill_4x1024"),
])
def test_a_bad_cases_file_is_refused_naming_the_file_and_the_fault(tmp_path: Path, change: dict,
                                                                     message: str) -> None:
    document = {"format": 1, "budget_seconds": 120, "defaults": {"warmup": 1}, **change}
    path = tmp_path / "cases.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    with pytest.raises(BenchDataError) as raised:
        load_cases(path)
    assert str(raised.value).startswith(f"{path}: ") and message in str(raised.value), raised.value


DEPLOYED = {"kernels": "ab" * 32}


@pytest.mark.parametrize("arch, state, reason", [
    ("gfx942", None, "not a gfx90a host (the probe saw gfx942)"),
    (None, None, "the probe found no GPU"),
    ("gfx90a", {}, "not provisioned: no deployed state is recorded on it (run deploy.py first)"),
    ("gfx90a", {"deployed": DEPLOYED}, "no smoke pass is recorded for its deployed state"),
    ("gfx90a", {"deployed": DEPLOYED, "smoke": {"proves": proof_key(DEPLOYED, False)}},
     "ran without GPU checks (smoke_gpu_checks is off: its GPU is a stand-in)"),
    ("gfx90a", {"deployed": DEPLOYED, "smoke": {"proves": proof_key({"kernels": "cd" * 32}, True)}},
     "no smoke pass is recorded for its deployed state"),  # a pass for another state proves nothing
    ("gfx90a", {"deployed": DEPLOYED, "smoke": {"proves": proof_key(DEPLOYED, True)}}, None),
])
def test_only_a_gfx90a_host_with_a_gpu_smoke_pass_for_its_deployed_state_runs_the_benchmarks(
        arch, state, reason) -> None:
    found = skip_reason(arch, state)
    assert (found is None) if reason is None else (reason in found), found


def test_correct_and_fast_gives_the_speedup_and_the_throughput(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, child_report(run, asm_ms=0.8, fallback_ms=1.2), run)
    assert result["status"] == "ok", result
    assert result["speedup"] == pytest.approx(1.5)
    # 4 * 4 sequences * 32 heads * 1024^2 * 128 FLOPs in 0.8 ms
    assert result["figure"] == pytest.approx(4 * 4 * 32 * 1024 ** 2 * 128 / 0.8e-3 / 1e12)
    assert result["unit"] == "TFLOP/s" and result["asm"]["runs"] == 3
    assert result["asm"]["spread_pct"] == pytest.approx(4.0)
    assert "slower" not in result["detail"]


def test_correct_and_slow_is_a_figure_said_to_be_slower_than_the_fallback(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, child_report(run, asm_ms=2.0, fallback_ms=1.0), run)
    assert result["status"] == "ok" and result["speedup"] == pytest.approx(0.5)
    assert "slower than the fallback (torch SDPA (bf16))" in result["detail"]


def test_wrong_and_fast_is_wrong_with_no_figure_at_all(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, child_report(run, asm_check=CHECK_WRONG, asm_ms=0.1), run)
    assert result["status"] == "wrong" and result["detail"].startswith("WRONG: "), result
    assert not {"asm", "fallback", "speedup", "figure", "measured"} & set(result), "no figure for a wrong result"
    assert "40 of 100 elements outside the bound" in result["detail"]


def test_correct_without_a_load_line_is_fallback_and_claims_no_speedup(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, child_report(run, load=None), run)
    assert result["status"] == "fallback" and "no load line at all" in result["detail"], result
    assert "speedup" not in result and "figure" not in result


def test_a_load_line_of_another_kind_of_kernel_is_no_proof(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, child_report(run, load="fwd_hd128_bf16_causal_rtna_group.co"), run)
    assert result["status"] == "fallback", result


def test_a_crashed_and_a_hung_case_are_named_so_without_figures(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    crashed = bench.judge_case(CASE, {"error": "'bench_gpu run {...}' ended with SIGSEGV (exit 139) and no report",
                                      "captured_tail": "HIP error"}, run)
    hung = bench.judge_case(CASE, {"error": "timed out after 20 s; killed its process group (2 processes: 1, 2)",
                                   "timed_out": True}, run)
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["detail"] and "HIP error" in crashed["detail"]
    assert hung["status"] == "hung" and "timed out after 20 s" in hung["detail"]
    assert not {"speedup", "figure"} & (set(crashed) | set(hung))


def test_a_fallback_that_is_wrong_gives_no_speedup(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = bench.judge_case(CASE, {**child_report(run), "fallback": CHECK_WRONG}, run)
    assert result["status"] == "failed" and "so no speedup can be given" in result["detail"], result


def test_decode_throughput_counts_the_kv_cache_bytes_read() -> None:
    case = {"kind": "decode", "batch": 128, "context": 1024, "heads_kv": 4, "head_dim": 128}
    amount, unit = bench.work(case)
    assert unit == "GB/s" and amount == pytest.approx(128 * 1024 * 4 * 128 * 2 * 2 / 1e9)


def test_a_host_that_is_not_gfx90a_skips_every_case_without_starting_a_child(tmp_path: Path) -> None:
    report = bench.run_bench(tmp_path, tmp_path, "gfx942", [CASE])
    assert [case["status"] for case in report["cases"]] == ["skipped"]
    assert report["cases"][0]["detail"] == "skipped: the host probe saw gfx942, the benchmarks are for gfx90a"


GEMM = {"name": "gemm_int8_4096", "kind": "gemm_int8", "what": "INT8 GEMM 4096^3", "m": 4096, "n": 4096, "k": 4096,
        "fallback": "torch bf16 GEMM", "proof_module": "module_gemm_a8w8", "requires_patch_set": "aiter-ck-int8-gemm",
        "warmup": 3, "repeats": 20, "case_timeout_seconds": 60}


def test_a_case_needing_a_patch_set_the_host_lacks_is_skipped_without_a_child(tmp_path: Path) -> None:
    deployed = {"patch_sets": {"amd-aiter": ["aiter-asm-paths"], "vllm": ["vllm-attention-gate"]}}
    marked = host_cases([CASE, GEMM], deployed)
    assert "skip" not in marked[0]
    assert marked[1]["skip"].startswith("needs the patch set aiter-ck-int8-gemm, not applied on this host")
    deployed["patch_sets"]["amd-aiter"].append("aiter-ck-int8-gemm")
    assert "skip" not in host_cases([GEMM], deployed)[0]
    # every case skipped: no device probe, no case child (tmp_path holds no AITER at all)
    report = bench.run_bench(tmp_path, tmp_path, "gfx90a", marked[1:])
    assert [case["status"] for case in report["cases"]] == ["skipped"] and report["device"] is None
    assert report["cases"][0]["detail"] == f"skipped: {marked[1]['skip']}"


def test_a_ck_gemm_is_proven_by_its_jit_module_import_from_the_provisioned_aiter(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    provisioned = f"[aiter] import [module_gemm_a8w8] under {run.site_packages}/aiter/jit/module_gemm_a8w8.so"
    elsewhere = "[aiter] import [module_gemm_a8w8] under /root/.aiter/jit/module_gemm_a8w8.so"
    result = bench.judge_case(GEMM, {**child_report(run), "captured": provisioned}, run)
    assert result["status"] == "ok" and result["unit"] == "TOP/s", result
    assert result["figure"] == pytest.approx(2 * 4096 ** 3 / 1e-3 / 1e12)  # 1 ms
    for captured in (elsewhere, child_report(run)["captured"], ""):
        result = bench.judge_case(GEMM, {**child_report(run), "captured": captured}, run)
        assert result["status"] == "fallback", result
        assert f"no import line names module_gemm_a8w8 in the provisioned {run.site_packages / 'aiter'}" in \
            result["detail"]


def test_a_gemm_case_with_an_attention_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cases.yaml"
    path.write_text(json.dumps({"format": 1, "budget_seconds": 120, "defaults": {},
                                "cases": [{**GEMM, "proof": "^pa/"}]}))
    with pytest.raises(BenchDataError, match=r"\$\.cases\[0\]"):
        load_cases(path)


def test_inside_an_image_the_runner_skips_the_cases_its_deployed_state_lacks_a_patch_set_for(tmp_path: Path,
                                                                                              capsys) -> None:
    """--skip-unapplied-patch-sets: the state the layer carries (state.json in --state-dir) marks the cases, as the
    controller does for a host it can read."""
    (tmp_path / "state.json").write_text(json.dumps({"deployed": {"patch_sets": {"amd-aiter": ["aiter-asm-paths"]}}}))
    arguments = ["--site-packages", str(tmp_path), "--state-dir", str(tmp_path), "--host-arch", "gfx90a",
                 "--cases-json", json.dumps([GEMM]), "--skip-unapplied-patch-sets", "--json"]
    assert bench.main(arguments) == 0
    case, = json.loads(capsys.readouterr().out)["cases"]
    assert case["status"] == "skipped" and case["detail"].startswith(
        "skipped: needs the patch set aiter-ck-int8-gemm, not applied on this host")

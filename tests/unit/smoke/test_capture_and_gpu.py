"""fd-level capture, load-line proof, the judging of GPU results, and the GPU-skipped path.

No GPU and no ROCm torch exist here, so the GPU cases themselves never run in these tests. The capture runs for
real in child processes; the judging is fed child reports written as test doubles, in the shape smoke_gpu prints
and with load lines in the exact formats AITER's C++ sources print.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cdna2.host import gpu_run, smoke, smoke_gpu

ROOT = Path(__file__).resolve().parents[3]

# A child that writes around and inside the capture, the way AITER's loader and HIP do: os.write straight to fds 1
# and 2, C stdio with no newline (buffered in libc while fd 1 is a file), and a grandchild inheriting the fds.
CAPTURING_CHILD = textwrap.dedent("""
    import ctypes, json, os, subprocess, sys
    from cdna2.host.smoke_gpu import captured_fds
    print("before", flush=True)
    with captured_fds() as captured:
        os.write(1, b"[aiter] hipModuleLoad: /site/aiter_meta/hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co\\n")
        os.write(2, b"fd2 line\\n")
        print("python print")
        ctypes.CDLL(None).printf(b"libc buffered")
        subprocess.run([sys.executable, "-c", "import os; os.write(1, b'grandchild fd1\\\\n')"], check=True)
    print(json.dumps({"captured": captured.text}))
""")


def test_captured_fds_takes_what_bypasses_python_stdout_and_restores_the_fds() -> None:
    completed = subprocess.run([sys.executable, "-c", CAPTURING_CHILD], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    lines = completed.stdout.splitlines()
    assert lines[0] == "before" and len(lines) == 2, f"captured text leaked to the real stdout: {lines}"
    captured = json.loads(lines[1])["captured"]
    for expected in ("hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co", "fd2 line", "python print", "libc buffered",
                     "grandchild fd1"):
        assert expected in captured, f"{expected!r} was not captured: {captured!r}"
    assert completed.stderr == "", "fd 2 output inside the block must be captured, not reach the real stderr"


def test_load_lines_reads_every_known_format() -> None:
    captured = "\n".join([
        # amd-aiter 0.1.7.post2.dev18, aiter_hip_common.h AiterAsmKernel (std::cout, always)
        "[aiter] hipModuleLoad: /s/aiter_meta/hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co GetFunction: "
        "_ZN5aiter27pa_bf16_noquant_gqa8_1tg_4wE Success",
        # later AITER, AITER_LOG_LEVEL=info, double slash as logged
        "[aiter] LoadKernel: _ZN5aiter27pa_bf16_noquant_gqa8_1tg_4wE hsaco: /s/aiter_meta/hsa//gfx90a/pa/x.co",
        # HIP API trace, AMD_LOG_LEVEL=3
        ":3:hip_module.cpp :58 : 1 us: [pid:1 tid:0x1]  hipModuleLoad ( 0x7ffd1, "
        "/s/aiter_meta/hsa/gfx90a/fmha_v3_fwd/MI300/fwd_hd128_bf16.co ) ",
        "UserWarning: df.copy() is not a code object line",
    ])
    assert [load["path"] for load in gpu_run.load_lines(captured)] == [
        "/s/aiter_meta/hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co",
        "/s/aiter_meta/hsa/gfx90a/pa/x.co",
        "/s/aiter_meta/hsa/gfx90a/fmha_v3_fwd/MI300/fwd_hd128_bf16.co",
    ]


SITE = Path("/s")
TREE = SITE / "aiter_meta/hsa/gfx90a"


def make_run(tmp_path: Path | None = None) -> gpu_run.GpuRun:
    return gpu_run.GpuRun(tmp_path or SITE / "state", SITE, TREE, gpu_run.GpuLimits(device=120))


def child_report(worst_row: float = 3e-3, bad: int = 0, captured: str = "", **extra) -> dict:
    """Test double for a smoke_gpu run report (no GPU here to produce a real one)."""
    return {"case": "x", "error": None, "rel_rms": 2e-3, "worst_row_rel_rms": worst_row, "worst_row": 0,
            "bad_elements": bad, "elements": 4096, "unwritten": 0, "prefilled": True, "elapsed_ms": 0.25,
            "captured": captured, "captured_tail": "", "aiter_file": str(SITE / "aiter/__init__.py"),
            "aiter_asm_dir": f"{TREE}/", **extra}


PA, FMHA, WINDOW = (next(check for check in smoke.GPU_CHECKS if check.case == case)
                    for case in ("pa_fwd_asm", "fmha_v3_fwd_noncausal", "sliding_window"))
GROUP = next(check for check in smoke.GPU_CHECKS if check.case == "fmha_v3_varlen_group")
PA_GFX90A = "[aiter] hipModuleLoad: /s/aiter_meta/hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co GetFunction: k"
PA_GFX942 = "[aiter] hipModuleLoad: /s/aiter_meta/hsa/gfx942/pa/pa_bf16_noquant_gqa8_1tg_4w.co GetFunction: k"


def test_correct_with_a_gfx90a_load_line_passes() -> None:
    check = smoke.judge_gpu_case(PA, child_report(captured=PA_GFX90A), make_run())
    assert check["status"] == "passed" and "hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co" in check["detail"]


def test_correct_without_gfx90a_proof_is_a_fallback_and_fails() -> None:
    for captured in ("", PA_GFX942):
        check = smoke.judge_gpu_case(PA, child_report(captured=captured), make_run())
        assert check["status"] == "failed" and "a fallback computed it" in check["detail"]
    wrong_family = smoke.judge_gpu_case(FMHA, child_report(captured=PA_GFX90A), make_run())
    assert wrong_family["status"] == "failed", "a pa load does not prove fmha_v3_fwd ran on ASM"
    batched = "[aiter] hipModuleLoad: /s/aiter_meta/hsa/gfx90a/fmha_v3_fwd/MI300/fwd_hd128_bf16_rtna.co GetFunction: k"
    assert smoke.judge_gpu_case(GROUP, child_report(captured=batched), make_run())["status"] == "failed", \
        "the varlen case must load a _group kernel"
    group = batched.replace("fwd_hd128_bf16_rtna.co", "fwd_hd128_bf16_rtna_group.co")
    assert smoke.judge_gpu_case(FMHA, child_report(captured=group), make_run())["status"] == "failed", \
        "the batched cases must load a batch-mode kernel"
    assert smoke.judge_gpu_case(FMHA, child_report(captured=batched), make_run())["status"] == "passed"
    elsewhere = PA_GFX90A.replace("/s/", "/other/site/")
    assert smoke.judge_gpu_case(PA, child_report(captured=elsewhere), make_run())["status"] == "failed", \
        "a gfx90a kernel outside the provisioned tree proves nothing about it"


def test_fast_but_wrong_is_wrong_even_with_the_asm_kernel_loaded() -> None:
    for report in (child_report(worst_row=0.05, captured=PA_GFX90A), child_report(bad=1, captured=PA_GFX90A),
                   child_report(bad=3, unwritten=3, captured=PA_GFX90A,
                                first_bad_element={"index": 7, "got": float("nan"), "ref": 0.25})):
        check = smoke.judge_gpu_case(PA, report, make_run())
        assert check["status"] == "wrong" and check["detail"].startswith("WRONG:"), check
    assert "3 never written (still NaN)" in check["detail"]
    assert "the first, element 7, is nan against 0.25" in check["detail"]


def test_another_aiter_or_kernel_directory_or_unfilled_output_fails() -> None:
    shadow = child_report(captured=PA_GFX90A, aiter_file="/root/aiter/__init__.py")
    check = smoke.judge_gpu_case(PA, shadow, make_run())
    assert check["status"] == "failed" and "imported aiter from /root/aiter/__init__.py" in check["detail"]
    moved = child_report(captured=PA_GFX90A, aiter_asm_dir="/tmp/hsa/gfx90a/")
    check = smoke.judge_gpu_case(PA, moved, make_run())
    assert check["status"] == "failed" and "AITER_ASM_DIR is /tmp/hsa/gfx90a/" in check["detail"]
    hsa_root = child_report(captured=PA_GFX90A, aiter_asm_dir=f"{SITE}/aiter_meta/hsa/")  # v0.1.17 and later
    assert smoke.judge_gpu_case(PA, hsa_root, make_run())["status"] == "passed"
    stale = child_report(captured=PA_GFX90A, prefilled=False)
    check = smoke.judge_gpu_case(PA, stale, make_run())
    assert check["status"] == "failed" and "did not land in the NaN-filled memory" in check["detail"]


def test_errors_fail_and_the_sliding_window_guard_needs_no_load_line() -> None:
    failed = smoke.judge_gpu_case(PA, {"error": "RuntimeError: invalid argument for fmha_fwd",
                                       "captured_tail": "[AITER] fail to call hipModuleLoad"}, make_run())
    assert failed["status"] == "failed" and "fail to call hipModuleLoad" in failed["detail"]
    assert smoke.judge_gpu_case(WINDOW, child_report(), make_run())["status"] == "passed"
    assert smoke.judge_gpu_case(WINDOW, child_report(worst_row=0.3), make_run())["status"] == "wrong"


def test_a_triton_case_passes_only_when_triton_launched_its_kernel() -> None:
    gemm = next(check for check in smoke.GPU_CHECKS if check.case == "triton_gemm_a16w16_small")
    launched = smoke.judge_gpu_case(gemm, child_report(triton_kernels=["_gemm_a16_w16_kernel"]), make_run())
    assert launched["status"] == "passed" and "Triton launched _gemm_a16_w16_kernel" in launched["detail"]
    for kernels in ([], ["_some_other_kernel"]):
        fallback = smoke.judge_gpu_case(gemm, child_report(triton_kernels=kernels), make_run())
        assert fallback["status"] == "failed" and "so a fallback computed it" in fallback["detail"], fallback
    wrong = smoke.judge_gpu_case(gemm, child_report(worst_row=0.3, triton_kernels=["_gemm_a16_w16_kernel"]),
                                 make_run())
    assert wrong["status"] == "wrong"


def test_without_a_gpu_every_gpu_check_is_skipped_never_passed(tmp_path: Path) -> None:
    for arch, why in ((None, "the host probe found no GPU"), ("gfx942", "the host probe saw gfx942")):
        checks, device, _ = smoke.gpu_checks(arch, make_run(tmp_path))
        assert device is None and [check["name"] for check in checks] == [check.name for check in smoke.GPU_CHECKS]
        assert all(check["status"] == "skipped" and why in check["detail"] for check in checks), checks


def test_without_torch_on_a_gfx90a_host_every_gpu_check_fails(tmp_path: Path) -> None:
    # A real device-probe child of this interpreter, which has no torch: on a gfx90a host that is a failure.
    checks, device, _ = smoke.gpu_checks("gfx90a", make_run(tmp_path))
    assert device is None
    for check in checks:
        assert check["status"] == "failed", check
        assert check["detail"].startswith("the host probe saw gfx90a but its GPU cannot be used: no torch"), check


def test_every_gpu_check_names_a_case_the_child_knows() -> None:
    assert {check.case for check in smoke.GPU_CHECKS} == set(smoke_gpu.CASES)


def test_a_child_dying_inside_the_capture_leaves_its_output_in_the_sink_file(tmp_path: Path) -> None:
    # AITER's HIP_CALL: printf the HIP error, then exit(0) from inside the kernel call.
    sink = tmp_path / "captured.log"
    dying = textwrap.dedent(f"""
        import ctypes
        from pathlib import Path
        from cdna2.host.smoke_gpu import captured_fds
        with captured_fds(Path({str(sink)!r})):
            ctypes.CDLL(None).printf(b"[AITER] asm_pa.cu:231 fail to call hipModuleLoad ---> [HIP error]")
            ctypes.CDLL(None).exit(0)
    """)
    completed = subprocess.run([sys.executable, "-c", dying], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert completed.returncode == 0 and completed.stdout == ""
    assert "fail to call hipModuleLoad" in gpu_run.tail_of(sink)

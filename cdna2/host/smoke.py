"""On-host smoke test: prove that this host runs AITER's translated gfx90a kernels, or say exactly why it does not.

    PYTHONPATH=<state_dir>/agent <target_python> -B -m cdna2.host.smoke --site-packages DIR --state-dir DIR \\
        --host-arch ARCH|none [--no-gpu-checks] [--expect-triton 3.7.1] [--timeout SECONDS] \\
        [--device-timeout SECONDS] [--warmup-timeout SECONDS] [--case-timeout SECONDS] [--families JSON] \\
        [--keep-family NAME ...] [--json]

Static checks always run (smoke_static.py): the gfx90a tree is present and is the one the deploy installed, every
code object in it says gfx90a, no manifest row names a missing kernel, the patch transactions are applied, every
other AITER and
vLLM file matches its RECORD, triton is the expected version and ``triton.runtime.autotuner`` imports in a child,
no JIT output built before its inputs were patched survives, no module compiled from the kernel trees predates
the gfx90a tree, no JIT lock is orphaned, ``import aiter`` works where torch is a ROCm build (and must, on a
gfx90a host). GPU checks run ``cdna2.host.smoke_gpu`` in child processes on a host the probe saw as gfx90a
(``--host-arch``): a GPU that cannot be used there fails them, with the reason; they are "skipped" only on a host
with no GPU or another arch, or with ``--no-gpu-checks``, never "passed" (and the Triton GEMM checks where the
optional aiter-triton-gfx90a set that installs its gfx90a configs is not applied).

With ``--families`` (the deploy passes cdna2/data/kernel-families.yaml), each installed kernel family gets a verdict
(cdna2/host/families.py): proven when its GPU checks passed; withheld when one failed or none proves it, where the GPU
checks ran (``withhold`` names those still in the tree: the deploy removes them); unproven, with the reason, where
they did not run or ``--keep-family`` keeps it. The checks of a family withheld earlier are skipped: its kernels are
gone.

Each GPU child runs isolated (``python -I``: no working directory, PYTHONPATH or user site on its path) from the
state directory, in a session of its own (gpu_run.py); when it ends, or at its time limit, whatever is left of its
process group is killed and the JIT locks the group held are removed. A warm-up child first runs every case once under a
generous limit (AITER JIT-builds there); then each case runs in a fresh child under a short one.

Standard library only; torch and aiter are imported only inside child processes. Distributions are looked up
with ``--site-packages`` first on the search path. Prints one JSON object on stdout (indented, or one line with
``--json``) and a human summary on stderr; exit 0 when no check failed or was wrong (skips are fine), else 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from cdna2.host import smoke_gpu
from cdna2.host.distributions import recorded_versions
from cdna2.host.families import WITHHELD, installed_families, judge, verdict_line
from cdna2.host.gpu_run import GpuLimits, GpuRun, gpu_child, load_lines, proven_loads, provenance_problem
from cdna2.host.smoke_static import (FAILED, GPU, PASSED, SKIPPED, WRONG, named, read_host, result, searched_first,
                                     static_checks)

DEFAULT_TRITON = "3.7.1"  # the pin AITER needs: 3.7.0 dies with SIGSEGV on AITER's import path


@dataclass(frozen=True)
class GpuCheck:
    """A GPU check: the smoke_gpu case it runs and what a load line's code object, relative to the provisioned
    hsa/gfx90a, must match (a regular expression; None: no proof), or the Triton kernel it must have launched.
    ``needs`` lists files (under site-packages) of which one must exist for the check to apply; without them the
    check is skipped, saying what they are (``needs_what``: the configs an optional patch set installs, or the
    module an AITER release has)."""

    name: str
    case: str
    proof: str | None
    what: str
    triton_kernel: str | None = None
    needs: tuple[str, ...] = ()
    needs_what: str = ""


GPU_ARCH = "gfx90a"
BATCHED_FMHA = r"^fmha_v3_fwd/(?!.*_group\.co$)"  # a batch-mode kernel: the group-mode ones end in _group.co
GPU_CHECKS = (
    GpuCheck("fmha_v3_fwd_bf16_hd128", "fmha_v3_fwd_noncausal", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, not causal"),
    GpuCheck("fmha_v3_fwd_bf16_hd128_causal", "fmha_v3_fwd_causal", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, causal"),
    GpuCheck("fmha_v3_fwd_bf16_hd128_partial_tile", "fmha_v3_fwd_partial_tile", BATCHED_FMHA,
             "fmha_v3_fwd bf16 head_dim 128, causal, seqlen 1000 (a partial last tile)"),
    # The path vLLM's prefill takes: group mode, its own kernels.
    GpuCheck("fmha_v3_fwd_varlen_group", "fmha_v3_varlen_group", r"^fmha_v3_fwd/.*_group\.co$",
             "varlen fmha_v3_fwd bf16 head_dim 128, causal, lengths 129 and 383"),
    GpuCheck("pa_fwd_asm_bf16_block16_gqa8", "pa_fwd_asm", r"^pa/", "pa_fwd_asm bf16 block 16 GQA 8"),
    # The sliding-window path is CK, not ASM, in every AITER we know; the guard is its result, not a load line.
    # It is AITER's own entry; vLLM's ROCM_AITER_FA is kept off sliding-window models by vllm-attention-gate's
    # sliding-window-guard site, proven by `python -m releases gates`, not here.
    # The families AITER reaches beyond attention (cdna2/data/kernel-families.yaml): each by the entry that loads
    # it on gfx90a, with a shape the installed kernels serve.
    GpuCheck("mla_decode_bf16_gqa16", "mla_decode", r"^mla/", "MLA decode bf16, 16 heads on one latent KV head"),
    GpuCheck("topksoftmax_asm", "topksoftmax_asm", r"^topksoftmax/", "topk_softmax_asm fp32, 128 experts, top 8"),
    GpuCheck("fmoe_g1u0_fp16", "fmoe_g1u0_fp16", r"^fmoe_f16\.co$", "fused MoE fp16 g1u0 SiLU, 8 experts, top 2"),
    GpuCheck("bf16gemm_asm", "bf16gemm_asm", r"^bf16gemm/", "gemm_a16w16_asm bf16 -> fp32, 150x256x5120"),
    GpuCheck("layernorm2d_with_add_asm", "layernorm2d_with_add_asm", r"^layer_norm\.co$",
             "layernorm2d_with_add_asm bf16, 8192 wide"),
    GpuCheck("sliding_window_attention", "sliding_window", None,
             "sliding-window varlen attention (window 256) through AITER's flash_attn_varlen_func (CK), AITER's own "
             "path; vLLM serves no sliding-window model with ROCM_AITER_FA on gfx90a (its guard)"),
) + tuple(
    # AITER's Triton bf16 GEMM with the gfx90a configs aiter-triton-gfx90a installs (MI200-named on 0.1.7).
    GpuCheck(f"triton_gemm_a16w16_{size}", f"triton_gemm_a16w16_{size}", None,
             f"AITER Triton gemm_a16w16 bf16, {shape}", triton_kernel="_gemm_a16_w16_kernel",
             needs=("aiter/ops/triton/configs/gemm/MI200-GEMM-A16W16.json",
                    "aiter/ops/triton/configs/gemm/gfx90a-GEMM-A16W16.json"),
             needs_what="the gfx90a configs the optional aiter-triton-gfx90a set installs; it is not applied on this "
                        "host")
    for size, shape in (("small", "32 tokens, 640 x 2880"),
                        ("large", "4096 tokens, 128 x 2880 (the stepped-down bucket)"))) + (
    # The Triton ops vLLM calls whose config AITER picks in code (vllm-aiter-triton-ops opens them on gfx90a); each
    # must have launched its kernel. Unified attention also runs on a host without that set: ROCM_AITER_FA's decode
    # calls it for head sizes under 64.
    GpuCheck("triton_rope", "triton_rope", None,
             "AITER Triton rope (vLLM's rotary embedding) bf16, NeoX, 300 tokens, 32/8 heads of 128",
             triton_kernel="_rope_kernel_cached_thd_2c_gqa_onehead_fwd", needs=("aiter/ops/triton/rope/rope.py",),
             needs_what="the module vLLM imports its Triton rope from, which AITER has from 0.1.10 on"),
    GpuCheck("triton_unified_attention_decode", "triton_unified_attention_decode", None,
             "AITER Triton unified_attention paged decode bf16, block 16, GQA 8, 8 sequences up to 1024 (3d kernel)",
             triton_kernel="kernel_unified_attention_3d"),
    GpuCheck("triton_unified_attention_sliding_window", "triton_unified_attention_sliding_window", None,
             "AITER Triton unified_attention causal prefill with a sliding window of 256 over a paged KV cache, "
             "lengths 200 and 1000 (2d kernel)", triton_kernel="kernel_unified_attention_2d"),
)


def error_figures(report: dict) -> str:
    first = report.get("first_bad_element")
    element = (f"; the first, element {first['index']}, is {first['got']:.4g} against {first['ref']:.4g}"
               if first else "")
    unwritten = f", {report['unwritten']} never written (still NaN)" if report["unwritten"] else ""
    rel_rms = f"{report['rel_rms']:.2e}" if report["rel_rms"] is not None else "non-finite"
    return (f"rel_rms {rel_rms} of rms(ref), worst row {report['worst_row_rel_rms']:.2e}, "
            f"{report['bad_elements']} of {report['elements']} elements outside the bound{unwritten}{element}")


def judge_gpu_case(check: GpuCheck, report: dict, run: GpuRun) -> dict:
    """The check's status from the child's report: failed, wrong (a result off the reference), or passed."""
    cleanup = f"; {report['cleanup']}" if report.get("cleanup") else ""
    if report.get("error"):
        output = report.get("captured_tail", "").strip()[-400:]
        return result(check.name, GPU, FAILED, f"{check.what}: {report['error']}"
                                               f"{'; output: ' + output if output else ''}{cleanup}")
    problem = provenance_problem(report, run)
    if problem:
        return result(check.name, GPU, FAILED, f"{check.what}: {problem}, so this run says nothing about the "
                                               f"provisioned AITER{cleanup}")
    if not report["prefilled"]:
        return result(check.name, GPU, FAILED, f"{check.what}: AITER's output did not land in the NaN-filled "
                                               f"memory, so an element the kernel never wrote cannot be told from "
                                               f"stale memory{cleanup}")
    figures = f"{error_figures(report)}, {report['elapsed_ms']:.3f} ms"
    loads = load_lines(report.get("captured", ""))
    loaded = f"; loaded {named(sorted({load['path'] for load in loads}))}" if loads else ""
    if not smoke_gpu.passes(report):
        bounds = smoke_gpu.bounds_of(report)
        return result(check.name, GPU, WRONG, f"WRONG: {check.what} differs from the torch reference ({figures}; "
                                              f"needs every element within {bounds['atol']:.2e} * max|v| + "
                                              f"{bounds['rtol']:.2e} * |ref| and every row within "
                                              f"{bounds['row_limit']:.2e}){loaded}{cleanup}")
    if check.triton_kernel is not None:
        launched = report.get("triton_kernels") or []
        if check.triton_kernel not in launched:
            return result(check.name, GPU, FAILED,
                          f"{check.what} is correct ({figures}) but Triton launched no {check.triton_kernel} "
                          f"(launched: {', '.join(launched) or 'nothing'}), so a fallback computed it{cleanup}")
        return result(check.name, GPU, PASSED, f"{check.what} matches the reference ({figures}); Triton launched "
                                               f"{check.triton_kernel}{cleanup}")
    if check.proof is None:
        return result(check.name, GPU, PASSED, f"{check.what} matches the reference ({figures}){loaded}{cleanup}")
    proof = proven_loads(loads, run.tree, check.proof)
    if not proof:
        return result(check.name, GPU, FAILED,
                      f"{check.what} is correct ({figures}) but no kernel-load line names a code object matching "
                      f"{check.proof} in the provisioned {run.tree}, so a fallback computed it"
                      f"{loaded or ' (no load line at all)'}{cleanup}")
    return result(check.name, GPU, PASSED, f"{check.what} matches the reference ({figures}); loaded "
                                           f"{named(proof)}{cleanup}")


def gpu_checks(host_arch: str | None, run: GpuRun | None, no_gpu_reason: str | None = None,
               withheld: dict[str, str] | None = None) -> tuple[list[dict], dict | None, str | None]:
    """Every GPU check, the device seen, and why the checks did not run (None when they did).

    ``withheld``: check name -> why its family is withheld on this host already (its kernels are gone): skipped.

    Skipped only where they cannot apply: no GPU can exist (``no_gpu_reason``: an image built where the probe found
    none and the arch came from data), the checks are off for this host (``run`` None), or the host probe found
    no GPU or one of another arch. On a host the probe saw as gfx90a, a GPU that cannot be used (a crashed, hung
    or deviceless probe, torch or AITER missing) fails every check with the reason.
    """
    def skipped(why: str) -> tuple[list[dict], None, str]:
        return [result(check.name, GPU, SKIPPED, f"skipped: {why}") for check in GPU_CHECKS], None, why

    if no_gpu_reason:
        return skipped(no_gpu_reason)
    if run is None:
        return skipped("GPU checks are off for this host (smoke_gpu_checks)")
    if host_arch != GPU_ARCH:
        return skipped(f"the host probe saw {host_arch}, these checks are for {GPU_ARCH}" if host_arch
                       else "the host probe found no GPU")
    withheld = withheld or {}
    checks = [check for check in GPU_CHECKS if check.name not in withheld]
    probe_report = gpu_child(["device"], run, run.limits.device)
    reason = probe_report.get("error") or probe_report.get("reason")
    if reason:
        why = f"the host probe saw {GPU_ARCH} but its GPU cannot be used: {reason}"
        return [result(check.name, GPU, FAILED, why) for check in GPU_CHECKS], probe_report.get("device"), why
    unprovisioned = {check.name: f"{check.what} needs {check.needs_what} ({' or '.join(check.needs)})"
                     for check in checks
                     if check.needs and not any((run.site_packages / path).is_file() for path in check.needs)}
    checks = [check for check in checks if check.name not in unprovisioned]
    warmup = gpu_child(["warmup", *(check.case for check in checks)], run, run.limits.warmup)
    if warmup.get("timed_out"):
        why = f"the warm-up (AITER's JIT builds and first loads) {warmup['error']}"
        return [result(check.name, GPU, FAILED, f"{check.what}: {why}") for check in GPU_CHECKS], \
            probe_report["device"], why
    ran = {check.name: judge_gpu_case(check, gpu_child(["run", check.case], run, run.limits.case), run)
           for check in checks}
    not_run = {**withheld, **unprovisioned}
    return [ran.get(check.name) or result(check.name, GPU, SKIPPED, f"skipped: {not_run[check.name]}")
            for check in GPU_CHECKS], probe_report["device"], None


# --- the run ------------------------------------------------------------------------------------------------------

def run_smoke(site_packages: Path, state_dir: Path, host_arch: str | None, expected_triton: str = DEFAULT_TRITON,
              timeout: float = 1800.0, limits: GpuLimits | None = GpuLimits(),
              no_gpu_reason: str | None = None, families: list[dict] | None = None,
              keep: list[str] = ()) -> dict:
    """Every check; ``limits`` None turns the GPU checks off, ``no_gpu_reason`` says why none can exist (an image
    built without a GPU): either way the report says so.

    ``families`` (cdna2/data/kernel-families.yaml): each installed family's verdict goes into the report
    (``families``), and ``withhold`` names those whose code objects must now leave hsa/gfx90a (the deploy does
    that, cdna2/host/families.py); ``keep``: families with no check the host data keeps."""
    gpu_required = host_arch == GPU_ARCH and limits is not None and not no_gpu_reason
    with searched_first(site_packages):
        view = read_host(site_packages, state_dir)
        checks = static_checks(view, expected_triton, timeout, gpu_required)
    withheld_before = ((view.tool_state or {}).get("kernels") or {}).get("withheld") or {}
    skip = {check: f"its family {family['name']} is withheld on this host: {withheld_before[family['name']]['reason']}"
            for family in families or () if family["name"] in withheld_before for check in family["checks"]}
    run = GpuRun(state_dir, site_packages, view.gfx90a_tree, limits) if limits is not None else None
    gpu, device, not_run = gpu_checks(host_arch, run, no_gpu_reason, skip)
    checks.extend(gpu)
    counts = {status: sum(check["status"] == status for check in checks) for status in (PASSED, FAILED, SKIPPED, WRONG)}
    report = {"checks": checks, **counts, "device": device, "host_arch": host_arch, "gpu_checks": run is not None,
              # what the checks ran against: inside an image's runtime, the image's packages, not the node's
              "versions": recorded_versions(view.distributions)}
    if families is not None:
        tree = view.gfx90a_tree
        installed = installed_families(tree, families) if tree is not None and tree.is_dir() else {}
        verdicts = judge(installed, gpu, families, list(keep), not_run, withheld_before)
        report["families"] = verdicts
        report["withhold"] = {name: entry["reason"] for name, entry in verdicts.items()
                              if entry["verdict"] == WITHHELD and name in installed}
    return report


def summary_lines(report: dict) -> list[str]:
    lines = [f"smoke: {check['status']:>7}  {check['kind']:<6} {check['name']}: {check['detail']}"
             for check in report["checks"]]
    lines.append(f"smoke: {report[PASSED]} passed, {report[FAILED]} failed, {report[WRONG]} wrong, "
                 f"{report[SKIPPED]} skipped")
    lines += [f"smoke: family {name} {entry['verdict']}: {entry['reason']}"
              for name, entry in report.get("families", {}).items()]
    if "families" in report:
        lines.append(f"smoke: {verdict_line(report['families'])}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--site-packages", type=Path, required=True, help="site-packages holding AITER and vLLM")
    parser.add_argument("--state-dir", type=Path, required=True, help="this tool's state directory on the host")
    parser.add_argument("--host-arch", required=True,
                        help="the GPU arch the host probe saw ('none' when it found no GPU): on gfx90a a GPU that "
                             "cannot be used fails the GPU checks")
    parser.add_argument("--no-gpu-checks", action="store_true",
                        help="skip the GPU checks (only for hosts whose GPU is a stand-in, such as the lab's)")
    parser.add_argument("--expect-triton", default=DEFAULT_TRITON, help="triton version required (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per static-check child")
    parser.add_argument("--device-timeout", type=float, default=GpuLimits.device,
                        help="seconds for the GPU device probe child (%(default)g)")
    parser.add_argument("--warmup-timeout", type=float, default=GpuLimits.warmup,
                        help="seconds for the GPU warm-up child, which may JIT-build AITER modules (%(default)g)")
    parser.add_argument("--case-timeout", type=float, default=GpuLimits.case,
                        help="seconds for each GPU case after the warm-up (%(default)g)")
    parser.add_argument("--no-gpu", metavar="REASON",
                        help="no GPU can exist here (an image build): skip every GPU check with this reason")
    parser.add_argument("--families", metavar="JSON",
                        help="the kernel families (name, kernels, checks, no_check) to judge: each installed "
                             "family's verdict, and which to withhold")
    parser.add_argument("--keep-family", action="append", default=[], metavar="NAME",
                        help="keep this family although no GPU check proves it (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on one line (for the deploy)")
    args = parser.parse_args(argv)
    limits = None if args.no_gpu_checks else GpuLimits(args.device_timeout, args.warmup_timeout, args.case_timeout)
    report = run_smoke(args.site_packages, args.state_dir, None if args.host_arch == "none" else args.host_arch,
                       args.expect_triton, args.timeout, limits, args.no_gpu,
                       json.loads(args.families) if args.families else None, args.keep_family)
    print(json.dumps(report, sort_keys=True) if args.json else json.dumps(report, indent=2, sort_keys=True))
    print("\n".join(summary_lines(report)), file=sys.stderr)
    return 1 if report[FAILED] or report[WRONG] else 0


if __name__ == "__main__":
    sys.exit(main())

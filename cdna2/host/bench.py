"""On-host benchmarks: what AITER's ASM kernels buy on this host against their fallbacks, correctness first.

    PYTHONPATH=<state_dir>/agent <target_python> -B -m cdna2.host.bench --site-packages DIR --state-dir DIR \\
        --host-arch ARCH|none --cases-json JSON [--case-timeout SECONDS] [--device-timeout SECONDS] [--json]

The cases come from the controller (``cdna2/data/bench-cases.yaml``, validated there, defaults filled in) as JSON.
Each runs in a child process of its own (``cdna2.host.bench_gpu``), isolated and killed with its process group at
its time limit as the smoke test's GPU children are (``cdna2.host.gpu_run.gpu_child``). Then each is judged here:

- ``wrong``: the ASM output is off the reference (the smoke test's pass rule): WRONG, and no figure is reported,
  whatever the child timed;
- ``fallback``: correct, but no kernel-load line names a code object of the case's kind in the provisioned
  ``hsa/gfx90a`` (for a CK kernel: no import line of its JIT module from the provisioned ``aiter/``): a fallback
  computed it, and its time is reported as that, never as the kernel's;
- ``crashed``: the child died without a report (a signal, AITER's HIP_CALL exit); ``hung``: killed at its limit;
- ``failed``: an exception, another AITER than the provisioned one, output not provably written, a fallback whose
  own output is wrong (no speedup can be given), or a GPU that cannot be used on a host probed as gfx90a;
- ``ok``: median, min, max and spread of the timed runs of both paths, the speedup (fallback median / ASM median)
  and the ASM throughput (TFLOP/s for prefill, GB/s of KV cache read for decode);
- ``skipped``: not a gfx90a host, or a case the controller marked ``skip`` for this host (a patch set it needs is
  not applied there); the detail says why.

Standard library only; torch and aiter are imported only inside the children. Prints one JSON object on stdout
(indented, or one line with ``--json``) and a human summary on stderr; exit 0 when no case is wrong, crashed, hung
or failed, else 1.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from cdna2.host import gpu_run, smoke, smoke_gpu, smoke_static
from cdna2.host.state import read_state

OK, WRONG, FALLBACK, CRASHED, HUNG, FAILED, SKIPPED = "ok", "wrong", "fallback", "crashed", "hung", "failed", "skipped"
PROBLEMS = (WRONG, CRASHED, HUNG, FAILED)  # statuses that fail the host; "fallback" is reported, by name
GPU_ARCH = smoke.GPU_ARCH
DEVICE_TIMEOUT = 120.0


def contexts(case: dict) -> list[int]:
    """A decode case's context lengths: ``contexts`` as given, or ``batch`` sequences of ``context`` tokens."""
    return case.get("contexts") or [case["context"]] * case["batch"]


def work(case: dict) -> tuple[float, str]:
    """What one call does, in the unit its figure is given in per second: FLOPs of prefill attention (TFLOP/s;
    4 * heads * seq_q * seq_k * head_dim, half of it when causal), bytes of KV cache decode reads (GB/s), or int8
    operations of a GEMM (TOP/s, 2 * m * n * k)."""
    if case["kind"] == "decode":
        return sum(contexts(case)) * case["heads_kv"] * case["head_dim"] * 2 * 2 / 1e9, "GB/s"
    if case["kind"] == "gemm_int8":
        return 2 * case["m"] * case["n"] * case["k"] / 1e12, "TOP/s"
    lengths = case["lengths"] if case["kind"] == "prefill_varlen" else [case["seqlen"]] * case["batch"]
    causal = case["kind"] == "prefill_varlen" or case["causal"]
    flops = sum(4 * case["heads_q"] * length * length * case["head_dim"] for length in lengths)
    return flops * (0.5 if causal else 1.0) / 1e12, "TFLOP/s"


def timing(times: list[float]) -> dict:
    """Median, min and max of the timed runs (ms), and their spread ((max - min) / median, percent)."""
    median = statistics.median(times)
    return {"median_ms": median, "min_ms": min(times), "max_ms": max(times), "runs": len(times),
            "spread_pct": (max(times) - min(times)) / median * 100.0 if median > 0 else None}


def case_result(case: dict, status: str, detail: str, **figures) -> dict:
    return {"case": case["name"], "kind": case["kind"], "status": status, "detail": detail, **figures}


MODULE_IMPORT = re.compile(r"import \[(?P<module>[A-Za-z0-9_]+)\] under (?P<path>\S+)")


def kernel_proof(case: dict, captured: str, run: gpu_run.GpuRun) -> tuple[list[str], str, str]:
    """What in the child's captured output proves the case's kernel ran, what was wanted, and what was seen.

    ASM kernels (``proof``): a kernel-load line naming a code object under the provisioned hsa/gfx90a whose path
    there matches ``proof``. CK kernels (``proof_module``): AITER's import line for that JIT module, from the
    provisioned ``aiter/`` (a module in ``AITER_JIT_DIR`` or ``~/.aiter`` elsewhere is no proof).
    """
    if "proof_module" in case:
        imports = list(MODULE_IMPORT.finditer(captured))
        package = run.site_packages / "aiter"
        proof = sorted({match["path"] for match in imports
                        if match["module"] == case["proof_module"] and gpu_run.within(match["path"], package)})
        seen = (f"imported {smoke_static.named(sorted({match['path'] for match in imports}))}" if imports
                else "no module import line at all")
        return proof, f"no import line names {case['proof_module']} in the provisioned {package}", seen
    loads = gpu_run.load_lines(captured)
    proof = gpu_run.proven_loads(loads, run.tree, case["proof"])
    seen = f"loaded {smoke_static.named(sorted({load['path'] for load in loads}))}" if loads else "no load line at all"
    return (proof, f"no kernel-load line names a code object matching {case['proof']} in the provisioned {run.tree}",
            seen)


def judge_case(case: dict, report: dict, run: gpu_run.GpuRun) -> dict:
    """The case's status and figures from its child's report (see the module docstring)."""
    what = case["what"]
    cleanup = f"; {report['cleanup']}" if report.get("cleanup") else ""
    if report.get("timed_out"):
        return case_result(case, HUNG, f"{what}: hung: {report['error']}")
    if "case" not in report:  # the child died before it could print its report
        output = report.get("captured_tail", "").strip()[-400:]
        return case_result(case, CRASHED, f"{what}: crashed: {report['error']}"
                                          f"{'; output: ' + output if output else ''}")
    if report.get("error"):
        return case_result(case, FAILED, f"{what}: {report['error']}{cleanup}")
    problem = gpu_run.provenance_problem(report, run)
    if problem:
        return case_result(case, FAILED, f"{what}: {problem}, so this run says nothing about the provisioned "
                                         f"AITER{cleanup}")
    asm = report["asm"]
    if not asm["prefilled"]:
        return case_result(case, FAILED, f"{what}: AITER's output did not land in the NaN-filled memory, so an "
                                         f"element the kernel never wrote cannot be told from stale memory")
    if not smoke_gpu.passes(asm):
        return case_result(case, WRONG, f"WRONG: {what} differs from the reference ({smoke.error_figures(asm)}); "
                                        f"no figure is reported for a wrong result", check=asm)
    if not smoke_gpu.passes(report["fallback"]):
        return case_result(case, FAILED, f"{what}: the fallback ({case['fallback']}) differs from the reference "
                                         f"({smoke.error_figures(report['fallback'])}), so no speedup can be given",
                           check=asm)
    proof, wanted, seen = kernel_proof(case, report.get("captured", ""), run)
    asm_timing, fallback_timing = timing(report["asm_ms"]), timing(report["fallback_ms"])
    if not proof:
        return case_result(case, FALLBACK, f"fallback: {what} is correct but {wanted} ({seen}), so a fallback "
                                           f"computed it: {asm_timing['median_ms']:.3f} ms is not the kernel's",
                           measured=asm_timing, fallback=fallback_timing)
    amount, unit = work(case)
    speedup = fallback_timing["median_ms"] / asm_timing["median_ms"]
    figure = amount / (asm_timing["median_ms"] / 1000.0)
    slower = f"; slower than the fallback ({case['fallback']})" if speedup < 1.0 else ""
    return case_result(case, OK, f"{what}: {figure:.1f} {unit}, {asm_timing['median_ms']:.3f} ms against "
                                 f"{fallback_timing['median_ms']:.3f} ms, {speedup:.2f}x{slower}; loaded "
                                 f"{smoke_static.named(proof)}", asm=asm_timing, fallback=fallback_timing,
                       speedup=speedup, figure=figure, unit=unit, loaded=proof)


def host_cases(cases: list[dict], deployed: dict | None) -> list[dict]:
    """The cases for one host: a case needing a patch set the host's deployed state lacks is marked ``skip``, with
    why (the runner reports it skipped without starting it)."""
    applied = {name for names in ((deployed or {}).get("patch_sets") or {}).values() for name in names}
    return [{**case, "skip": f"needs the patch set {case['requires_patch_set']}, not applied on this host (add it "
                             f"to optional_patch_sets where its AITER takes it)"}
            if case.get("requires_patch_set") and case["requires_patch_set"] not in applied else case
            for case in cases]


def run_bench(site_packages: Path, state_dir: Path, host_arch: str | None, cases: list[dict],
              device_timeout: float = DEVICE_TIMEOUT, case_timeout: float | None = None) -> dict:
    """Every case on this host; ``case_timeout`` overrides each case's own limit."""
    started = time.monotonic()
    if host_arch != GPU_ARCH:
        why = f"the host probe saw {host_arch}, the benchmarks are for {GPU_ARCH}" if host_arch else \
            "the host probe found no GPU"
        results = [case_result(case, SKIPPED, f"skipped: {why}") for case in cases]
        return summarised(results, None, host_arch, started)
    # Cases the controller marked for this host (a patch set it lacks): skipped with that, no child started.
    skipped = {case["name"]: case_result(case, SKIPPED, f"skipped: {case['skip']}")
               for case in cases if case.get("skip")}
    if len(skipped) == len(cases):
        return summarised(list(skipped.values()), None, host_arch, started)
    with smoke_static.searched_first(site_packages):
        view = smoke_static.read_host(site_packages, state_dir)
    run = gpu_run.GpuRun(state_dir, site_packages, view.gfx90a_tree, gpu_run.GpuLimits(device=device_timeout))
    device = gpu_run.gpu_child(["device"], run, device_timeout)
    reason = device.get("error") or device.get("reason")
    if reason:
        results = [skipped.get(case["name"]) or
                   case_result(case, FAILED, f"the host probe saw {GPU_ARCH} but its GPU cannot be used: {reason}")
                   for case in cases]
        return summarised(results, device.get("device"), host_arch, started)
    results = [skipped.get(case["name"]) or
               judge_case(case, gpu_run.gpu_child(["run", json.dumps(case, sort_keys=True)], run,
                                                case_timeout or case["case_timeout_seconds"], module="bench_gpu"), run)
               for case in cases]
    return summarised(results, device["device"], host_arch, started)


def summarised(results: list[dict], device: dict | None, host_arch: str | None, started: float) -> dict:
    counts = {status: sum(result["status"] == status for result in results)
              for status in (OK, WRONG, FALLBACK, CRASHED, HUNG, FAILED, SKIPPED)}
    return {"cases": results, "counts": counts, "device": device, "host_arch": host_arch,
            "elapsed_s": round(time.monotonic() - started, 3)}


def summary_lines(report: dict) -> list[str]:
    lines = [f"bench: {result['status']:>8}  {result['case']}: {result['detail']}" for result in report["cases"]]
    lines.append("bench: " + ", ".join(f"{count} {status}" for status, count in report["counts"].items()) +
                 f" in {report['elapsed_s']:.1f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--site-packages", type=Path, required=True, help="site-packages holding AITER")
    parser.add_argument("--state-dir", type=Path, required=True, help="this tool's state directory on the host")
    parser.add_argument("--host-arch", required=True, help="the GPU arch the host probe saw ('none': no GPU)")
    parser.add_argument("--cases-json", type=json.loads, required=True,
                        help="the cases as a JSON list, defaults filled in (cdna2.bench.load_cases)")
    parser.add_argument("--case-timeout", type=float, help="seconds for every case, instead of each case's own")
    parser.add_argument("--device-timeout", type=float, default=DEVICE_TIMEOUT,
                        help="seconds for the device probe child (%(default)g)")
    parser.add_argument("--skip-unapplied-patch-sets", action="store_true",
                        help="skip the cases needing a patch set the deployed state in --state-dir lacks (where the "
                             "controller cannot read that state: inside an image's runtime)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on one line")
    args = parser.parse_args(argv)
    if args.skip_unapplied_patch_sets:
        args.cases_json = host_cases(args.cases_json, read_state(args.state_dir).get("deployed"))
    report = run_bench(args.site_packages, args.state_dir, None if args.host_arch == "none" else args.host_arch,
                       args.cases_json, args.device_timeout, args.case_timeout)
    print(json.dumps(report, sort_keys=True) if args.json else json.dumps(report, indent=2, sort_keys=True))
    print("\n".join(summary_lines(report)), file=sys.stderr)
    return 1 if any(report["counts"][status] for status in PROBLEMS) else 0


if __name__ == "__main__":
    sys.exit(main())

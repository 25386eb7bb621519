"""The GPU half of the benchmarks: one case per process, its output checked against a reference before anything is
timed, then the ASM path and its fallback timed the same way.

Started by ``cdna2.host.bench`` as a child (``python -I -c <bootstrap> bench_gpu run CASE_JSON``), in a fresh
process per case for the reason the smoke test gives (AITER prints a code object's load line only the first time
a process loads it); torch and aiter are imported here, inside functions, and only in this child. The inputs, the
NaN prefill, the references and the pass rule are the smoke test's (``cdna2.host.smoke_gpu``), so a figure is only
ever reported for output that would pass the smoke test.

Per case: the ASM (or CK) call once into NaN-filled memory, judged against a reference in fp32 (fp64 for GEMM); only
when it passes, the fallback once (torch SDPA for prefill, AITER's HIP ``paged_attention_rocm`` for decode, torch's
bf16 GEMM for INT8 GEMM), judged the same way; only when both pass, ``warmup`` untimed calls and ``repeats`` timed
calls of each, each call between two device events (``torch.cuda.Event``): device time, not host time. Nothing is
timed for output that is wrong.

Prints one JSON object on stdout (its last line) and exits 0 when it could report; the parent judges the result.
Unproven without an MI210: every figure, and the fallbacks' own errors against the pass rule on the device.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path
from typing import Callable

from cdna2.host.cli import finish
from cdna2.host.smoke_gpu import (CAPTURED_TAIL, DEVICE, LOAD_LINE_MARKERS, SEED, PagedInputs, VarlenInputs, _nan,
                                  _same_memory, _synchronize, captured_fds, compare, in_nan_pool, nan_pool, passes,
                                  prefill_inputs, prefill_reference, provenance)

# Lines of a case's captured output the parent parses for proof: kernel-load lines, and AITER's JIT module imports
# ("[aiter] import [module_gemm_a8w8] under <path>", logged to stderr at INFO by aiter/jit/core.py) for CK kernels,
# which are compiled into a module rather than loaded as code objects.
PROOF_MARKERS = (*LOAD_LINE_MARKERS, "import [")


def time_calls(torch, call: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """Milliseconds of device time of each of ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    _synchronize(torch)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def judged_then_timed(torch, case: dict, asm: Callable, fallback: Callable, reference, value_max: float,
                      asm_prefilled: Callable[[], tuple[object, bool]]) -> dict:
    """The common order: the ASM output judged (NaN-prefilled), then the fallback's, then both timed.

    ``asm_prefilled`` makes the judged ASM call and says whether its output lies in NaN-filled memory; ``asm`` and
    ``fallback`` make one call each for the timing (and ``fallback`` once for its judging).
    """
    out, prefilled = asm_prefilled()
    _synchronize(torch)
    result: dict = {"asm": {**compare(reference, out, value_max), "prefilled": prefilled}}
    if not (prefilled and passes(result["asm"])):
        return result  # wrong, or not provably written: nothing is timed
    fallback_out = fallback()
    _synchronize(torch)
    result["fallback"] = compare(reference, fallback_out, value_max)
    if not passes(result["fallback"]):
        return result
    result["asm_ms"] = time_calls(torch, asm, case["warmup"], case["repeats"])
    result["fallback_ms"] = time_calls(torch, fallback, case["warmup"], case["repeats"])
    return result


def prefill(case: dict) -> dict:
    """Batched prefill: ``aiter.flash_attn_func`` (fmha_v3_fwd) against torch's SDPA in bf16."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    q, k, v = prefill_inputs(torch, case["batch"], case["seqlen"], case["heads_q"], case["heads_kv"],
                             case["head_dim"])
    causal = case["causal"]

    def asm():
        return aiter.flash_attn_func(q, k, v, causal=causal)

    def asm_prefilled():
        with nan_pool(torch, tuple(q.shape)) as ranges:
            out = asm()
        return out, in_nan_pool(out, ranges)

    def fallback():
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True).transpose(1, 2)

    return judged_then_timed(torch, case, asm, fallback, prefill_reference(torch, q, k, v, causal),
                             float(v.abs().max()), asm_prefilled)


def prefill_varlen(case: dict) -> dict:
    """Causal varlen prefill: ``aiter.flash_attn_varlen_func`` (group-mode fmha_v3_fwd) against torch's SDPA run
    sequence by sequence in bf16."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    inputs = VarlenInputs(torch, case["lengths"], case["heads_q"], case["heads_kv"], case["head_dim"])

    def asm_prefilled():
        prefilled_out = _nan(torch, inputs.out_shape())
        out = inputs.flash_attn_varlen(aiter, prefilled_out, None)
        return out, _same_memory(out, prefilled_out)

    def fallback():
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        ).transpose(1, 2)[0] for q, k, v in inputs.sequences()])

    return judged_then_timed(torch, case, lambda: inputs.flash_attn_varlen(aiter, None, None), fallback,
                             inputs.reference(torch, None), float(inputs.v.abs().max()), asm_prefilled)


def decode(case: dict) -> dict:
    """Paged decode: ``aiter.pa_fwd_asm`` against AITER's HIP kernel ``paged_attention_rocm`` (V in vLLM's layout
    ``[blocks, kv_heads, dim, block]``, the K layout both share, 256-token partitions)."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    context = case.get("contexts") or [case["context"]] * case["batch"]
    inputs = PagedInputs(torch, context, case["heads_q"], case["heads_kv"], case["head_dim"], case["block"])
    partitions = -(-max(context) // 256)
    seqs, heads, dim = inputs.out_shape()
    v_hip = inputs.values.permute(0, 1, 3, 2).contiguous()
    exp_sums = torch.empty(seqs, heads, partitions, dtype=torch.float32, device="cuda")
    max_logits = torch.empty(seqs, heads, partitions, dtype=torch.float32, device="cuda")
    tmp_out = torch.empty(seqs, heads, partitions, dim, dtype=torch.bfloat16, device="cuda")
    scale_one = torch.tensor([1.0], dtype=torch.float32, device="cuda")
    hip_out = _nan(torch, (seqs, heads, dim))  # NaN for the judged (first) call: unwritten elements show

    def asm_prefilled():
        prefilled_out = _nan(torch, inputs.out_shape())
        out = inputs.pa_fwd_asm(aiter, prefilled_out)
        return out, _same_memory(out, prefilled_out)

    def fallback():
        aiter.paged_attention_rocm(hip_out, exp_sums, max_logits, tmp_out, inputs.query, inputs.k_cache, v_hip,
                                   inputs.heads_kv, dim ** -0.5, inputs.block_tables, inputs.context_lens,
                                   inputs.block, max(context), None, "auto", scale_one, scale_one)
        return hip_out

    return judged_then_timed(torch, case, lambda: inputs.pa_fwd_asm(aiter, None), fallback, inputs.reference(torch),
                             float(inputs.values.abs().max()), asm_prefilled)


def gemm_int8(case: dict) -> dict:
    """INT8 GEMM with per-row and per-column fp32 scales, bf16 out: AITER's CK ``gemm_a8w8_CK`` against torch's bf16
    GEMM of the same operands (int8 values are exact in bf16), scaled after it.

    The reference is exact: fp64 products of the int8 operands, then the scales. The scales lie in [2**-10, 2**-9]
    (the reference project's in-range case), so outputs are of order one. ``value_max`` is max|ref|: the fallback
    rounds twice (its GEMM's bf16 output, then the scaled result), each within U * |ref|.
    """
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator().manual_seed(SEED)
    m, n, k = case["m"], case["n"], case["k"]
    x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=generator).to(DEVICE)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator).to(DEVICE)
    x_scale = torch.empty((m, 1), dtype=torch.float32).uniform_(2 ** -10, 2 ** -9, generator=generator).to(DEVICE)
    w_scale = torch.empty((1, n), dtype=torch.float32).uniform_(2 ** -10, 2 ** -9, generator=generator).to(DEVICE)
    reference = (x.double() @ w.double().T) * x_scale.double() * w_scale.double()
    x_bf16, w_bf16 = x.to(torch.bfloat16), w.to(torch.bfloat16)

    def asm():
        return aiter.gemm_a8w8_CK(x, w, x_scale, w_scale, None, torch.bfloat16)

    def asm_prefilled():
        with nan_pool(torch, (m, n)) as ranges:
            out = asm()
        return out, in_nan_pool(out, ranges)

    def fallback():
        return (torch.mm(x_bf16, w_bf16.t()).float() * x_scale * w_scale).to(torch.bfloat16)

    return judged_then_timed(torch, case, asm, fallback, reference, float(reference.abs().max()), asm_prefilled)


KINDS: dict[str, Callable[[dict], dict]] = {"prefill": prefill, "prefill_varlen": prefill_varlen, "decode": decode,
                                            "gemm_int8": gemm_int8}


def run_case(case: dict, capture_file: Path | None = None) -> dict:
    """Run one case with fds 1 and 2 captured (into ``capture_file`` if given); an exception is reported, not raised."""
    result: dict = {"case": case["name"], "error": None}
    with captured_fds(capture_file) as captured:
        try:
            result.update(provenance())
            result.update(KINDS[case["kind"]](case))
        except Exception as error:  # the parent reports it as a failed case, with the traceback's last lines
            result["error"] = f"{type(error).__name__}: {error}"
            result["traceback"] = traceback.format_exc()[-2000:]
    result["captured"] = "\n".join(line for line in captured.text.splitlines()
                                   if any(marker in line for marker in PROOF_MARKERS))
    result["captured_tail"] = captured.text[-CAPTURED_TAIL:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.bench_gpu", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run one case (JSON, as cdna2.host.bench passes it)")
    run_parser.add_argument("case", type=json.loads, help="the case as JSON, defaults filled in")
    run_parser.add_argument("--capture-file", type=Path, help="keep the captured fd 1/2 output in this file")
    args = parser.parse_args(argv)
    return finish("bench_gpu run", run_case(args.case, args.capture_file))


if __name__ == "__main__":
    sys.exit(main())

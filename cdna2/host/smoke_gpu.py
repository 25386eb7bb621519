"""The GPU half of the smoke test: runs AITER's ASM attention kernels against a torch reference, one case per process.

Started by ``cdna2.host.smoke`` as a child (``python -B -m cdna2.host.smoke_gpu device|run CASE``), never imported
by it for torch: torch and aiter are imported here, inside functions, and only in this child, so a host without
them still runs the static checks. Each case runs in a fresh process because AITER prints a code object's load
line only the first time the process loads it.

Why file descriptors: AITER's C++ loader writes its load line (``[aiter] hipModuleLoad: <path> GetFunction: ...``
in amd-aiter 0.1.7.post2.dev18, ``[aiter] LoadKernel: <symbol> hsaco: <path>`` with ``AITER_LOG_LEVEL=info`` in
later AITER) with ``std::cout`` straight to fd 1; Python's ``sys.stdout`` never sees it. ``captured_fds`` points
fds 1 and 2 at a temporary file with ``os.dup2`` around the kernel call and restores them afterwards.

Prints one JSON object on stdout (its last line) and exits 0 when it could report; the parent judges the result.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import math
import os
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from cdna2.host.cli import finish

# Pass rule of AITER's gfx90a kernel tests (field-notes §6.1): rel_rms < 0.02 and more than 99% of the elements
# within atol = rtol = 2e-2 of the fp32 reference.
REL_RMS_LIMIT = 0.02
CLOSE_PERCENT_MIN = 99.0
CLOSE_TOLERANCE = 2e-2
SEED = 0
# Lines of a case's captured output the parent parses for load proof (the rest is HIP/torch noise); the tail is
# kept too, for errors.
LOAD_LINE_MARKERS = ("LoadKernel", "hipModuleLoad")
CAPTURED_TAIL = 2000


class CapturedOutput:
    """What reached fds 1 and 2 inside ``captured_fds``; ``text`` is filled when the block ends."""

    def __init__(self) -> None:
        self.text = ""


def _flush_all_output() -> None:
    """Flush Python's and C stdio's buffers, so nothing written before a dup2 lands after it (or vice versa)."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C++ std::cout is synced with C stdio, which buffers when fd 1 is a file


@contextmanager
def captured_fds(sink_path: Path | None = None) -> Iterator[CapturedOutput]:
    """Send everything written to fds 1 and 2, by this process or any child it starts, to a file.

    With ``sink_path`` the file stays behind, so a parent can still read it when this process dies inside the
    block (AITER's HIP_CALL calls exit(0) on a HIP error, a bad code object can crash the process).
    """
    captured = CapturedOutput()
    _flush_all_output()
    saved = (os.dup(1), os.dup(2))
    with open(sink_path, "w+b") if sink_path else tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            _flush_all_output()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", errors="replace")


# --- device -------------------------------------------------------------------------------------------------------

def describe_device() -> dict:
    """The first GPU as a ROCm torch sees it, and why GPU checks cannot run here (``reason``), if they cannot."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as error:
        return {"device": None, "reason": f"no torch ({type(error).__name__}: {error})"}
    if not torch.version.hip:
        return {"device": None, "reason": f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"}
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return {"device": None, "reason": f"no device (torch {torch.__version__}, HIP {torch.version.hip} sees no GPU)"}
    properties = torch.cuda.get_device_properties(0)
    arch = properties.gcnArchName
    device = {"name": properties.name, "arch": arch, "compute_units": properties.multi_processor_count,
              "count": torch.cuda.device_count(), "torch": torch.__version__, "hip": torch.version.hip}
    reason = None if arch.startswith("gfx90a") else f"device is {arch.split(':')[0]}"
    return {"device": device, "reason": reason}


# --- comparison with the reference -------------------------------------------------------------------------------

def compare(reference, result) -> dict:
    """rel_rms = sqrt(mean((ref - got)^2)) / max|ref|, the share of elements within tolerance, and finiteness."""
    torch = importlib.import_module("torch")
    expected, got = reference.float(), result.float()
    finite = bool(torch.isfinite(got).all())
    scale = float(expected.abs().max()) or 1.0
    rel_rms = float(((expected - got) ** 2).mean().sqrt()) / scale
    close = torch.isclose(got, expected, atol=CLOSE_TOLERANCE, rtol=CLOSE_TOLERANCE).float().mean()
    return {"rel_rms": rel_rms if math.isfinite(rel_rms) else None, "close_percent": float(close) * 100.0,
            "finite": finite}


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    """Run ``call`` twice (the first loads and may JIT-build); return the second result and its time in ms."""
    torch = importlib.import_module("torch")
    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1000.0


def _uniform(torch, shape: tuple[int, ...], generator) -> object:
    return torch.empty(shape, dtype=torch.bfloat16, device="cuda").uniform_(-1.0, 1.0, generator=generator)


def _sdpa_reference(torch, q, k, v, mask):
    """fp32 attention over ``[batch, seq, heads, dim]`` tensors; GQA by repeating KV heads; ``mask`` True = keep."""
    group = q.shape[2] // k.shape[2]
    q32, k32, v32 = (x.float().transpose(1, 2) for x in (q, k, v))
    k32, v32 = k32.repeat_interleave(group, dim=1), v32.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask).transpose(1, 2)


def _window_mask(torch, length: int, window: int | None):
    """True where query i may see key j: everything (``window`` None), or causal with j > i - window."""
    rows = torch.arange(length, device="cuda")
    if window is None:
        return torch.ones(length, length, dtype=torch.bool, device="cuda")
    return (rows[None, :] <= rows[:, None]) & (rows[:, None] - rows[None, :] < window)


# --- the cases ----------------------------------------------------------------------------------------------------

def fmha_v3_fwd(causal: bool) -> Callable[[], dict]:
    """Batched prefill through ``aiter.flash_attn_func``: bf16, head_dim 128, GQA 8 (16 query, 2 KV heads).

    seqlen 512 because AITER 0.1.7.post2.dev18 sends seqlen_q <= 128 to CK ("Prefer CK for decode cases").
    """
    def run() -> dict:
        torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
        generator = torch.Generator(device="cuda").manual_seed(SEED)
        batch, seqlen, heads_q, heads_kv, dim = 2, 512, 16, 2, 128
        q = _uniform(torch, (batch, seqlen, heads_q, dim), generator)
        k = _uniform(torch, (batch, seqlen, heads_kv, dim), generator)
        v = _uniform(torch, (batch, seqlen, heads_kv, dim), generator)
        out, elapsed = _timed(lambda: aiter.flash_attn_func(q, k, v, causal=causal))
        reference = _sdpa_reference(torch, q, k, v, _window_mask(torch, seqlen, seqlen if causal else None))
        return {**compare(reference, out), "elapsed_ms": elapsed}
    return run


def pa_fwd_asm() -> dict:
    """Paged decode through ``aiter.pa_fwd_asm``: bf16, block 16, GQA 8 (32 query, 4 KV heads), head_dim 128.

    Caches in the layouts ``aiter_meta/csrc/py_itfs_cu/asm_pa.cu`` documents: K ``[blocks, kv_heads, dim/x, block,
    x]``, V ``[blocks, kv_heads, block/x, dim, x]``, x = 16 bytes / element size.
    """
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator(device="cuda").manual_seed(SEED)
    heads_q, heads_kv, dim, block = 32, 4, 128, 16
    x = 16 // torch.empty((), dtype=torch.bfloat16).element_size()
    context = [16, 57, 129, 257, 500, 1024, 33, 700]  # partial and full last blocks, one to many blocks
    blocks_per_seq = max(-(-length // block) for length in context)
    num_blocks = len(context) * blocks_per_seq
    query = _uniform(torch, (len(context), heads_q, dim), generator)
    keys = _uniform(torch, (num_blocks, heads_kv, block, dim), generator)
    values = _uniform(torch, (num_blocks, heads_kv, block, dim), generator)
    k_cache = keys.view(num_blocks, heads_kv, block, dim // x, x).permute(0, 1, 3, 2, 4).contiguous()
    v_cache = values.view(num_blocks, heads_kv, block // x, x, dim).permute(0, 1, 2, 4, 3).contiguous()
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(SEED)).to(torch.int32)
    block_tables = order.view(len(context), blocks_per_seq).cuda()
    context_lens = torch.tensor(context, dtype=torch.int32, device="cuda")
    out, elapsed = _timed(lambda: aiter.pa_fwd_asm(query, k_cache, v_cache, block_tables, context_lens,
                                                   block_tables.stride(0)))
    reference = torch.empty(len(context), heads_q, dim, dtype=torch.float32, device="cuda")
    for seq, length in enumerate(context):
        table = block_tables[seq].long()
        seq_keys = keys[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].float()
        seq_values = values[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].float()
        seq_keys = seq_keys.repeat_interleave(heads_q // heads_kv, dim=0)
        seq_values = seq_values.repeat_interleave(heads_q // heads_kv, dim=0)
        scores = torch.einsum("hd,hld->hl", query[seq].float(), seq_keys) / math.sqrt(dim)
        reference[seq] = torch.einsum("hl,hld->hd", scores.softmax(dim=-1), seq_values)
    return {**compare(reference, out), "elapsed_ms": elapsed}


def sliding_window() -> dict:
    """Causal sliding-window prefill through ``aiter.flash_attn_varlen_func``, the entry vLLM's ROCM_AITER_FA uses.

    Guards field-notes §7.1: ROCM_AITER_FA produced garbage on sliding-window layers with no error. Two sequences,
    one shorter and one much longer than the 256-token window, so an ignored window changes the result.
    """
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator(device="cuda").manual_seed(SEED)
    lengths, heads_q, heads_kv, dim, window = [200, 1000], 16, 2, 128, 256
    total = sum(lengths)
    q = _uniform(torch, (total, heads_q, dim), generator)
    k = _uniform(torch, (total, heads_kv, dim), generator)
    v = _uniform(torch, (total, heads_kv, dim), generator)
    cu_seqlens = torch.tensor([0, lengths[0], total], dtype=torch.int32, device="cuda")
    out, elapsed = _timed(lambda: aiter.flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True, window_size=(window - 1, 0)))
    pieces = []
    for start, length in zip((0, lengths[0]), lengths):
        part = slice(start, start + length)
        pieces.append(_sdpa_reference(torch, q[None, part], k[None, part], v[None, part],
                                      _window_mask(torch, length, window))[0])
    return {**compare(torch.cat(pieces), out), "elapsed_ms": elapsed}


# Case name -> the function computing it. cdna2.host.smoke names the checks and judges the results.
CASES: dict[str, Callable[[], dict]] = {
    "fmha_v3_fwd_noncausal": fmha_v3_fwd(causal=False),
    "fmha_v3_fwd_causal": fmha_v3_fwd(causal=True),
    "pa_fwd_asm": pa_fwd_asm,
    "sliding_window": sliding_window,
}


def run_case(name: str, capture_file: Path | None = None) -> dict:
    """Run one case with fds 1 and 2 captured (into ``capture_file`` if given); an exception is reported, not raised."""
    result: dict = {"case": name, "error": None}
    with captured_fds(capture_file) as captured:
        try:
            result.update(CASES[name]())
        except Exception as error:  # the parent reports it as a failed check, with the traceback's last lines
            result["error"] = f"{type(error).__name__}: {error}"
            result["traceback"] = traceback.format_exc()[-2000:]
    load_lines = [line for line in captured.text.splitlines() if any(m in line for m in LOAD_LINE_MARKERS)]
    result["captured"] = "\n".join(load_lines)
    result["captured_tail"] = captured.text[-CAPTURED_TAIL:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.smoke_gpu", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("device", help="describe the first GPU torch sees")
    run_parser = commands.add_parser("run", help="run one case against its torch reference")
    run_parser.add_argument("case", choices=sorted(CASES))
    run_parser.add_argument("--capture-file", type=Path, help="keep the captured fd 1/2 output in this file")
    args = parser.parse_args(argv)
    return finish(f"smoke_gpu {args.command}",
                  describe_device() if args.command == "device" else run_case(args.case, args.capture_file))


if __name__ == "__main__":
    sys.exit(main())

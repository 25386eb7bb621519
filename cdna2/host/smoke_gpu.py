"""The GPU half of the smoke test: runs AITER's ASM kernels and Triton GEMM against torch references, one case each.

Started by ``cdna2.host.smoke`` as a child (``python -I -c <bootstrap> device|warmup|run CASE``), never imported
by it for torch: torch and aiter are imported here, inside functions, and only in this child, so a host without
them still runs the static checks. Each case runs in a fresh process because AITER prints a code object's load
line only the first time the process loads it; ``warmup`` runs every case once first, so the JIT builds and first
loads happen under their own (generous) time limit and each case's own limit can stay short.

Why file descriptors: AITER's C++ loader writes its load line (``[aiter] hipModuleLoad: <path> GetFunction: ...``
in amd-aiter 0.1.7.post2.dev18, ``[aiter] LoadKernel: <symbol> hsaco: <path>`` with ``AITER_LOG_LEVEL=info`` in
later AITER) with ``std::cout`` straight to fd 1; Python's ``sys.stdout`` never sees it. ``captured_fds`` points
fds 1 and 2 at a temporary file with ``os.dup2`` around the kernel call and restores them afterwards.

Every output is NaN before the kernel runs (passed as ``out=`` where AITER takes one; for ``flash_attn_func``,
which allocates its own, the freed NaN-filled blocks of the caching allocator it draws from), so an element the
kernel never wrote stays NaN and fails: "wrote nothing" is never mistaken for stale memory. The run proves it:
``prefilled`` says the output lies in NaN-filled memory.

Prints one JSON object on stdout (its last line) and exits 0 when it could report; the parent judges the result.

Unproven without an MI210 (the tests run this on CPU torch with test doubles of AITER and of the device): that
AITER's batched output really lands in the caching allocator's freed NaN-filled blocks (if it does not, the case
fails and says so), that the real kernels' errors sit inside the pass rule with the margin the arithmetic above
predicts, the load lines AITER's C++ prints on the device, and every timing.
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

# The pass rule. Inputs are bf16 uniform(-1, 1), the reference is fp32 attention over the same bf16 inputs, so the
# error a correct kernel may make is bf16 arithmetic's: U = 2**-8, the unit roundoff of bf16 (8 significand bits).
# (AITER's own gfx90a tests divide the RMS error by max|ref| and accept 1% of the elements off by 2e-2; in the
# causal case max|ref| is 1.0 against an RMS of 0.07, and 2e-2 is the size of a typical output, so rows left
# unwritten, ignored keys and outputs 5% off all passed: issue 14.)
BF16_UNIT_ROUNDOFF = 2.0 ** -8
# Every element: |got - ref| <= ATOL * max|v| + RTOL * |ref|. RTOL = 2U: the output's own rounding to bf16 is at
# most U * |ref|. ATOL = U: the kernel rounds the softmax weights to bf16 before multiplying by V, at most U/2 of
# each weight, so at most U/2 * max|v| in the output; twice that.
RTOL = 2 * BF16_UNIT_ROUNDOFF
ATOL = BF16_UNIT_ROUNDOFF
# Every row (one query position of one head, head_dim elements): rms(got - ref) / rms(ref) <= 4U (1.6e-2). Output
# rounding alone gives about U/sqrt(3) = 2.3e-3, the weights' rounding adds as much where a row's terms cancel; the
# MI210 measurements (the reference project's: rel_rms 4.8e-5..7.8e-4 of max|ref|) are 2e-3..5e-3 of rms(ref).
ROW_REL_RMS_LIMIT = 4 * BF16_UNIT_ROUNDOFF
SEED = 0
DEVICE = "cuda"  # ROCm torch names HIP devices "cuda"
# The batched output is allocated by AITER itself: this many freed NaN-filled blocks of its size wait for it in
# torch's caching allocator (more than one, in case AITER allocates a temporary of that size first).
NAN_BLOCKS = 4
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
        visible = os.environ.get("HIP_VISIBLE_DEVICES")
        return {"device": None, "reason": f"no device (torch {torch.__version__}, HIP {torch.version.hip} sees no GPU"
                                          f"{'; HIP_VISIBLE_DEVICES=' + visible if visible is not None else ''}; "
                                          f"check /dev/kfd and /dev/dri permissions)"}
    properties = torch.cuda.get_device_properties(0)
    arch = properties.gcnArchName
    device = {"name": properties.name, "arch": arch, "compute_units": properties.multi_processor_count,
              "count": torch.cuda.device_count(), "torch": torch.__version__, "hip": torch.version.hip}
    reason = None if arch.startswith("gfx90a") else f"device is {arch.split(':')[0]}"
    return {"device": device, "reason": reason}


def provenance() -> dict:
    """Which AITER this process imported and which kernel directory it set (the parent checks both)."""
    aiter = importlib.import_module("aiter")
    return {"aiter_file": getattr(aiter, "__file__", None), "aiter_asm_dir": os.environ.get("AITER_ASM_DIR")}


# --- comparison with the reference -------------------------------------------------------------------------------

# Bounds of the cases whose output is not bf16 attention, by what a correct kernel's arithmetic may add (U: unit
# roundoff of the output or intermediate dtype). fp16 MoE (U = 2**-11): the activations are rounded to fp16 between
# the two GEMMs, U/2 of each, which the second GEMM sums over inter_dim terms of either sign: ATOL 4U of max|ref|.
# fp32 results (GEMM accumulation, softmax): a correct fp32 sum of K products is off by about sqrt(K) * 2**-24 of
# sum |a||b| (the GEMM's value_max), well inside ATOL 2**-16; rows within 2**-16 too.
FP16_UNIT_ROUNDOFF, FP32_UNIT_ROUNDOFF = 2.0 ** -11, 2.0 ** -24
BF16_BOUNDS = {"atol": ATOL, "rtol": RTOL, "row_limit": ROW_REL_RMS_LIMIT}
FP16_MOE_BOUNDS = {"atol": 4 * FP16_UNIT_ROUNDOFF, "rtol": 2 * FP16_UNIT_ROUNDOFF, "row_limit": 4 * FP16_UNIT_ROUNDOFF}
FP32_BOUNDS = {"atol": 2.0 ** -16, "rtol": 2.0 ** -16, "row_limit": 2.0 ** -16}


def compare(reference, result, value_max: float, bounds: dict | None = None) -> dict:
    """The pass rule's figures for ``result`` against ``reference`` (rows along the last dimension).

    ``bad_elements`` counts elements outside atol * value_max + rtol * |ref| (NaN counts: never written; ``bounds``,
    default the bf16 attention ones: ATOL, RTOL, ROW_REL_RMS_LIMIT), ``worst_row_rel_rms`` is the largest
    rms(got - ref) / rms(ref) over rows, ``rel_rms`` the same over everything, ``first_bad_element`` the first
    element outside its bound (when there is one); ``bounds`` are returned with them.
    """
    torch = importlib.import_module("torch")
    bounds = bounds or BF16_BOUNDS
    expected = reference.float().reshape(-1, reference.shape[-1])
    got = result.float().reshape(-1, result.shape[-1])
    error = got - expected
    within = error.abs() <= bounds["atol"] * value_max + bounds["rtol"] * expected.abs()  # False for NaN
    rows = (error ** 2).mean(dim=1).sqrt() / (expected ** 2).mean(dim=1).sqrt().clamp_min(1e-30)
    rows = torch.where(torch.isfinite(rows), rows, torch.full_like(rows, math.inf))
    worst_row = int(rows.argmax())
    first_bad = int((~within).float().argmax()) if not bool(within.all()) else None
    rel_rms = float((error ** 2).mean().sqrt()) / max(float((expected ** 2).mean().sqrt()), 1e-30)
    figures = {"elements": within.numel(), "bad_elements": int((~within).sum()),
               "unwritten": int(torch.isnan(got).sum()), "worst_row_rel_rms": float(rows[worst_row]),
               "worst_row": worst_row, "rel_rms": rel_rms if math.isfinite(rel_rms) else None, "bounds": bounds}
    if first_bad is not None:
        flat_got, flat_expected = got.reshape(-1), expected.reshape(-1)
        figures["first_bad_element"] = {"index": first_bad, "got": float(flat_got[first_bad]),
                                        "ref": float(flat_expected[first_bad])}
    return figures


def passes(figures: dict) -> bool:
    """The pass rule: every element within its bound and every row's relative RMS error within the limit."""
    return figures["bad_elements"] == 0 and figures["worst_row_rel_rms"] <= bounds_of(figures)["row_limit"]


def bounds_of(figures: dict) -> dict:
    """The bounds the figures were judged against (compare's default: bf16 attention's)."""
    return figures.get("bounds") or BF16_BOUNDS


def merged(*parts: dict) -> dict:
    """The figures of several outputs of one call judged together, each part against its own bounds: counts summed,
    the worst row (relative to its part's limit) with that part's bounds, the first bad element of the first part
    that has one."""
    worst = max(parts, key=lambda part: part["worst_row_rel_rms"] / bounds_of(part)["row_limit"])
    first_bad = next((part for part in parts if part["bad_elements"]), None)
    figures = {**worst, "elements": sum(p["elements"] for p in parts),
               "bad_elements": sum(p["bad_elements"] for p in parts), "unwritten": sum(p["unwritten"] for p in parts)}
    figures.pop("first_bad_element", None)
    if first_bad is not None:
        figures["first_bad_element"] = first_bad["first_bad_element"]
    return figures


def _synchronize(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(call: Callable[[], object], torch) -> float:
    """Milliseconds of one more call (after the judged one, so loading and JIT building are not in it)."""
    _synchronize(torch)
    start = time.perf_counter()
    call()
    _synchronize(torch)
    return (time.perf_counter() - start) * 1000.0


def _uniform(torch, shape: tuple[int, ...], generator) -> object:
    """bf16 uniform(-1, 1) drawn on the CPU from a seeded generator (the same on every host), then on the GPU."""
    return torch.empty(shape, dtype=torch.bfloat16).uniform_(-1.0, 1.0, generator=generator).to(DEVICE)


def _nan(torch, shape: tuple[int, ...]) -> object:
    return torch.full(shape, math.nan, dtype=torch.bfloat16, device=DEVICE)


def _same_memory(out, prefilled) -> bool:
    return out.data_ptr() == prefilled.data_ptr() and out.shape == prefilled.shape


@contextmanager
def nan_pool(torch, shape: tuple[int, ...]) -> Iterator[list[tuple[int, int]]]:
    """Leave NAN_BLOCKS freed NaN-filled blocks of a bf16 ``shape`` in the caching allocator; yield their ranges."""
    blocks = [_nan(torch, shape) for _ in range(NAN_BLOCKS)]
    _synchronize(torch)
    ranges = [(block.data_ptr(), block.data_ptr() + block.numel() * block.element_size()) for block in blocks]
    del blocks
    yield ranges


def in_nan_pool(out, ranges: list[tuple[int, int]]) -> bool:
    """Whether ``out`` lies inside NaN-filled memory (adjacent blocks count as one range)."""
    start, end = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return any(low <= start and end <= high for low, high in merged)


def _sdpa_reference(torch, q, k, v, mask):
    """fp32 attention over ``[batch, seq, heads, dim]`` tensors; GQA by repeating KV heads; ``mask`` True = keep."""
    group = q.shape[2] // k.shape[2]
    q32, k32, v32 = (x.float().transpose(1, 2) for x in (q, k, v))
    k32, v32 = k32.repeat_interleave(group, dim=1), v32.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask).transpose(1, 2)


def _window_mask(torch, length: int, window: int | None):
    """True where query i may see key j: everything (``window`` None), or causal with j > i - window."""
    rows = torch.arange(length, device=DEVICE)
    if window is None:
        return torch.ones(length, length, dtype=torch.bool, device=DEVICE)
    return (rows[None, :] <= rows[:, None]) & (rows[:, None] - rows[None, :] < window)


# --- the cases ----------------------------------------------------------------------------------------------------
# Each returns the pass rule's figures, ``prefilled`` and the time of one more call.

def prefill_inputs(torch, batch: int, seqlen: int, heads_q: int, heads_kv: int, dim: int) -> tuple:
    """q, k, v ``[batch, seqlen, heads, dim]`` for batched prefill, drawn from the seeded generator."""
    generator = torch.Generator().manual_seed(SEED)
    return (_uniform(torch, (batch, seqlen, heads_q, dim), generator),
            _uniform(torch, (batch, seqlen, heads_kv, dim), generator),
            _uniform(torch, (batch, seqlen, heads_kv, dim), generator))


def prefill_reference(torch, q, k, v, causal: bool):
    """fp32 attention of batched prefill inputs, causal or not."""
    return _sdpa_reference(torch, q, k, v, _window_mask(torch, q.shape[1], q.shape[1] if causal else None))


def fmha_v3_fwd(causal: bool, batch: int, seqlen: int) -> Callable[[], dict]:
    """Batched prefill through ``aiter.flash_attn_func``: bf16, head_dim 128, GQA 8 (16 query, 2 KV heads).

    seqlen above 128 because AITER 0.1.7.post2.dev18 sends seqlen_q <= 128 to CK ("Prefer CK for decode cases");
    a seqlen that is not a multiple of 256 leaves the kernel a partial last tile of rows.
    """
    def run() -> dict:
        torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
        q, k, v = prefill_inputs(torch, batch, seqlen, 16, 2, 128)
        with nan_pool(torch, tuple(q.shape)) as ranges:
            out = aiter.flash_attn_func(q, k, v, causal=causal)
        _synchronize(torch)
        prefilled = in_nan_pool(out, ranges)
        figures = compare(prefill_reference(torch, q, k, v, causal), out, float(v.abs().max()))
        return {**figures, "prefilled": prefilled,
                "elapsed_ms": _timed(lambda: aiter.flash_attn_func(q, k, v, causal=causal), torch)}
    return run


class VarlenInputs:
    """Sequences of ``lengths`` packed along one dimension (q ``[total, heads_q, dim]``, k and v ``[total, heads_kv,
    dim]``) and their ``cu_seqlens``, drawn from the seeded generator."""

    def __init__(self, torch, lengths: list[int], heads_q: int, heads_kv: int, dim: int) -> None:
        generator = torch.Generator().manual_seed(SEED)
        self.lengths, total = lengths, sum(lengths)
        self.q = _uniform(torch, (total, heads_q, dim), generator)
        self.k = _uniform(torch, (total, heads_kv, dim), generator)
        self.v = _uniform(torch, (total, heads_kv, dim), generator)
        self.starts = [sum(lengths[:index]) for index in range(len(lengths))]
        self.cu_seqlens = torch.tensor([*self.starts, total], dtype=torch.int32, device=DEVICE)

    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    def sequences(self):
        """Each sequence's q, k and v as ``[1, length, heads, dim]``."""
        for start, length in zip(self.starts, self.lengths):
            part = slice(start, start + length)
            yield self.q[None, part], self.k[None, part], self.v[None, part]

    def reference(self, torch, window: int | None):
        """fp32 causal attention per sequence (``window``: only the last ``window`` keys), packed as q is."""
        return torch.cat([_sdpa_reference(torch, q, k, v, _window_mask(torch, q.shape[1], window or q.shape[1]))[0]
                          for q, k, v in self.sequences()])

    def flash_attn_varlen(self, aiter, out, window: int | None):
        return aiter.flash_attn_varlen_func(self.q, self.k, self.v, self.cu_seqlens, self.cu_seqlens,
                                            max(self.lengths), max(self.lengths), causal=True,
                                            window_size=(window - 1, 0) if window else (-1, -1), out=out)


def varlen(lengths: list[int], window: int | None) -> Callable[[], dict]:
    """Causal varlen prefill through ``aiter.flash_attn_varlen_func``, the entry vLLM's ROCM_AITER_FA prefill uses.

    Without a window it is AITER's group-mode ASM kernel (``fmha_v3_fwd/..._group.co``), with lengths that leave
    partial tiles. With a window it guards against what ROCM_AITER_FA did on an MI210: garbage on sliding-window
    layers with no error; one sequence shorter and one much longer than the window, so an ignored window shows.
    """
    def run() -> dict:
        torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
        inputs = VarlenInputs(torch, lengths, heads_q=16, heads_kv=2, dim=128)
        prefilled_out = _nan(torch, inputs.out_shape())
        out = inputs.flash_attn_varlen(aiter, prefilled_out, window)
        _synchronize(torch)
        figures = compare(inputs.reference(torch, window), out, float(inputs.v.abs().max()))
        return {**figures, "prefilled": _same_memory(out, prefilled_out),
                "elapsed_ms": _timed(lambda: inputs.flash_attn_varlen(aiter, _nan(torch, inputs.out_shape()), window),
                                     torch)}
    return run


class PagedInputs:
    """A paged KV cache and its queries: bf16, ``block``-token blocks in a shuffled order, one query per sequence.

    ``k_cache`` and ``v_cache`` are in the layouts ``aiter_meta/csrc/py_itfs_cu/asm_pa.cu`` documents for
    ``pa_fwd_asm``: K ``[blocks, kv_heads, dim/x, block, x]``, V ``[blocks, kv_heads, block/x, dim, x]``, x = 16 bytes
    / element size; ``keys`` and ``values`` are the same data as ``[blocks, kv_heads, block, dim]``.
    """

    def __init__(self, torch, context: list[int], heads_q: int, heads_kv: int, dim: int, block: int) -> None:
        generator = torch.Generator().manual_seed(SEED)
        x = 16 // torch.empty((), dtype=torch.bfloat16).element_size()
        self.context, self.heads_q, self.heads_kv, self.dim, self.block = context, heads_q, heads_kv, dim, block
        blocks_per_seq = max(-(-length // block) for length in context)
        num_blocks = len(context) * blocks_per_seq
        self.query = _uniform(torch, (len(context), heads_q, dim), generator)
        self.keys = _uniform(torch, (num_blocks, heads_kv, block, dim), generator)
        self.values = _uniform(torch, (num_blocks, heads_kv, block, dim), generator)
        self.k_cache = self.keys.view(num_blocks, heads_kv, block, dim // x, x).permute(0, 1, 3, 2, 4).contiguous()
        self.v_cache = self.values.view(num_blocks, heads_kv, block // x, x, dim).permute(0, 1, 2, 4, 3).contiguous()
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(SEED)).to(torch.int32)
        self.block_tables = order.view(len(context), blocks_per_seq).to(DEVICE)
        self.context_lens = torch.tensor(context, dtype=torch.int32, device=DEVICE)

    def out_shape(self) -> tuple[int, int, int]:
        return len(self.context), self.heads_q, self.dim

    def reference(self, torch):
        """fp32 decode attention over each sequence's blocks."""
        reference = torch.empty(*self.out_shape(), dtype=torch.float32, device=DEVICE)
        group, dim = self.heads_q // self.heads_kv, self.dim
        for seq, length in enumerate(self.context):
            table = self.block_tables[seq].long()
            seq_keys = self.keys[table].permute(1, 0, 2, 3).reshape(self.heads_kv, -1, dim)[:, :length].float()
            seq_values = self.values[table].permute(1, 0, 2, 3).reshape(self.heads_kv, -1, dim)[:, :length].float()
            seq_keys = seq_keys.repeat_interleave(group, dim=0)
            seq_values = seq_values.repeat_interleave(group, dim=0)
            scores = torch.einsum("hd,hld->hl", self.query[seq].float(), seq_keys) / math.sqrt(dim)
            reference[seq] = torch.einsum("hl,hld->hd", scores.softmax(dim=-1), seq_values)
        return reference

    def pa_fwd_asm(self, aiter, out):
        return aiter.pa_fwd_asm(self.query, self.k_cache, self.v_cache, self.block_tables, self.context_lens,
                                self.block_tables.stride(0), out_=out)


def pa_fwd_asm() -> dict:
    """Paged decode through ``aiter.pa_fwd_asm``: bf16, block 16, GQA 8 (32 query, 4 KV heads), head_dim 128."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    # partial and full last blocks, one to many blocks
    inputs = PagedInputs(torch, [16, 57, 129, 257, 500, 1024, 33, 700], heads_q=32, heads_kv=4, dim=128, block=16)
    prefilled_out = _nan(torch, inputs.out_shape())
    out = inputs.pa_fwd_asm(aiter, prefilled_out)
    _synchronize(torch)
    figures = compare(inputs.reference(torch), out, float(inputs.values.abs().max()))
    return {**figures, "prefilled": _same_memory(out, prefilled_out),
            "elapsed_ms": _timed(lambda: inputs.pa_fwd_asm(aiter, _nan(torch, inputs.out_shape())), torch)}


def _filled_nan(torch, shape: tuple[int, ...], dtype) -> object:
    return torch.full(shape, math.nan, dtype=dtype, device=DEVICE)


def mla_decode() -> dict:
    """MLA decode through ``aiter.mla.mla_decode_fwd``, the entry vLLM's ROCM_AITER_MLA backend calls: bf16, 16
    query heads on one latent KV head (DeepSeek's 576 = 512 + 64 rope, values the first 512), one query per sequence,
    page size 1, pages in a shuffled order, context lengths from 1 to 600 (the installed bf16 kernels:
    ``mla/mla_dec_stage1_bf16_a16w16_subQ16_mqa16.co`` for this shape)."""
    torch, mla = importlib.import_module("torch"), importlib.import_module("aiter.mla")
    generator = torch.Generator().manual_seed(SEED)
    context, heads, dim, v_dim = [1, 37, 200, 600], 16, 576, 512
    q = _uniform(torch, (len(context), heads, dim), generator)
    kv = _uniform(torch, (sum(context), 1, 1, dim), generator)
    pages = torch.randperm(sum(context), generator=torch.Generator().manual_seed(SEED)).to(torch.int32)
    indptr = [0]
    for length in context:
        indptr.append(indptr[-1] + length)
    kv_indptr = torch.tensor(indptr, dtype=torch.int32, device=DEVICE)
    qo_indptr = torch.arange(len(context) + 1, dtype=torch.int32, device=DEVICE)
    kv_indices, last_page = pages.to(DEVICE), torch.ones(len(context), dtype=torch.int32, device=DEVICE)
    scale = dim ** -0.5
    reference = torch.empty(len(context), heads, v_dim, dtype=torch.float32, device=DEVICE)
    for seq in range(len(context)):
        keys = kv[kv_indices[indptr[seq]:indptr[seq + 1]].long(), 0, 0].float()
        scores = q[seq].float() @ keys.T * scale
        reference[seq] = scores.softmax(dim=-1) @ keys[:, :v_dim]

    def call(out):
        mla.mla_decode_fwd(q, kv, out, qo_indptr, kv_indptr, kv_indices, last_page, 1, sm_scale=scale)
        return out

    prefilled_out = _nan(torch, (len(context), heads, v_dim))
    out = call(prefilled_out)
    _synchronize(torch)
    figures = compare(reference, out, float(kv[..., :v_dim].abs().max()))
    return {**figures, "prefilled": _same_memory(out, prefilled_out),
            "elapsed_ms": _timed(lambda: call(_nan(torch, (len(context), heads, v_dim))), torch)}


def topksoftmax_asm() -> dict:
    """MoE routing through ``aiter.topk_softmax_asm``: fp32 gating over 128 experts, top 8, renormalised, 97
    tokens (not a multiple of the kernels' 4 or 12 rows: a partial last tile). The weights are held to fp32's
    bounds, the expert ids must be exactly torch's (an id off is an element outside any bound)."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator().manual_seed(SEED)
    tokens, experts, topk = 97, 128, 8
    gating = torch.empty(tokens, experts, dtype=torch.float32).uniform_(-4.0, 4.0, generator=generator).to(DEVICE)
    expected_weights, expected_ids = gating.softmax(dim=-1).topk(topk, dim=-1)
    expected_weights = expected_weights / expected_weights.sum(dim=-1, keepdim=True)

    def call(weights, ids):
        aiter.topk_softmax_asm(weights, ids, torch.empty_like(ids), gating, True)
        return weights, ids

    weights, ids = call(_filled_nan(torch, (tokens, topk), torch.float32),
                        torch.full((tokens, topk), -1, dtype=torch.int32, device=DEVICE))
    _synchronize(torch)
    # The kernel's order within a row may differ from torch's: both sorted by expert id before comparing.
    ids_sorted, order = ids.long().sort(dim=-1)
    expected_sorted, expected_order = expected_ids.sort(dim=-1)
    figures = merged(compare(expected_weights.gather(1, expected_order), weights.gather(1, order), 1.0, FP32_BOUNDS),
                     compare(expected_sorted.float(), ids_sorted.float(), 0.0, {**FP32_BOUNDS, "atol": 0.0}))
    # Both outputs are this case's own buffers, NaN and -1 before the call: an element never written fails.
    return {**figures, "prefilled": True, "elapsed_ms": _timed(lambda: call(
        _filled_nan(torch, (tokens, topk), torch.float32), torch.empty(tokens, topk, dtype=torch.int32,
                                                                       device=DEVICE)), torch)}


def fmoe_g1u0_fp16() -> dict:
    """Fused MoE experts through AITER's ``asm_moe`` (``aiter.fmoe``, ``fmoe_f16.co``): fp16 tokens, 8 experts of a
    gate-only (g1u0) SiLU MLP, top 2 of seeded random routing, 517 tokens (not a multiple of the 32-row blocks; the
    output, 1 MiB, comes from the caching allocator's large pool, where the NaN-filled blocks wait), model dim 1024,
    inter dim 512, the weights shuffled as AITER's own test passes them; against AITER's torch reference in fp32."""
    torch = importlib.import_module("torch")
    asm_moe = importlib.import_module("aiter.fused_moe_bf16_asm").asm_moe
    shuffle_weight = importlib.import_module("aiter.ops.shuffle").shuffle_weight
    generator = torch.Generator().manual_seed(SEED)
    tokens, experts, topk, dim, inter = 517, 8, 2, 1024, 512

    def uniform(shape, scale):
        return (torch.empty(shape, dtype=torch.float32).uniform_(-1.0, 1.0, generator=generator) * scale).to(
            torch.float16).to(DEVICE)

    hidden = uniform((tokens, dim), 1.0)
    w1, w2 = uniform((experts, inter, dim), dim ** -0.5), uniform((experts, dim, inter), inter ** -0.5)
    scores = torch.empty(tokens, experts).uniform_(0.0, 1.0, generator=generator).to(DEVICE)
    topk_weights, topk_ids = scores.softmax(dim=-1).topk(topk, dim=-1)
    topk_ids = topk_ids.to(torch.int32)
    reference = torch.zeros(tokens, dim, dtype=torch.float32, device=DEVICE)
    for slot in range(topk):
        for expert in range(experts):
            rows = topk_ids[:, slot] == expert
            if bool(rows.any()):
                act = torch.nn.functional.silu(hidden[rows].float() @ w1[expert].float().T)
                reference[rows] += (act @ w2[expert].float().T) * topk_weights[rows, slot:slot + 1]
    w1b, w2b = shuffle_weight(w1), shuffle_weight(w2)

    def call():
        return asm_moe(hidden, w1b, w2b, topk_weights, topk_ids)

    with nan_pool(torch, (tokens, dim)) as ranges:  # AITER allocates the output (moe_buf) itself
        out = call()
    _synchronize(torch)
    figures = compare(reference, out, float(reference.abs().max()), FP16_MOE_BOUNDS)
    return {**figures, "prefilled": in_nan_pool(out, ranges), "elapsed_ms": _timed(call, torch)}


def bf16gemm_asm() -> dict:
    """bf16 GEMM with fp32 output through ``aiter.gemm_a16w16_asm`` (``bf16gemm/bf16gemm_outf32_tn_*.co``):
    M 150 (a partial last tile for every installed tile height), N 256, K 5120, the B operand [N, K] unshuffled, as
    AITER's own test calls it (K and N multiples of 64)."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator().manual_seed(SEED)
    m, n, k = 150, 256, 5120
    a, b = _uniform(torch, (m, k), generator), _uniform(torch, (n, k), generator)
    reference = a.float() @ b.float().T
    magnitude = float((a.float().abs() @ b.float().abs().T).max())  # sum |a||b|: what fp32 accumulation scales with

    def call(out):
        return aiter.gemm_a16w16_asm(a, b, out)

    prefilled_out = _filled_nan(torch, (m, n), torch.float32)
    out = call(prefilled_out)
    _synchronize(torch)
    figures = compare(reference, out, magnitude, FP32_BOUNDS)
    return {**figures, "prefilled": _same_memory(out, prefilled_out),
            "elapsed_ms": _timed(lambda: call(_filled_nan(torch, (m, n), torch.float32)), torch)}


def layernorm2d_with_add_asm() -> dict:
    """Residual add and LayerNorm through ``aiter.layernorm2d_with_add_asm`` (``layer_norm.co``): bf16, 67 rows of
    8192 (AITER's own test's width), both outputs (the normalised rows and the residual sum) held to bf16's bounds."""
    torch, aiter = importlib.import_module("torch"), importlib.import_module("aiter")
    generator = torch.Generator().manual_seed(SEED)
    rows, width, eps = 67, 8192, 1e-5
    x, residual = _uniform(torch, (rows, width), generator), _uniform(torch, (rows, width), generator)
    weight, bias = _uniform(torch, (width,), generator), _uniform(torch, (width,), generator)
    summed = x.float() + residual.float()
    reference = torch.nn.functional.layer_norm(summed, (width,), weight.float(), bias.float(), eps)

    def call(out, residual_out):
        aiter.layernorm2d_with_add_asm(out, x, residual, residual_out, weight, bias, eps)
        return out, residual_out

    prefilled = (_nan(torch, (rows, width)), _nan(torch, (rows, width)))
    out, residual_out = call(*prefilled)
    _synchronize(torch)
    figures = merged(compare(reference, out, float(reference.abs().max())),
                     compare(summed, residual_out, float(summed.abs().max())))
    return {**figures, "prefilled": _same_memory(out, prefilled[0]) and _same_memory(residual_out, prefilled[1]),
            "elapsed_ms": _timed(lambda: call(_nan(torch, (rows, width)), _nan(torch, (rows, width))), torch)}


# The module vLLM's rocm_unquantized_gemm imports AITER's Triton bf16 GEMM from (use_aiter_triton_gemm).
TRITON_GEMM_MODULE = "aiter.ops.triton.gemm_a16w16"


@contextmanager
def triton_launches() -> Iterator[list[str]]:
    """The names of the Triton kernels launched inside the block, from Triton's launch-enter hook: a result computed
    by anything but a Triton kernel (a torch fallback) launches none."""
    knobs = importlib.import_module("triton.knobs")
    launched: list[str] = []

    def record(metadata) -> None:
        launched.append(str(metadata.get()["name"]))

    knobs.runtime.launch_enter_hook.add(record)
    try:
        yield launched
    finally:
        knobs.runtime.launch_enter_hook.remove(record)


def triton_gemm_a16w16(tokens: int, out_features: int, in_features: int) -> Callable[[], dict]:
    """y = x w^T through AITER's Triton ``gemm_a16w16`` (bf16), as vLLM calls it for the shapes it routes there.

    The token count picks the config bucket AITER looks up in the gfx90a config aiter-triton-gfx90a installs. The
    error allowed is the smoke rule's with the reference's RMS as the scale: fp32 accumulation over a few thousand
    products errs far below U * rms(ref), the output's rounding to bf16 is within RTOL * |ref|.
    """
    def call(gemm, torch, x, w, out):
        return gemm(x, w, bias=None, dtype=torch.bfloat16, y=out)

    def run() -> dict:
        torch = importlib.import_module("torch")
        gemm = importlib.import_module(TRITON_GEMM_MODULE).gemm_a16w16
        generator = torch.Generator().manual_seed(SEED)
        x = _uniform(torch, (tokens, in_features), generator)
        w = _uniform(torch, (out_features, in_features), generator)
        prefilled_out = _nan(torch, (tokens, out_features))
        with triton_launches() as launched:
            out = call(gemm, torch, x, w, prefilled_out)
            _synchronize(torch)
        reference = x.float() @ w.float().T
        figures = compare(reference, out, float((reference ** 2).mean().sqrt()))
        return {**figures, "prefilled": _same_memory(out, prefilled_out), "triton_kernels": sorted(set(launched)),
                "elapsed_ms": _timed(lambda: call(gemm, torch, x, w, _nan(torch, (tokens, out_features))), torch)}
    return run


# The modules vLLM imports AITER's Triton rope and unified attention from (vllm/_aiter_ops.py,
# vllm/v1/attention/backends/rocm_aiter_unified_attn.py); their configs are chosen in code, no file is needed.
TRITON_ROPE_MODULE = "aiter.ops.triton.rope.rope"
TRITON_UNIFIED_ATTENTION_MODULE = "aiter.ops.triton.unified_attention"
ROPE_POSITIONS = 4096


def triton_rope() -> dict:
    """vLLM's Triton rotary embedding: ``rope_cached_thd_positions_offsets_2c_fwd_inplace`` called as
    ``_triton_rotary_embedding_impl`` does (NeoX style, the whole head rotated, cos and sin halves of a bf16
    cos_sin_cache, positions, no offsets), in place on q ``[300, 32, 128]`` and k ``[300, 8, 128]`` (GQA: AITER's
    one-head kernel). In place, so no NaN can mark an unwritten element: every position is at least 1, where the
    rotation moves every element, so one left as it was is off the reference."""
    def rotate(x, cos, sin):
        first, second = x.float().chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    torch = importlib.import_module("torch")
    rope = importlib.import_module(TRITON_ROPE_MODULE)
    generator = torch.Generator().manual_seed(SEED)
    tokens, dim = 300, 128
    q = _uniform(torch, (tokens, 32, dim), generator)
    k = _uniform(torch, (tokens, 8, dim), generator)
    positions = torch.randint(1, ROPE_POSITIONS, (tokens,), generator=generator).to(DEVICE)
    inverse = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(ROPE_POSITIONS, dtype=torch.float32), inverse)
    cos, sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16).to(DEVICE).chunk(2, dim=-1)
    at = (cos[positions].float()[:, None, :], sin[positions].float()[:, None, :])
    reference = (rotate(q, *at), rotate(k, *at))
    q_memory, k_memory = q.data_ptr(), k.data_ptr()

    def call(q, k):
        rope.rope_cached_thd_positions_offsets_2c_fwd_inplace(q, k, cos, sin, positions, None, 0,
                                                              reuse_freqs_front_part=True, nope_first=False)

    with triton_launches() as launched:
        call(q, k)
        _synchronize(torch)
    figures = merged(compare(reference[0], q, 1.0), compare(reference[1], k, 1.0))
    return {**figures, "prefilled": q.data_ptr() == q_memory and k.data_ptr() == k_memory,
            "triton_kernels": sorted(set(launched)), "elapsed_ms": _timed(lambda: call(q.clone(), k.clone()), torch)}


def _unified_attention(unified, torch, q, key_cache, value_cache, out, cu_seqlens_q, max_q, seq_lens, block_tables,
                       window: int | None):
    """AITER's unified_attention as vLLM's ROCM_AITER_UNIFIED_ATTN backend calls it (causal, KV scales as tensors of
    ones, no softcap or sinks); ``window``: vLLM's sliding window, passed as window_size (window - 1, 0)."""
    scales = torch.ones(seq_lens.shape[0], key_cache.shape[2], dtype=torch.float32, device=DEVICE)
    unified.unified_attention(q=q, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q,
                              max_seqlen_q=max_q, seqused_k=seq_lens, max_seqlen_k=int(seq_lens.max()),
                              softmax_scale=1 / math.sqrt(q.shape[-1]), causal=True,
                              window_size=(window - 1, 0) if window else (-1, -1), block_table=block_tables,
                              softcap=0, q_descale=None, k_descale=scales, v_descale=scales)
    return out


def triton_unified_attention_decode() -> dict:
    """Paged decode through AITER's Triton ``unified_attention`` (vLLM's ROCM_AITER_UNIFIED_ATTN): bf16, block 16,
    GQA 8, head_dim 128, 8 sequences up to 1,024 tokens: few programs against long KV, so the split-KV 3d kernel and
    its reduction (``use_2d_kernel`` false on an MI210)."""
    torch = importlib.import_module("torch")
    unified = importlib.import_module(TRITON_UNIFIED_ATTENTION_MODULE)
    inputs = PagedInputs(torch, [16, 57, 129, 257, 500, 1024, 33, 700], heads_q=32, heads_kv=4, dim=128, block=16)
    # vLLM's layout: [blocks, block, kv_heads, dim]
    key_cache, value_cache = (x.permute(0, 2, 1, 3).contiguous() for x in (inputs.keys, inputs.values))
    cu_seqlens_q = torch.arange(len(inputs.context) + 1, dtype=torch.int32, device=DEVICE)

    def call(out):
        return _unified_attention(unified, torch, inputs.query, key_cache, value_cache, out, cu_seqlens_q, 1,
                                  inputs.context_lens, inputs.block_tables, None)

    prefilled_out = _nan(torch, inputs.out_shape())
    with triton_launches() as launched:
        out = call(prefilled_out)
        _synchronize(torch)
    figures = compare(inputs.reference(torch), out, float(inputs.values.abs().max()))
    return {**figures, "prefilled": _same_memory(out, prefilled_out), "triton_kernels": sorted(set(launched)),
            "elapsed_ms": _timed(lambda: call(_nan(torch, inputs.out_shape())), torch)}


def triton_unified_attention_sliding_window() -> dict:
    """Causal prefill with a sliding window (256) through AITER's Triton ``unified_attention`` over a paged KV cache
    (block 16, blocks in a shuffled order): the 2d kernel, which a window always takes. One sequence shorter and one
    much longer than the window, so an ignored window shows; the reference is the varlen case's."""
    torch = importlib.import_module("torch")
    unified = importlib.import_module(TRITON_UNIFIED_ATTENTION_MODULE)
    inputs, block, window = VarlenInputs(torch, [200, 1000], heads_q=16, heads_kv=2, dim=128), 16, 256
    per_seq = max(-(-length // block) for length in inputs.lengths)
    order = torch.randperm(len(inputs.lengths) * per_seq, generator=torch.Generator().manual_seed(SEED))
    block_tables = order.view(len(inputs.lengths), per_seq).to(torch.int32).to(DEVICE)
    caches = []
    for source in (inputs.k, inputs.v):
        cache = torch.zeros(order.numel(), block, source.shape[1], source.shape[2], dtype=source.dtype, device=DEVICE)
        for seq, (start, length) in enumerate(zip(inputs.starts, inputs.lengths)):
            for index in range(-(-length // block)):
                rows = source[start + index * block:start + min((index + 1) * block, length)]
                cache[int(block_tables[seq, index]), :rows.shape[0]] = rows
        caches.append(cache)
    seq_lens = torch.tensor(inputs.lengths, dtype=torch.int32, device=DEVICE)

    def call(out):
        return _unified_attention(unified, torch, inputs.q, *caches, out, inputs.cu_seqlens, max(inputs.lengths),
                                  seq_lens, block_tables, window)

    prefilled_out = _nan(torch, inputs.out_shape())
    with triton_launches() as launched:
        out = call(prefilled_out)
        _synchronize(torch)
    figures = compare(inputs.reference(torch, window), out, float(inputs.v.abs().max()))
    return {**figures, "prefilled": _same_memory(out, prefilled_out), "triton_kernels": sorted(set(launched)),
            "elapsed_ms": _timed(lambda: call(_nan(torch, inputs.out_shape())), torch)}


# Case name -> the function computing it. cdna2.host.smoke names the checks and judges the results.
CASES: dict[str, Callable[[], dict]] = {
    "fmha_v3_fwd_noncausal": fmha_v3_fwd(causal=False, batch=2, seqlen=512),
    "fmha_v3_fwd_causal": fmha_v3_fwd(causal=True, batch=2, seqlen=512),
    "fmha_v3_fwd_partial_tile": fmha_v3_fwd(causal=True, batch=1, seqlen=1000),
    "fmha_v3_varlen_group": varlen([129, 383], window=None),
    "pa_fwd_asm": pa_fwd_asm,
    "sliding_window": varlen([200, 1000], window=256),
    "mla_decode": mla_decode,
    "topksoftmax_asm": topksoftmax_asm,
    "fmoe_g1u0_fp16": fmoe_g1u0_fp16,
    "bf16gemm_asm": bf16gemm_asm,
    "layernorm2d_with_add_asm": layernorm2d_with_add_asm,
    # vLLM routes (out, in) = (640, 2880) and (128, 2880) to it; K = 2880 is no multiple of BLOCK_SIZE_K (EVEN_K
    # false); 4096 tokens read the "any" bucket, the one stepped down for gfx90a
    "triton_gemm_a16w16_small": triton_gemm_a16w16(32, 640, 2880),
    "triton_gemm_a16w16_large": triton_gemm_a16w16(4096, 128, 2880),
    "triton_rope": triton_rope,
    "triton_unified_attention_decode": triton_unified_attention_decode,
    "triton_unified_attention_sliding_window": triton_unified_attention_sliding_window,
}


def run_case(name: str, capture_file: Path | None = None) -> dict:
    """Run one case with fds 1 and 2 captured (into ``capture_file`` if given); an exception is reported, not raised."""
    result: dict = {"case": name, "error": None}
    with captured_fds(capture_file) as captured:
        try:
            result.update(provenance())
            result.update(CASES[name]())
        except Exception as error:  # the parent reports it as a failed check, with the traceback's last lines
            result["error"] = f"{type(error).__name__}: {error}"
            result["traceback"] = traceback.format_exc()[-2000:]
    load_lines = [line for line in captured.text.splitlines() if any(m in line for m in LOAD_LINE_MARKERS)]
    result["captured"] = "\n".join(load_lines)
    result["captured_tail"] = captured.text[-CAPTURED_TAIL:]
    return result


def warm_up(names: list[str]) -> dict:
    """Run each case once, unjudged: AITER JIT-builds and first loads its modules here, under the warm-up's limit."""
    errors = {}
    with captured_fds():
        for name in names:
            try:
                CASES[name]()
            except Exception as error:  # the case's own run reports it in full
                errors[name] = f"{type(error).__name__}: {error}"
    return {"warmed_up": [name for name in names if name not in errors], "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.smoke_gpu", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("device", help="describe the first GPU torch sees")
    warmup_parser = commands.add_parser("warmup", help="run cases once, unjudged, so later runs find AITER built")
    warmup_parser.add_argument("cases", nargs="+", choices=sorted(CASES))
    run_parser = commands.add_parser("run", help="run one case against its torch reference")
    run_parser.add_argument("case", choices=sorted(CASES))
    run_parser.add_argument("--capture-file", type=Path, help="keep the captured fd 1/2 output in this file")
    args = parser.parse_args(argv)
    if args.command == "device":
        return finish("smoke_gpu device", describe_device())
    if args.command == "warmup":
        return finish("smoke_gpu warmup", warm_up(args.cases))
    return finish("smoke_gpu run", run_case(args.case, args.capture_file))


if __name__ == "__main__":
    sys.exit(main())

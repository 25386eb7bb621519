"""AITER's unified attention (vLLM's ROCM_AITER_UNIFIED_ATTN backend): its config is chosen in code, per call.

``aiter/ops/triton/unified_attention.py`` (0.1.7) and ``aiter/ops/triton/attention/unified_attention.py`` (0.1.16 on)
pick the 2d or the 3d kernel and their tiles from the call's shapes (``use_2d_kernel``, ``select_2d_config``,
``select_3d_config``); no config file exists to derive. The cases below repeat that arithmetic for the shapes vLLM
serves (decode and prefill, head dims 64 and 128, KV block sizes 16 and 32, a sliding window), on a gfx90a host
(its CU count sets the 2d/3d choice), and compile exactly the kernels those calls launch.
"""

from __future__ import annotations

import math

from cdna2.triton.recipes.sizes import KV_HEADS, Q_HEADS, Path

MODULES_2D_3D = ["aiter.ops.triton._triton_kernels.unified_attention",
                 "aiter.ops.triton._triton_kernels.attention.unified_attention"]
PER_KV = Q_HEADS // KV_HEADS
SLIDING = 4096  # a Mistral/Gemma-like window: the wrapper's SLIDING_WINDOW is 1 + window_size[0]
TENSORS = {"sink_ptr": "fp32", "block_tables_ptr": "int32", "seq_lens_ptr": "int32", "alibi_slopes_ptr": "fp32",
           "qq_bias_ptr": "fp32", "query_start_len_ptr": "int32", "k_scale": "fp32", "v_scale": "fp32",
           "segm_output_ptr": "fp32", "segm_max_ptr": "fp32", "segm_expsum_ptr": "fp32"}


def _next_power_of_2(value: int) -> int:
    return 1 << (value - 1).bit_length()


def _select_2d(block_size: int, head_size: int, decode: bool, max_seqlen_q: int) -> dict:
    """select_2d_config, for gfx9 (not RDNA) and a bf16 KV cache that is not shuffled: 0.1.7's and 0.1.20's agree
    for head sizes up to 128 and block sizes up to 64 (0.1.20 caps a decode tile at 64 and has wider-head rows)."""
    block_m = 16 if PER_KV <= 16 else _next_power_of_2(PER_KV)
    tile, max_stages = 64, 2 if head_size > 128 else 4
    if decode:
        stages, warps, tile = 3, 2, min(64, _next_power_of_2(block_size))
    else:
        stages, warps = 1, 2
        if max_seqlen_q >= 256:
            block_m, stages, warps = 128, 1, 4
    return {"BLOCK_M": block_m, "BLOCK_Q": block_m // PER_KV, "TILE_SIZE": tile, "num_warps": warps,
            "num_stages": min(max_stages, stages), "waves_per_eu": 2}


def _select_3d(block_size: int, max_seqlen_k: int, num_2d_programs: int, compute_units: int) -> dict:
    """select_3d_config: segments from the host's CU count (target_num_prgms = 4 x CUs)."""
    segments = min(_next_power_of_2(math.ceil(4 * compute_units / num_2d_programs)), 128)
    minimum = 16 if block_size <= 16 else 8
    segments = max(segments, minimum)
    return {"TILE_SIZE": block_size, "NUM_SEGMENTS_PER_SEQ": segments, "num_warps": 2, "num_stages": 1,
            "waves_per_eu": 2, "reduce_num_warps": 1 if segments == minimum else 2}


def uses_2d(window: int, max_seqlen_k: int, num_2d_programs: int, compute_units: int) -> bool:
    """use_2d_kernel: a window, short KV, or more 2d programs than 4 per CU."""
    return window > 0 or max_seqlen_k <= 512 or num_2d_programs > 4 * compute_units


def cases(compute_units: int) -> dict[str, dict]:
    """The calls vLLM makes, each with the config the wrapper chooses for it on a host of ``compute_units`` CUs:
    ``{case: {kernel: "2d" | "3d", config..., shape...}}``."""
    found = {}
    for head in (64, 128):
        for block in (16, 32):
            # decode of 8 sequences at 4k context: few 2d programs, so the 3d (split-KV) kernel
            seqs = 8
            programs = (seqs // (16 // PER_KV) + seqs) * KV_HEADS
            assert not uses_2d(0, 4096, programs, compute_units)
            found[f"3d decode hd{head} bs{block}"] = {"kernel": "3d", "head": head, "block": block, "decode": True,
                                                      "window": 0, **_select_3d(block, 4096, programs, compute_units)}
            # decode of a batch big enough for the 2d kernel (256 sequences)
            programs = (256 // (16 // PER_KV) + 256) * KV_HEADS
            assert uses_2d(0, 4096, programs, compute_units)
            found[f"2d decode hd{head} bs{block}"] = {"kernel": "2d", "head": head, "block": block, "decode": True,
                                                      "window": 0, **_select_2d(block, head, True, 1)}
            found[f"2d prefill hd{head} bs{block}"] = {"kernel": "2d", "head": head, "block": block, "decode": False,
                                                       "window": 0, **_select_2d(block, head, False, 2048)}
        found[f"2d chunked prefill hd{head} bs16"] = {"kernel": "2d", "head": head, "block": 16, "decode": False,
                                                      "window": 0, **_select_2d(16, head, False, 64)}
        # a sliding window always takes the 2d kernel (use_2d_kernel), decode and prefill
        found[f"2d sliding-window decode hd{head} bs16"] = {"kernel": "2d", "head": head, "block": 16, "decode": True,
                                                            "window": SLIDING + 1, **_select_2d(16, head, True, 1)}
        found[f"2d sliding-window prefill hd{head} bs16"] = {
            "kernel": "2d", "head": head, "block": 16, "decode": False, "window": SLIDING + 1,
            **_select_2d(16, head, False, 2048)}
    return found


def _common(case: dict) -> dict:
    head = case["head"]
    return {"scale": 1 / math.sqrt(head), "softcap": 0.0, "out_scale": 1.0, "num_query_heads": Q_HEADS,
            "num_queries_per_kv": PER_KV, "BLOCK_SIZE": case["block"], "HEAD_SIZE": head,
            "HEAD_SIZE_PADDED": _next_power_of_2(head), "USE_ALIBI_SLOPES": False, "USE_QQ_BIAS": False,
            "USE_SOFTCAP": False, "USE_SINKS": False, "SLIDING_WINDOW": case["window"], "stride_k_cache_3": 1,
            "stride_v_cache_3": 1, "USE_FP8": False, "ALL_DECODE": case["decode"], "SHUFFLED_KV_CACHE": False,
            "IS_Q_FP8": False, "IS_KV_FP8": False}


def unified_attention(case: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """The kernels one call launches: kernel_unified_attention_2d, or _3d and reduce_segments."""
    values = {**_common(case), **{name: value for name, value in case.items() if name not in (
        "kernel", "head", "block", "decode", "window", "reduce_num_warps")}}
    request = {"modules": MODULES_2D_3D, "tensor_dtype": "bf16", "tensors": TENSORS}
    if case["kernel"] == "2d":
        return [("2d", {**request, "kernel": "kernel_unified_attention_2d", "values": values})]
    block_m = 16 if PER_KV <= 16 else _next_power_of_2(PER_KV)
    attention = {**values, "BLOCK_M": block_m, "BLOCK_Q": block_m // PER_KV}
    reduce = {**attention, "num_warps": case["reduce_num_warps"], "out_scale_inv": 1.0}
    return [("3d", {**request, "kernel": "kernel_unified_attention_3d", "values": attention}),
            ("3d reduce_segments", {**request, "kernel": "reduce_segments", "values": reduce})]

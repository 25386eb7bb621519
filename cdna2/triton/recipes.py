"""How AITER launches each op's Triton kernel from one config: the kernel, and the arguments its wrapper passes.

A recipe turns one config of a config file into the compiles that prove it: one per code path AITER's wrapper and
heuristics can take with that config (``EVEN_K`` true and false, causal or not, head dims with a positional part,
dropout, fp32), each as a worker request (``cdna2.triton.worker``). The wrapper's own arithmetic on the config
(split-K sizes) is repeated here, read from the AITER source; arguments a release's kernel does not take are
dropped by the worker, so one recipe serves the releases whose kernels differ by a flag.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Path = tuple[str, dict]  # (what the path is, the worker request's modules/kernel/values)

# Problem sizes the compiles use: a Llama-like projection and attention head; sizes only matter through Triton's
# specialisation (== 1, divisible by 16), which these match for the shapes AITER serves.
GEMM_N, GEMM_K, GEMM_K_UNEVEN = 4096, 4096, 4000
HEAD_DIM, PE_DIM, Q_HEADS, KV_HEADS, SEQ = 128, 64, 32, 8, 4096
BF16_MAX, FP32_MAX = 3.3895313892515355e38, 3.4028234663852886e38


def _gemm_request(config: dict, m: int, n: int, k: int) -> dict:
    chosen = dict(config)
    chosen.setdefault("NUM_KSPLIT", 1)
    # compute_splitk_params / _get_config: the split-K block, and BLOCK_SIZE_K cut down to it
    chosen["SPLITK_BLOCK_SIZE"] = -(-k // chosen["NUM_KSPLIT"])
    if chosen["BLOCK_SIZE_K"] > chosen["SPLITK_BLOCK_SIZE"]:
        chosen["BLOCK_SIZE_K"] = 1 << (chosen["SPLITK_BLOCK_SIZE"] - 1).bit_length()
        if chosen["BLOCK_SIZE_K"] > chosen["SPLITK_BLOCK_SIZE"]:
            chosen["BLOCK_SIZE_K"] //= 4
    chosen["BLOCK_SIZE_K"] = max(chosen["BLOCK_SIZE_K"], 16)
    split = chosen["NUM_KSPLIT"] > 1
    values = {**chosen, "M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": 1, "stride_bn": k,
              "stride_ck": m * n if split else 0, "stride_cm": n, "stride_cn": 1, "activation": "",
              "use_activation": False, "ADD_BIAS": False, "SKIP_REDUCE": False}
    return {"modules": ["aiter.ops.triton._triton_kernels.gemm_a16w16",
                        "aiter.ops.triton._triton_kernels.gemm.basic.gemm_a16w16"],
            "kernel": "_gemm_a16_w16_kernel", "values": values, "tensor_dtype": "bf16",
            "tensors": {"c_ptr": "fp32"} if split else {}}


def gemm_a16w16(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """``shape``: the (N, K) a specialised file is for (``-N=..-K=..``): its K decides EVEN_K; the default file
    serves any K, so both branches are compiled."""
    bound = int(bucket.rsplit("_", 1)[1]) if bucket[-1].isdigit() else 8192
    if shape:
        return [(f"N={shape[0]} K={shape[1]}", _gemm_request(config, bound, *shape))]
    return [("EVEN_K", _gemm_request(config, bound, GEMM_N, GEMM_K)),
            ("K % BLOCK_SIZE_K != 0", _gemm_request(config, bound, GEMM_N, GEMM_K_UNEVEN))]


def _mha_request(config: dict, *, dtype: str = "bf16", pe: bool = False, dropout: bool = False,
                 causal: bool = False, varlen: bool = False) -> dict:
    values = {**config, "SEQLEN_Q": SEQ, "SEQLEN_K": SEQ, "IS_CAUSAL": causal, "NUM_Q_HEADS": Q_HEADS,
              "NUM_K_HEADS": KV_HEADS, "BLOCK_DMODEL": HEAD_DIM, "BLOCK_DMODEL_POW2": HEAD_DIM,
              "BLOCK_DMODEL_PE": PE_DIM if pe else 0, "RETURN_SCORES": False, "ENABLE_DROPOUT": dropout,
              "IS_FP8": False, "FP8_MAX": FP32_MAX if dtype == "fp32" else BF16_MAX, "VARLEN": varlen, "BATCH": 1,
              "NUM_XCD": 8, "SWIZZLE": "default", "USE_INT64_STRIDES": False, "ENABLE_SINK": False,
              "SLIDING_WINDOW": False, "sm_scale": 1 / math.sqrt(HEAD_DIM), "dropout_p": 0.1 if dropout else 0.0,
              "philox_seed": 1234, "philox_offset_base_in": 5678}
    head = HEAD_DIM + (PE_DIM if pe else 0)
    for tensor, heads in (("q", Q_HEADS), ("k", KV_HEADS), ("v", KV_HEADS), ("o", Q_HEADS)):
        width = HEAD_DIM if tensor in "vo" else head
        values.update({f"stride_{tensor}z_in": SEQ * heads * width, f"stride_{tensor}h_in": width,
                       f"stride_{tensor}{'m' if tensor in 'qo' else 'n'}_in": heads * width,
                       f"stride_{tensor}{'n' if tensor == 'o' else 'k'}_in": 1})
    return {"modules": ["aiter.ops.triton._triton_kernels.mha", "aiter.ops.triton._triton_kernels.attention.mha"],
            "kernel": "_attn_fwd", "values": values, "tensor_dtype": dtype,
            "tensors": {"cu_seqlens_q": "int32", "cu_seqlens_k": "int32", "softmax_lse_ptr": "fp32",
                        "descale_q_ptr": "fp32", "descale_k_ptr": "fp32", "descale_v_ptr": "fp32",
                        "alibi_slopes_ptr": "fp32", "s_dmask_ptr": "fp32", "dropout_mask_ptr": "fp32",
                        "sink_ptr": "fp32"}}


def mha_fwd(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """``fwd.<key>`` of the MHA file: which of _get_config's cases it serves decides the paths."""
    pe = key.startswith("pe")
    if key.endswith("dropout_or_fp32"):
        return [("dropout bf16" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dropout=True)),
                ("fp32" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dtype="fp32"))]
    return [("bf16 causal varlen" + (" +pe" if pe else ""), _mha_request(config, pe=pe, causal=True, varlen=True)),
            ("bf16 non-causal" + (" +pe" if pe else ""), _mha_request(config, pe=pe))]


RECIPES: dict[str, Callable[[dict, str, tuple[int, int] | None], list[Path]]] = {
    "gemm_a16w16": gemm_a16w16, "mha_fwd": mha_fwd}

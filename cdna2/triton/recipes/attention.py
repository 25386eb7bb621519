"""AITER's attention kernels: how their wrappers launch the kernel from one config."""

from __future__ import annotations

import math

from cdna2.triton.recipes.sizes import BF16_MAX, FP32_MAX, HEAD_DIM, KV_HEADS, PE_DIM, Q_HEADS, SEQ, Path


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
    key = key.rsplit(".", 1)[-1]
    pe = key.startswith("pe")
    if key.endswith("dropout_or_fp32"):
        return [("dropout bf16" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dropout=True)),
                ("fp32" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dtype="fp32"))]
    return [("bf16 causal varlen" + (" +pe" if pe else ""), _mha_request(config, pe=pe, causal=True, varlen=True)),
            ("bf16 non-causal" + (" +pe" if pe else ""), _mha_request(config, pe=pe))]

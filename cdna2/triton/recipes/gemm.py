"""AITER's bf16/fp16 GEMMs: how their wrappers launch the kernel from one config."""

from __future__ import annotations

from cdna2.triton.recipes.sizes import GEMM_K, GEMM_K_UNEVEN, GEMM_N, Path


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

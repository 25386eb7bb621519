"""Shared by the recipes: the request a recipe returns, and the problem sizes its compiles use."""

from __future__ import annotations

Path = tuple[str, dict]  # (what the path is, the worker request's modules/kernel/values)

# Problem sizes the compiles use: a Llama-like projection and attention head; sizes only matter through Triton's
# specialisation (== 1, divisible by 16), which these match for the shapes AITER serves. GEMM_K_UNEVEN is a multiple
# of 16 and of no BLOCK_SIZE_K from 32 up (4000 was a multiple of 32: batched GEMM's BLOCK_SIZE_K 32 saw it even).
GEMM_N, GEMM_K, GEMM_K_UNEVEN = 4096, 4096, 4112
HEAD_DIM, PE_DIM, Q_HEADS, KV_HEADS, SEQ = 128, 64, 32, 8, 4096
BF16_MAX, FP32_MAX = 3.3895313892515355e38, 3.4028234663852886e38

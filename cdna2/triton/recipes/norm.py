"""AITER's fused add + RMSNorm + pad as vLLM calls it: ``fused_add_rmsnorm_pad``.

vLLM's ``_rocm_aiter_triton_add_rmsnorm_pad_impl`` (vllm/_aiter_ops.py, 0.23.0 through 0.34.0) passes the residual
and ``x_pad_to_multiple`` (gpt-oss pads its hidden size for the MoE router). The wrapper
(``aiter/ops/triton/fused_add_rmsnorm_pad.py``, from 0.1.16 ``normalization/fused_add_rmsnorm_pad.py``, the same
text) launches one program per row with ``BLOCK_SIZE_N = next_power_of_2(N_out)``, Triton's default warps.
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import Path

MODULES = ["aiter.ops.triton._triton_kernels.fused_add_rmsnorm_pad",
           "aiter.ops.triton._triton_kernels.normalization.fused_add_rmsnorm_pad"]


def cases(compute_units: int) -> dict[str, dict]:
    """Hidden sizes vLLM serves, with the residual it always passes: gpt-oss 2880 padded to a multiple of 256, and
    Llama-like 4096, 5120 and 8192 unpadded (the choice does not depend on the host)."""
    found = {}
    for hidden, pad in ((2880, 256), (4096, 0), (5120, 0), (8192, 0)):
        out = -(-hidden // pad) * pad if pad else hidden
        found[f"hidden {hidden}" + (f" pad to {pad}" if pad else "")] = {
            "N": hidden, "N_OUT": out, "BLOCK_SIZE_N": 1 << (out - 1).bit_length()}
    return found


def fused_add_rmsnorm_pad(case: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    values = {**case, "M": 256, "HAS_RES": True, "eps": 1e-6, "x_stride_m": case["N"], "x_stride_n": 1,
              "res_stride_m": case["N"], "res_stride_n": 1, "out_stride_m": case["N_OUT"], "out_stride_n": 1,
              "res_out_stride_m": case["N"], "res_out_stride_n": 1}
    return [("with residual", {"modules": MODULES, "kernel": "_fused_add_rmsnorm_pad", "values": values,
                               "tensor_dtype": "bf16"})]

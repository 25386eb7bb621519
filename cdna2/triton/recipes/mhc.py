"""AITER's mHC fusions (manifold-constrained hyper-connections, ``aiter/ops/triton/fusions/mhc.py``, v0.1.16 on): how
its wrappers launch each kernel from one config of ``{arch}-MHC_FUSED_SINKHORN[-C=<c>].json`` or
``{arch}-MHC_POST.json``.

Read from ``fusions/mhc.py``, ``_triton_kernels/fusions/mhc.py`` and ``utils/mhc_config_utils.py`` of v0.1.16,
v0.1.20.post1 and main (the wrappers are the same text but for type hints; the kernels differ only by int64 row
indices from v0.1.17):

- ``get_mhc_config("MHC_FUSED", M, C, mode="sinkhorn")`` takes the ``-C=<c>`` file of the largest c <= C (the
  plain file below the smallest, 128), then its ``M_LEQ_<m>`` bucket of the largest m <= M (the name reads the
  other way), else ``any`` (taken below the smallest m). Its configs feed two wrappers: ``mhc`` (``NUM_KSPLIT`` 1:
  ``_mhc_fused_kernel``; more: ``_mhc_fused_split_kernel`` then ``_mhc_reduce_apply_kernel``) and
  ``mhc_post_pre`` (``_mhc_post_pre_split_kernel``, its K split ``BLOCK_K // n`` channels wide, then
  ``_mhc_post_pre_reduce_apply_kernel``; ``BLOCK_M`` is the config's on gfx90a, 16 on gfx942 only).
- ``get_mhc_post_config(M, C)``: ``{arch}-MHC_POST.json``'s ``C_<c>`` or ``default`` for ``mhc_post``
  (``_mhc_post_kernel``, element-wise, no dot).

x, phi, the residuals and outputs are bf16 or fp16 (bf16 compiled here); bias, the mixes and the split-K partials
fp32; one ``tl.dot`` per GEMM kernel (fp32 accumulator), nothing FP8. ``n`` (streams) is 4, DeepSeek's ``hc_mult``
(AITER's HIP ``mhc_pre_big_fuse`` hard-codes it); Sinkhorn runs its default 20 iterations. M, K and C are
constexprs of the fused kernels: each bucket is compiled at its own M, each ``-C=`` file at its C.
``mhc_post_pre``'s HIP-compatible exp-domain Sinkhorn (``asymmetric_exp_domain=True``, a branch of the post and res
programs, which run one row each whatever the config) is not compiled per config: on the plain file's ``any`` and
``-C=128``'s ``M_LEQ_1024`` it gave the canonical branch's LDS, registers and spills on both arches.
"""

from __future__ import annotations

import re

from cdna2.triton.recipes.sizes import Path

MODULES = ["aiter.ops.triton._triton_kernels.fusions.mhc"]
STREAMS, SINKHORN_ITERS = 4, 20
SQUARED, TOTAL = STREAMS * STREAMS, 2 * STREAMS + STREAMS * STREAMS  # n*n res columns; 2n + n*n phi columns
PLAIN_FILE_C = 64  # below the smallest -C= file (128) of every release: the plain file's configs serve it
POST_CASES = (("decode, M 1", 1), ("prefill, M 4096", 4096))
POST_C = 7168  # a DeepSeek-sized hidden size (a multiple of no power of two above 1024)
EPS = {"eps": 1e-6, "hc_post_mult_value": 2.0}


def _pow2(value: int) -> int:
    return 1 << (value - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _m(bucket: str) -> int:
    """The M that takes ``bucket``: ``M_LEQ_<m>`` is taken from m up; ``any`` below every m (M = 1 is)."""
    found = re.fullmatch(r"M_LEQ_(\d+)", bucket)
    return int(found[1]) if found else 1


def _request(kernel: str, values: dict, tensors: dict) -> dict:
    return {"modules": MODULES, "kernel": kernel, "values": values, "tensor_dtype": "bf16", "tensors": tensors}


def mhc_fused_sinkhorn(config: dict, bucket: str, shape: tuple[int, ...] | None) -> list[Path]:
    """Every kernel both wrappers launch with this config, at the bucket's M and the file's C."""
    tiles = {key: value for key, value in config.items() if key not in ("NUM_KSPLIT", "BLOCK_M", "BLOCK_K", "BLOCK_C")}
    m, c = _m(bucket), shape[0] if shape else PLAIN_FILE_C
    k = STREAMS * c
    block_m, block_c = config.get("BLOCK_M", 64 if m >= 64 else 32), config.get("BLOCK_C", min(64, _pow2(c)))
    block_k = min(config.get("BLOCK_K", 64), _pow2(k))
    common = {**tiles, **EPS, "M": m, "K": k, "n": STREAMS, "n_squared": SQUARED, "C": c, "BLOCK_M": block_m,
              "alpha_pre": 0.5, "alpha_post": 0.5, "alpha_res": 0.5, "stride_xm": k, "stride_xk": 1,
              "stride_phi_k": TOTAL, "stride_phi_n": 1, "stride_li_m": c, "stride_li_c": 1, "N_POW2": STREAMS,
              "N_POW2_RES": SQUARED, "NUM_SINKHORN_ITERS": SINKHORN_ITERS}
    partials = {"acc_ptr": "fp32", "acc_sq_ptr": "fp32", "bias_ptr": "fp32"}
    paths = []
    ksplit = config.get("NUM_KSPLIT", 1)
    if ksplit == 1:  # mhc: the whole pipeline in one kernel, one program per stream per M tile
        paths.append(("mhc fused", _request("_mhc_fused_kernel", {
            **common, "hc_pre_eps": 0.0, "N": TOTAL, "BLOCK_N": SQUARED, "BLOCK_K": block_k, "BLOCK_C": block_c,
            "stride_out_m": STREAMS + SQUARED, "stride_out_n": 1}, {"bias_ptr": "fp32"})))
    else:  # mhc: split-K GEMM, then one reduce-apply kernel
        splitk = _cdiv(k, ksplit)
        acc = {"stride_acc_k": m * TOTAL, "stride_acc_m": TOTAL, "stride_acc_n": 1, "stride_acc_sq_k": m,
               "stride_acc_sq_m": 1}
        paths.append(("mhc split-K GEMM", _request("_mhc_fused_split_kernel", {
            **common, **acc, "N": TOTAL, "N_TOTAL_POW2": _pow2(TOTAL), "BLOCK_K": block_k,
            "SPLITK_BLOCK_SIZE": splitk}, partials)))
        paths.append(("mhc reduce-apply", _request("_mhc_reduce_apply_kernel", {
            **common, **acc, "hc_pre_eps": 0.0, "BLOCK_C": block_c, "ACTUAL_KSPLIT": _cdiv(k, splitk),
            "RES_PID_C": 0 if _cdiv(c, block_c) == 1 else 1, "stride_out_m": STREAMS + SQUARED,
            "stride_out_n": 1}, partials)))
    # mhc_post_pre: its split is the config's BLOCK_K (clamped to K) over n streams, NUM_KSPLIT ignored
    block_k = min(config.get("BLOCK_K", min(512, _pow2(k))), _pow2(k))
    split_c = block_k // STREAMS
    post_ksplit = _cdiv(c, split_c)
    acc = {"stride_acc_k": m * TOTAL, "stride_acc_m": TOTAL, "stride_acc_n": 1, "stride_acc_sq_k": m,
           "stride_acc_sq_m": 1}
    mixes = {"post_mix_ptr": "fp32", "comb_mix_ptr": "fp32", **partials}
    paths.append(("mhc_post_pre split", _request("_mhc_post_pre_split_kernel", {
        **common, **acc, "N": TOTAL, "BLOCK_C": split_c, "N_TOTAL_POW2": _pow2(TOTAL), "stride_x_m": c,
        "stride_x_c": 1, "stride_resin_m": k, "stride_resin_n": c, "stride_resin_c": 1, "stride_post_m": STREAMS,
        "stride_post_n": 1, "stride_comb_m": SQUARED, "stride_comb_src": STREAMS, "stride_comb_dst": 1,
        "stride_resout_m": k, "stride_resout_n": c, "stride_resout_c": 1}, mixes)))
    paths.append(("mhc_post_pre reduce-apply", _request("_mhc_post_pre_reduce_apply_kernel", {
        **common, **acc, "hc_pre_eps": 1e-6, "BLOCK_C": min(config.get("BLOCK_C", min(128, _pow2(c))), _pow2(c)),
        "ACTUAL_KSPLIT": post_ksplit, "KSPLIT_POW2": _pow2(post_ksplit), "BLOCK_M_POST_RES": 1,
        "ASYMMETRIC_EXP_DOMAIN": False, "hc_sinkhorn_eps": 1e-6, "stride_hp_m": STREAMS, "stride_hp_n": 1,
        "stride_hr_m": SQUARED, "stride_hr_n": 1}, {"alpha_ptr": "fp32", **partials})))
    return paths


def mhc_post(config: dict, key: str, shape: tuple[int, ...] | None) -> list[Path]:
    """``_mhc_post_kernel`` (M and C are run-time arguments: a decode row and a prefill)."""
    tiles = {name: value for name, value in config.items() if name not in ("BLOCK_M", "BLOCK_C")}
    block_c = min(config.get("BLOCK_C", min(256, _pow2(POST_C))), _pow2(POST_C))
    return [(name, _request("_mhc_post_kernel", {
        **tiles, "M": m, "C": POST_C, "n": STREAMS, "BLOCK_M": config.get("BLOCK_M", 64 if m >= 64 else 32),
        "BLOCK_C": block_c, "stride_x_m": POST_C, "stride_x_c": 1, "stride_res_m": STREAMS * POST_C,
        "stride_res_n": POST_C, "stride_res_c": 1, "stride_out_m": STREAMS * POST_C, "stride_out_n": POST_C,
        "stride_out_c": 1, "stride_post_m": STREAMS, "stride_post_n": 1, "stride_comb_m": SQUARED,
        "stride_comb_src": STREAMS, "stride_comb_dst": 1}, {"post_mix_ptr": "fp32", "comb_mix_ptr": "fp32"}))
        for name, m in POST_CASES]

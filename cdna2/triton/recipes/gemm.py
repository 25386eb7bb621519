"""AITER's bf16/fp16 GEMMs: how their wrappers launch the kernel from one config.

Read from amd-aiter 0.1.7 (``aiter/ops/triton/<op>.py``, kernels in ``_triton_kernels/<op>.py``) and the ROCm/aiter
tags v0.1.16 to v0.1.20.post1 and main (wrappers under ``gemm/{basic,batched,feed_forward}/``, kernels under
``_triton_kernels/gemm/...``; ``gmm.py`` stays where it was). Where a flag a wrapper passes changes the kernel, each
value is a path; where several flags act on separate parts of one kernel (GMM), each is compiled alone and all
together rather than every combination.
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import GEMM_K, GEMM_K_UNEVEN, GEMM_N, Path

_KERNELS = "aiter.ops.triton._triton_kernels"
# Of _get_activation_from_str's names (_triton_kernels/activation.py: gelu, gelu_tanh, silu, silu_exp2, relu), the
# gate of SwiGLU and the costliest elementwise one; all five gave the same LDS, registers and MFMA on gated's M_LEQ_64.
ACTIVATIONS = ("silu", "gelu_tanh")
GROUPS = 8  # GMM's G: experts of a MoE layer


def _bucket_m(key: str) -> int:
    """The M a config's bucket serves: ``M_LEQ_x``/``M_GEQ_x`` -> x; 0.1.7's batched ``small`` (M + N < 4096) -> 512;
    ``any``/``large`` -> 8192."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf[-1].isdigit():
        return int(leaf.rsplit("_", 1)[1])
    return 512 if leaf == "small" else 8192


def _split_k(config: dict, k: int) -> dict:
    """compute_splitk_params (utils/gemm_config_utils.py) / 0.1.7's _get_config: the split-K block, and
    BLOCK_SIZE_K cut down to it; cache_modifier None where the file has none (add_default_gemm_config_params)."""
    chosen = {"NUM_KSPLIT": 1, "cache_modifier": None, **config}
    chosen["SPLITK_BLOCK_SIZE"] = -(-k // chosen["NUM_KSPLIT"])
    if chosen["BLOCK_SIZE_K"] > chosen["SPLITK_BLOCK_SIZE"]:
        chosen["BLOCK_SIZE_K"] = 1 << (chosen["SPLITK_BLOCK_SIZE"] - 1).bit_length()
        if chosen["BLOCK_SIZE_K"] > chosen["SPLITK_BLOCK_SIZE"]:
            chosen["BLOCK_SIZE_K"] //= 4
    chosen["BLOCK_SIZE_K"] = max(chosen["BLOCK_SIZE_K"], 16)
    return chosen


def _even_and_uneven_k(shape: tuple[int, int] | None) -> list[tuple[str, int, int]]:
    """(path, N, K): a specialised file (``-N=..-K=..``) is read only for its K; the default file serves any K, so
    the EVEN_K branch and the K-tail one are both compiled."""
    if shape:
        return [(f"N={shape[0]} K={shape[1]}", *shape)]
    return [("EVEN_K", GEMM_N, GEMM_K), ("K % BLOCK_SIZE_K != 0", GEMM_N, GEMM_K_UNEVEN)]


def _activation(name: str | None):
    """What the wrappers pass: ``activation=_get_activation_from_str(activation) if activation else ""``."""
    if not name:
        return ""
    return {"call": "_get_activation_from_str", "modules": [f"{_KERNELS}.activation"], "args": [name]}


def _gemm_request(config: dict, m: int, n: int, k: int) -> dict:
    chosen = _split_k(config, k)
    split = chosen["NUM_KSPLIT"] > 1
    values = {**chosen, "M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": 1, "stride_bn": k,
              "stride_ck": m * n if split else 0, "stride_cm": n, "stride_cn": 1, "activation": "",
              "use_activation": False, "ADD_BIAS": False, "SKIP_REDUCE": False}
    return {"modules": [f"{_KERNELS}.gemm_a16w16", f"{_KERNELS}.gemm.basic.gemm_a16w16"],
            "kernel": "_gemm_a16_w16_kernel", "values": values, "tensor_dtype": "bf16",
            "tensors": {"c_ptr": "fp32"} if split else {}}


def gemm_a16w16(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    m = _bucket_m(key)
    return [(path, _gemm_request(config, m, n, k)) for path, n, k in _even_and_uneven_k(shape)]


def batched_gemm_a16w16(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """batched_gemm_bf16: XQ (B, M, K) @ WQ (B, N, K) transposed, bias (B, 1, N) or none (HAS_BIAS). From v0.1.17 the
    kernel takes NUM_KSPLIT/SPLITK_BLOCK_SIZE/cache_modifier (compute_splitk_params); earlier kernels drop them."""
    m, paths = _bucket_m(key), []
    for path, n, k in _even_and_uneven_k(shape):
        chosen = _split_k(config, k)
        split = chosen["NUM_KSPLIT"] > 1
        for bias in (False, True):
            values = {**chosen, "M": m, "N": n, "K": k, "stride_ab": m * k, "stride_am": k, "stride_ak": 1,
                      "stride_bb": n * k, "stride_bk": 1, "stride_bn": k, "stride_cb": m * n, "stride_cm": n,
                      "stride_cn": 1, "stride_ck": GROUPS * m * n if split else 0, "stride_biasb": n if bias else 0,
                      "HAS_BIAS": bias}
            paths.append((f"{path}{' +bias' if bias else ''}",
                          {"modules": [f"{_KERNELS}.batched_gemm_bf16", f"{_KERNELS}.gemm.batched.batched_gemm_bf16"],
                           "kernel": "_batched_gemm_bf16_kernel", "values": values, "tensor_dtype": "bf16",
                           "tensors": {"c_ptr": "fp32"} if split else {}}))
    return paths


def gemm_a16w16_atomic(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """gemm_a16w16_atomic: NUM_KSPLIT > 1 adds partial sums atomically into a zeroed bf16 y; the wrapper's
    SPLITK_BLOCK_SIZE is cdiv(K, NUM_KSPLIT), BLOCK_SIZE_K untouched (gemm_a16w16_atomic.py)."""
    m, paths = _bucket_m(key), []
    for path, n, k in _even_and_uneven_k(shape):
        chosen = {"NUM_KSPLIT": 1, "cache_modifier": None, **config}
        chosen["SPLITK_BLOCK_SIZE"] = -(-k // chosen["NUM_KSPLIT"])
        values = {**chosen, "M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": 1, "stride_bn": k,
                  "stride_cm": n, "stride_cn": 1}
        paths.append((path, {"modules": [f"{_KERNELS}.gemm_a16w16_atomic", f"{_KERNELS}.gemm.basic.gemm_a16w16_atomic"],
                             "kernel": "_gemm_a16_w16_atomic_kernel", "values": values, "tensor_dtype": "bf16"}))
    return paths


def _activation_paths(shape: tuple[int, int] | None) -> list[tuple[str, int, int, str | None]]:
    """(path, N, K, activation): both K branches without activation, then each activation the wrapper accepts on
    the K-tail branch (the heavier one: masked loads besides the activation's registers)."""
    branches = _even_and_uneven_k(shape)
    return ([(path, n, k, None) for path, n, k in branches]
            + [(f"{branches[-1][0]} +{name}", branches[-1][1], branches[-1][2], name) for name in ACTIVATIONS])


def gemm_a16w16_gated(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """gemm_a16w16_gated: the first half of W's N gates the second; y is (M, N // 2)."""
    m, paths = _bucket_m(key), []
    for path, n, k, activation in _activation_paths(shape):
        values = {**config, "M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": 1, "stride_bn": k,
                  "stride_cm": n // 2, "stride_cn": 1, "activation": _activation(activation),
                  "use_activation": activation is not None}
        paths.append((path, {"modules": [f"{_KERNELS}.gemm_a16w16_gated", f"{_KERNELS}.gemm.basic.gemm_a16w16_gated"],
                             "kernel": "_gemm_a16_w16_gated_kernel", "values": values, "tensor_dtype": "bf16"}))
    return paths


def ff_a16w16_fused(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """FF-A16W16-fused serves two wrappers, ff_a16w16_fused_gated (w_up (N, K), w_down (N // 2, K)) and
    ff_a16w16_fused_ungated (w_down (N, K)); both atomically add y = act(x @ w_up.T) @ w_down into a zeroed bf16 y
    (M, K). Their K is the model dimension, N the intermediate one."""
    m, paths = _bucket_m(key), []
    for kernel in ("gated", "ungated"):
        for path, n, k, activation in _activation_paths(shape):
            values = {**config, "M": m, "N": n, "K": k, "stride_xm": k, "stride_xk": 1, "stride_w1k": 1,
                      "stride_w1n": k, "stride_w2n": k, "stride_w2k": 1, "stride_ym": k, "stride_yk": 1,
                      "activation": _activation(activation), "use_activation": activation is not None}
            module = f"ff_a16w16_fused_{kernel}"
            modules = [f"{_KERNELS}.{module}", f"{_KERNELS}.gemm.feed_forward.{module}"]
            paths.append((f"{kernel} {path}", {"modules": modules, "kernel": f"_{module}", "values": values,
                                               "tensor_dtype": "bf16"}))
    return paths


def _gmm_paths(flags: tuple[str, ...]) -> list[tuple[str, set[str]]]:
    """Each flag alone, none, and all together: the flags act on separate parts of the kernel (operand layout, K
    tail, bias, tile scheduling)."""
    return [("base", set())] + [(flag, {flag}) for flag in flags] + [("all", set(flags))]


def gmm(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """The GMM file's ``<variant>.<case>``: gmm (lhs (M, K) @ rhs (G, K, N), persistent, GRID_DIM programs), ptgmm
    (persistent) and nptgmm (grid (G, tiles)) computing (K, M) @ (M, N) -> (G, K, N); ``accumulate`` (v0.1.16 on) is
    the config ptgmm/nptgmm read with ACCUMULATE. Flags from gmm.py: TRANS_RHS / TRANS_LHS (rhs or lhs
    column-major), USE_BIAS / COMPUTE_BIAS_GRAD (fp32 bias_grad), WORK_STEALING (int32 tile counter); K %
    BLOCK_SIZE_K decides gmm's K_DIVISIBLE_BY_BLOCK_SIZE_K. group_sizes are int32, the wrappers' default and 0.1.7's
    only type (int64, accepted from v0.1.16, fails 0.1.7's kernel: one recipe serves both, so it is not compiled).
    0.1.7's kernels take none of bias, accumulate or work stealing: the worker drops them."""
    variant, case = key.split(".")
    flags = (("TRANS_RHS", "K % BLOCK_SIZE_K != 0", "USE_BIAS", "WORK_STEALING") if variant == "gmm"
             else ("TRANS_LHS", "COMPUTE_BIAS_GRAD"))
    kernel = {"gmm": "gmm_kernel", "ptgmm": "tgmm_persistent_kernel", "nptgmm": "tgmm_non_persistent_kernel"}[variant]
    paths = []
    for path, on in _gmm_paths(flags):
        k = GEMM_K_UNEVEN if "K % BLOCK_SIZE_K != 0" in on else GEMM_K
        values = {**config, "M": GROUPS * 512, "K": k, "N": GEMM_N, "G": GROUPS,
                  "TRANS_RHS": "TRANS_RHS" in on, "TRANS_LHS": "TRANS_LHS" in on, "USE_BIAS": "USE_BIAS" in on,
                  "WORK_STEALING": "WORK_STEALING" in on, "COMPUTE_BIAS_GRAD": "COMPUTE_BIAS_GRAD" in on,
                  "ACCUMULATE": case == "accumulate"}
        paths.append((path, {"modules": [f"{_KERNELS}.gmm"], "kernel": kernel, "values": values, "tensor_dtype": "bf16",
                             "tensors": {"group_sizes_ptr": "int32", "tile_counter_ptr": "int32",
                                         "bias_grad_ptr": "fp32"}}))
    return paths

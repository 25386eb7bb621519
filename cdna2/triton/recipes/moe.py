"""AITER's fused MoE GEMM (``fused_moe`` in ``moe_op.py``): how its wrapper launches a kernel from one config of a
``moe/{arch}-MOE-{dtype}.json`` file (its small_M / medium_M / large_M buckets, picked by
``utils/moe_config_utils.get_optimal_moe_config``).

Read from ``aiter/ops/triton/moe_op.py`` (0.1.7) and ``aiter/ops/triton/moe/moe_op.py`` (0.1.16 to 0.1.20.post1,
the same kernels): a weight quantised in groups (``block_shape[1] > 0``, int8 or int4) takes
``_fused_moe_kernel_gptq_awq``; everything else ``_fused_moe_kernel``; ``moe_set_use_persistent_kernel(True)``
swaps each for its persistent twin. The kernel's ``EVEN_K`` heuristic is ``K % BLOCK_SIZE_K == 0``: a hidden size
that BLOCK_SIZE_K does not divide takes the masked loads. ``NUM_XCDS`` is ``device_info.get_num_xcds()``, which
returns 8 on every device (gfx90a too): the remapping stays a permutation of the grid on one die. The top-1
sigmoid routing (``moe_routing_sigmoid_top1_fused.py``) has its own file and lookup, at the end.
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import GEMM_K, GEMM_K_UNEVEN, GEMM_N, Path

KERNELS = "aiter.ops.triton._triton_kernels"


def _modules(name: str) -> list[str]:
    """The kernel module in 0.1.7's flat layout, and in the moe/ package from 0.1.16 on."""
    return [f"{KERNELS}.{name}", f"{KERNELS}.moe.{name}"]


TOP_K, AITER_XCDS = 2, 8  # vLLM's Mixtral-like top-2; get_num_xcds()'s constant
# moe_op.fused_moe's persistent grid: multi_processor_count * 2 of the running device (an MI210's 104 CUs); it
# only bounds the persistent loop's stride, so one value serves the proof of every host.
PERSISTENT_PROGRAMS = 2 * 104
INDEX_TENSORS = {"sorted_token_ids_ptr": "int32", "expert_ids_ptr": "int32", "num_tokens_post_padded_ptr": "int32",
                 "topk_weights_ptr": "fp32"}


def _request(config: dict, kernel: str, k: int, tensors: dict, values: dict, module: str) -> dict:
    chosen = {**config, "N": GEMM_N, "K": k, "stride_ak": 1, "stride_bk": 1, "stride_cn": 1, "top_k": TOP_K,
              "NUM_XCDS": AITER_XCDS, **values}
    if kernel.startswith("_fused_moe_persistent"):
        chosen["NUM_SMS"] = PERSISTENT_PROGRAMS
    return {"modules": _modules(module), "kernel": kernel, "values": chosen, "tensor_dtype": "bf16",
            "tensors": {**INDEX_TENSORS, **tensors}, "language_dtypes": {"compute_type": "bf16"}}


def _plain(config: dict, k: int, routed: bool, persistent: bool = False, module: str = "moe_op",
           int8: bool = False) -> dict:
    """``_fused_moe_kernel`` (or its persistent twin; fused_moe_silu's and fused_moe_gelu's, fed the same config by
    AITER's tests): bf16, or int8 weights with a scale per output channel."""
    kernel = {"moe_op_silu_fused": "_fused_moe_silu_kernel"}.get(module, "_fused_moe_kernel")
    if persistent:
        kernel = "_fused_moe_persistent_kernel"
    values = {"group_n": 0, "group_k": 0, "BLOCK_SCALE": False, "MUL_ROUTED_WEIGHT": routed, "use_fp8_w8a8": False,
              "use_int8_w8a16": int8}
    tensors = {"a_scale_ptr": "fp32", "b_scale_ptr": "fp32"}
    if int8:  # the per-channel scale is fp32 (AITER's tests: quantize_int8), the grouped ones bf16
        tensors["b_ptr"] = "int8"
    return _request(config, kernel, k, tensors, values, module)


def _grouped(config: dict, k: int, group_size: int, int4: bool, zero_point: bool, silu: bool = False) -> dict:
    """``_fused_moe_kernel_gptq_awq``: int4 (two per byte) or int8 weights, scales (and zero points) per group."""
    # fused_moe_silu's launch adds block_k_diviable = K % BLOCK_SIZE_K == 0 (the hidden size, A.shape[1])
    values = {"group_size": group_size, "block_k_diviable": k % config["BLOCK_SIZE_K"] == 0,
              "MUL_ROUTED_WEIGHT": False, "has_zp": zero_point,
              "use_int4_w4a16": int4, "use_int8_w8a16": not int4}
    weight = "uint8" if int4 else "int8"
    tensors = {"b_ptr": weight, "b_scale_ptr": "bf16", "b_zp_ptr": weight}
    if silu:
        return _request(config, "_fused_moe_silu_kernel_gptq_awq", k, tensors, values, "moe_op_silu_fused")
    return _request(config, "_fused_moe_kernel_gptq_awq", k, tensors, values, "moe_op")


# A hidden size BLOCK_SIZE_K divides (EVEN_K) and one it does not (4000: divisible by 32, not by 64); a grouped
# weight's K is a multiple of its group size, so the masked path is compiled with 32-wide groups.
def moe_bf16(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    return [("bf16 EVEN_K routed", _plain(config, GEMM_K, routed=True)),
            ("bf16 K % BLOCK_SIZE_K != 0", _plain(config, GEMM_K_UNEVEN, routed=False)),
            ("bf16 persistent", _plain(config, GEMM_K, routed=True, persistent=True)),
            ("bf16 SiLU-fused", _plain(config, GEMM_K, routed=False, module="moe_op_silu_fused")),
            ("bf16 GELU-fused", _plain(config, GEMM_K, routed=False, module="moe_op_gelu"))]


def moe_int8_w8a16(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    return [("int8 per-channel EVEN_K", _plain(config, GEMM_K, routed=True, int8=True)),
            ("int8 per-channel K % BLOCK_SIZE_K != 0", _plain(config, GEMM_K_UNEVEN, routed=False,
                                                              int8=True)),
            ("int8 grouped (128) EVEN_K", _grouped(config, GEMM_K, 128, int4=False, zero_point=False)),
            ("int8 per-channel SiLU-fused", _plain(config, GEMM_K, routed=False, module="moe_op_silu_fused",
                                                   int8=True))]


def moe_int4_w4a16(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    return [("int4 grouped (128) EVEN_K, zero points", _grouped(config, GEMM_K, 128, int4=True, zero_point=True)),
            ("int4 grouped (32) K % BLOCK_SIZE_K != 0", _grouped(config, GEMM_K_UNEVEN, 32, int4=True,
                                                                 zero_point=False)),
            ("int4 grouped (128) SiLU-fused", _grouped(config, GEMM_K, 128, int4=True, zero_point=False,
                                                       silu=True))]



def _routing(config: dict, experts: int, shared_expert: bool) -> dict:
    values = {**config, "K": GEMM_K, "N": experts, "BLOCK_N": experts, "TOPK": 1,
              "FUSED_SHARED_EXPERTS": shared_expert, "stride_xk": 1, "stride_wn": 1, "stride_topk_ids_n": 1,
              "stride_topk_weights_n": 1}
    return {"modules": _modules("moe_routing_sigmoid_top1_fused"), "kernel": "_routing_sigmoid_top1_kernel",
            "values": values, "tensor_dtype": "bf16", "tensors": {"topk_ids_ptr": "int32", "topk_weights_ptr": "fp32"}}


def moe_routing_sigmoid_top1(config: dict, bucket: str, shape: tuple[int, int] | None) -> list[Path]:
    """``bucket``: ``N16.<M>`` or ``N128.<M>``. routing_sigmoid_top1 launches with BLOCK_N = N, the expert count;
    _get_config picks "N16" for N <= 16, else "N128" (BLOCK_N a power of two: 32 to 128). Both with and without
    the fused shared expert (a wider TOPK)."""
    experts = 16 if bucket.startswith("N16.") else 128
    return [(f"{experts} experts", _routing(config, experts, shared_expert=False)),
            (f"{experts} experts, fused shared expert", _routing(config, experts, shared_expert=True))]

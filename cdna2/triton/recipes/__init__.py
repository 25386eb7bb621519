"""How AITER launches each op's Triton kernel from one config: the kernel, and the arguments its wrapper passes.

A recipe turns one config of a config file (and its dotted key in that file) into the compiles that prove it: one
per code path AITER's wrapper and heuristics can take with that config (``EVEN_K`` true and false, causal or not,
head dims with a positional part, dropout, fp32), each as a worker request (``cdna2.triton.worker``). The wrapper's
own arithmetic on the config (split-K sizes) is repeated here, read from the AITER source; arguments a release's
kernel does not take are dropped by the worker, so one recipe serves the releases whose kernels differ by a flag.
"""

from __future__ import annotations

from collections.abc import Callable

from cdna2.triton.recipes import (attention, conv, delta_attention, gemm, mhc, moe, norm, rope, sizes,
                                  unified_attention)

# One module per op family; a new family's module is added here and to MODULES (the proof's cache key reads them).
MODULES = (sizes, gemm, attention, moe, conv, mhc, unified_attention, rope, norm, delta_attention)
# A recipe is f(config, key, shape, **host_inputs): the keyword arguments are the values AITER's wrapper reads from
# the device at run time, named by the op's host_inputs in the rules (the host's, never MI300X's).
RECIPES: dict[str, Callable[..., list[sizes.Path]]] = {
    "gemm_a16w16": gemm.gemm_a16w16, "mha_fwd": attention.mha_fwd,
    "batched_gemm_a16w16": gemm.batched_gemm_a16w16, "gemm_a16w16_atomic": gemm.gemm_a16w16_atomic,
    "gemm_a16w16_gated": gemm.gemm_a16w16_gated, "ff_a16w16_fused": gemm.ff_a16w16_fused, "gmm": gemm.gmm,
    "extend_attention": attention.extend_attention, "lean_attention": attention.lean_attention,
    "mla_decode_rope": attention.mla_decode_rope, "hstu_attention_fwd": attention.hstu_attention_fwd,
    "hstu_attention_bwd": attention.hstu_attention_bwd,
    "moe_bf16": moe.moe_bf16, "moe_int8_w8a16": moe.moe_int8_w8a16, "moe_int4_w4a16": moe.moe_int4_w4a16,
    "moe_routing_sigmoid_top1": moe.moe_routing_sigmoid_top1,
    "conv_1x1": conv.conv_1x1, "conv_3x3_nhwc": conv.conv_3x3_nhwc, "conv_3x3_cblocked": conv.conv_3x3_cblocked,
    "conv_general": conv.conv_general, "conv_winograd_gemm": conv.conv_winograd_gemm,
    "conv_winograd_input": conv.conv_winograd_input, "conv_winograd_output": conv.conv_winograd_output,
    "mhc_fused_sinkhorn": mhc.mhc_fused_sinkhorn, "mhc_post": mhc.mhc_post,
    "unified_attention": unified_attention.unified_attention, "rope_cached_2c_inplace": rope.rope_cached_2c_inplace,
    "fused_add_rmsnorm_pad": norm.fused_add_rmsnorm_pad, "chunk_gla_fwd_o": delta_attention.chunk_gla_fwd_o}
# Ops whose wrapper chooses the config in code, per call: recipe name -> the calls vLLM makes, each with the config
# the wrapper picks on a host of that many CUs (``{case: config}``); each is compiled by RECIPES[name] as it is.
# chunk_gla_fwd_o's is the fallback its kernel is registered with where the arch has no config file.
IN_CODE: dict[str, Callable[[int], dict[str, dict]]] = {"unified_attention": unified_attention.cases,
                                                        "rope_cached_2c_inplace": rope.cases,
                                                        "fused_add_rmsnorm_pad": norm.cases,
                                                        "chunk_gla_fwd_o": delta_attention.cases}

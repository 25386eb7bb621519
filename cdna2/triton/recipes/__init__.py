"""How AITER launches each op's Triton kernel from one config: the kernel, and the arguments its wrapper passes.

A recipe turns one config of a config file into the compiles that prove it: one per code path AITER's wrapper and
heuristics can take with that config (``EVEN_K`` true and false, causal or not, head dims with a positional part,
dropout, fp32), each as a worker request (``cdna2.triton.worker``). The wrapper's own arithmetic on the config
(split-K sizes) is repeated here, read from the AITER source; arguments a release's kernel does not take are
dropped by the worker, so one recipe serves the releases whose kernels differ by a flag.
"""

from __future__ import annotations

from collections.abc import Callable

from cdna2.triton.recipes import attention, gemm, norm, rope, sizes, unified_attention

# One module per op family; a new family's module is added here and to MODULES (the proof's cache key reads them).
MODULES = (sizes, gemm, attention, unified_attention, rope, norm)
RECIPES: dict[str, Callable[[dict, str, tuple[int, int] | None], list[sizes.Path]]] = {
    "gemm_a16w16": gemm.gemm_a16w16, "mha_fwd": attention.mha_fwd,
    "unified_attention": unified_attention.unified_attention, "rope_cached_2c_inplace": rope.rope_cached_2c_inplace,
    "fused_add_rmsnorm_pad": norm.fused_add_rmsnorm_pad}
# Ops whose wrapper chooses the config in code, per call: recipe name -> the calls vLLM makes, each with the config
# the wrapper picks on a host of that many CUs (``{case: config}``); each is compiled by RECIPES[name] as it is.
IN_CODE: dict[str, Callable[[int], dict[str, dict]]] = {"unified_attention": unified_attention.cases,
                                                        "rope_cached_2c_inplace": rope.cases,
                                                        "fused_add_rmsnorm_pad": norm.cases}

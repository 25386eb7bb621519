"""How AITER launches each op's Triton kernel from one config: the kernel, and the arguments its wrapper passes.

A recipe turns one config of a config file (and its dotted key in that file) into the compiles that prove it: one per code path AITER's wrapper and
heuristics can take with that config (``EVEN_K`` true and false, causal or not, head dims with a positional part,
dropout, fp32), each as a worker request (``cdna2.triton.worker``). The wrapper's own arithmetic on the config
(split-K sizes) is repeated here, read from the AITER source; arguments a release's kernel does not take are
dropped by the worker, so one recipe serves the releases whose kernels differ by a flag.
"""

from __future__ import annotations

from collections.abc import Callable

from cdna2.triton.recipes import attention, gemm, sizes

# One module per op family; a new family's module is added here and to MODULES (the proof's cache key reads them).
MODULES = (sizes, gemm, attention)
RECIPES: dict[str, Callable[[dict, str, tuple[int, int] | None], list[sizes.Path]]] = {
    "gemm_a16w16": gemm.gemm_a16w16, "mha_fwd": attention.mha_fwd,
    "batched_gemm_a16w16": gemm.batched_gemm_a16w16, "gemm_a16w16_atomic": gemm.gemm_a16w16_atomic,
    "gemm_a16w16_gated": gemm.gemm_a16w16_gated, "ff_a16w16_fused": gemm.ff_a16w16_fused, "gmm": gemm.gmm}

"""AITER's chunked (Kimi) delta attention, v0.1.20 on: its output kernel, the one of the op with a config file.

``chunk_kimi_delta_attn`` (``aiter/ops/triton/kimi_delta_attn/chunk_delta_attn.py``) runs
``_triton_kernels/chunk_delta_attn/chunk_fwd.py`` ``chunk_delta_attn_fwd``, whose last step, ``chunk_gla_fwd_o``
(``gla_output.py``), launches ``chunk_gla_fwd_kernel_o``: ``@triton.heuristics`` (``IS_VARLEN``: ``cu_seqlens`` is
given) over ``@triton.autotune`` over the kernel. With ``CHUNK_DELTA_ATTN_TRITON_AUTOTUNE`` off (the default) the
autotuner holds one config, read once when the module is imported (``chunk_delta_attn_utils.
chunk_delta_attn_tuned_config`` -> ``utils/tuned_config_utils.get_tuned_kernel_config``): the file's
``chunk_gla_fwd_kernel_o`` entry at ``configs/<arch>/triton/attention/chunk_delta_attn/DEFAULT.json``, else
``_FALLBACK_O_CONFIG`` written beside the kernel. v0.1.20, v0.1.20.post1 and main have the same text of these files.

What ``chunk_delta_attn_fwd`` passes: ``chunk_size`` 64 (32 only when the caller asks for it; the FlashKDA path that
an unset size would pick 32 for launches other kernels), ``use_exp2=True``, never ``transpose_state`` (the per-chunk
state ``h`` stays ``[K, V]``: chunk_delta_h.py), q, v, h, A (``Aqk``) and o in the input dtype, the gate cumsum in
fp32 (``chunk_gate_cumsum``/``chunk_local_cumsum``: ``output_dtype=torch.float``), ``cu_seqlens`` and the chunk
indices int64. Both dots (``q * exp2(g)`` by h, ``A`` by v) are in the input dtype; nothing is FP8.
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import HEAD_DIM, Q_HEADS, SEQ, Path

MODULES = ["aiter.ops.triton._triton_kernels.chunk_delta_attn.gla_output"]
KERNEL = "chunk_gla_fwd_kernel_o"
# gla_output.py _FALLBACK_O_CONFIG: what the kernel runs on an arch without the file (gfx90a without the set)
FALLBACK = {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 1}


def _request(config: dict, *, head: int = HEAD_DIM, chunk: int = 64, varlen: bool = False,
             value_heads: int = Q_HEADS) -> dict:
    values = {"T": SEQ, "H": Q_HEADS, "HV": value_heads, "K": head, "V": head, "BT": chunk, "USE_EXP2": True,
              "TRANSPOSE_STATE": False, "scale": head ** -0.5}
    if not varlen:
        values.update(cu_seqlens=None, chunk_indices=None)
    return {"modules": MODULES, "kernel": KERNEL, "values": values, "autotune": config, "tensor_dtype": "bf16",
            "tensors": {"q": "bf16", "v": "bf16", "h": "bf16", "o": "bf16", "A": "bf16", "g": "fp32",
                        **({"cu_seqlens": "int64", "chunk_indices": "int64"} if varlen else {})}}


def chunk_gla_fwd_o(config: dict, key: str, shape: tuple[int, ...] | None) -> list[Path]:
    """The ``chunk_gla_fwd_kernel_o`` entry (the file's only one): bf16, Kimi Linear's 128-wide heads, fixed-length
    and varlen (serving stacks pass ``cu_seqlens``), the 32-token chunk, and AITER's tests' 64-wide heads with twice
    as many value heads (GVA)."""
    if key != KERNEL:
        raise ValueError(f"chunk_delta_attn DEFAULT.json entry {key!r}: no launch recipe (only {KERNEL})")
    return [("bf16 head 128, chunk 64", _request(config)),
            ("bf16 varlen head 128, chunk 64", _request(config, varlen=True)),
            ("bf16 head 128, chunk 32", _request(config, chunk=32)),
            ("bf16 head 64, GVA, chunk 64", _request(config, head=64, value_heads=2 * Q_HEADS))]


def cases(compute_units: int) -> dict[str, dict]:
    """Without the file: the fallback the kernel is registered with, the same on every host."""
    return {KERNEL: dict(FALLBACK)}

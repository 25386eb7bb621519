"""AITER's cached rotary embedding as vLLM calls it: ``rope_cached_thd_positions_offsets_2c_fwd_inplace``.

vLLM's ``_triton_rotary_embedding_impl`` (vllm/_aiter_ops.py, 0.23.0 through 0.34.0) imports it from
``aiter.ops.triton.rope.rope`` (AITER 0.1.10 on; 0.1.7 has ``aiter/ops/triton/rope.py`` instead, so vLLM's import
fails there) and passes the whole head as the rotary part, ``reuse_freqs_front_part=True``, ``nope_first=False``,
positions, and offsets or None. ``_rope_cached_thd_2c_fwd`` (aiter/ops/triton/rope/rope.py, the same text from
0.1.16 to main) picks one of three kernels and its tiles from the shapes, in code; the cases repeat that choice.
"""

from __future__ import annotations

from cdna2.triton.recipes.sizes import KV_HEADS, Q_HEADS, Path

MODULES = ["aiter.ops.triton._triton_kernels.rope.rope"]
NEOX, GPTJ = 0, 1  # RotateStyle; vLLM: 0 if is_neox else 1


def _next_power_of_2(value: int) -> int:
    return 1 << (value - 1).bit_length()


def _choice(tokens: int, q_heads: int, kv_heads: int, style: int) -> dict:
    """_rope_cached_thd_2c_fwd's kernel and launch values (no nope part: cos is head/2 wide and reused)."""
    if q_heads == kv_heads:
        split_t = (_next_power_of_2(tokens) + 31) // 32
        minimum = 4096 if tokens >= 8192 else 1024 if tokens >= 1024 else 512
        size = q_heads
        if split_t < minimum:
            while ((_next_power_of_2(q_heads) + size - 1) // size) * split_t < minimum and size > 1:
                size //= 2
        return {"kernel": "_rope_kernel_thd_cached_2c_fwd", "BLOCK_T": 32, "SPLIT_H_SIZE": size, "num_warps": 4,
                "waves_per_eu": 0, "num_stages": 2 if size > 1 else 1}
    if style == GPTJ and tokens >= 1024:
        per_group = q_heads // kv_heads
        return {"kernel": "_rope_kernel_cached_thd_2c_gqa_fwd", "BLOCK_T": 32, "QH_per_G": per_group,
                "num_warps": 4, "waves_per_eu": 0, "num_stages": 2 if per_group > 1 else 1}
    return {"kernel": "_rope_kernel_cached_thd_2c_gqa_onehead_fwd", "BLOCK_T": min(max(_next_power_of_2(tokens), 16),
                                                                                     32),
            "G": kv_heads, "num_warps": 4, "waves_per_eu": 0}


def cases(compute_units: int) -> dict[str, dict]:
    """Decode and prefill, GQA and MHA, NeoX and GPT-J styles, head dims 64 and 128, with and without offsets
    (the choice does not depend on the host)."""
    found = {}
    for head in (64, 128):
        for name, tokens, q_heads, kv_heads, style, offsets in (
                ("gqa neox decode", 8, Q_HEADS, KV_HEADS, NEOX, False),
                ("gqa neox prefill", 2048, Q_HEADS, KV_HEADS, NEOX, True),
                ("gqa gptj prefill", 2048, Q_HEADS, KV_HEADS, GPTJ, False),
                ("mha neox prefill", 2048, Q_HEADS, Q_HEADS, NEOX, False)):
            found[f"{name} hd{head}"] = {"head": head, "tokens": tokens, "style": style, "offsets": offsets,
                                         **_choice(tokens, q_heads, kv_heads, style)}
    return found


def rope_cached_2c_inplace(case: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    values = {name: value for name, value in case.items() if name not in ("kernel", "head", "tokens", "style",
                                                                           "offsets")}
    values.update({"T": case["tokens"], "HAVE_NOPE": False, "NOPE_FIRST": False, "INPLACE": True,
                   "REUSE_FREQS_FRONT_PART": True, "IS_NEOX": case["style"] == NEOX, "HAVE_POS": True,
                   "HAVE_OFFS": case["offsets"], "BLOCK_D": case["head"], "BLOCK_D_HALF": case["head"] // 2})
    return [(case["kernel"], {"modules": MODULES, "kernel": case["kernel"], "values": values, "tensor_dtype": "bf16",
                              "tensors": {"pos_ptr": "int64", "off_ptr": "int64"}})]

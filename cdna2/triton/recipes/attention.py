"""AITER's attention kernels (MHA, extend, lean, MLA decode, HSTU): how their wrappers launch the kernel from one
config."""

from __future__ import annotations

import bisect
import math

from cdna2.triton.recipes.sizes import BF16_MAX, FP32_MAX, HEAD_DIM, KV_HEADS, PE_DIM, Q_HEADS, SEQ, Path

# utils/device_info.py get_num_xcds(): "you can't query this programmatically", 8 on every release (0.1.7 to main),
# so AITER's wrappers pass 8 on a one-die MI210 too; the recipes pass what AITER passes.
NUM_XCDS = 8


def _mha_request(config: dict, *, dtype: str = "bf16", pe: bool = False, dropout: bool = False,
                 causal: bool = False, varlen: bool = False) -> dict:
    values = {**config, "SEQLEN_Q": SEQ, "SEQLEN_K": SEQ, "IS_CAUSAL": causal, "NUM_Q_HEADS": Q_HEADS,
              "NUM_K_HEADS": KV_HEADS, "BLOCK_DMODEL": HEAD_DIM, "BLOCK_DMODEL_POW2": HEAD_DIM,
              "BLOCK_DMODEL_PE": PE_DIM if pe else 0, "RETURN_SCORES": False, "ENABLE_DROPOUT": dropout,
              "IS_FP8": False, "FP8_MAX": FP32_MAX if dtype == "fp32" else BF16_MAX, "VARLEN": varlen, "BATCH": 1,
              "NUM_XCD": NUM_XCDS, "SWIZZLE": "default", "USE_INT64_STRIDES": False, "ENABLE_SINK": False,
              "SLIDING_WINDOW": False, "sm_scale": 1 / math.sqrt(HEAD_DIM), "dropout_p": 0.1 if dropout else 0.0,
              "philox_seed": 1234, "philox_offset_base_in": 5678}
    head = HEAD_DIM + (PE_DIM if pe else 0)
    for tensor, heads in (("q", Q_HEADS), ("k", KV_HEADS), ("v", KV_HEADS), ("o", Q_HEADS)):
        width = HEAD_DIM if tensor in "vo" else head
        values.update({f"stride_{tensor}z_in": SEQ * heads * width, f"stride_{tensor}h_in": width,
                       f"stride_{tensor}{'m' if tensor in 'qo' else 'n'}_in": heads * width,
                       f"stride_{tensor}{'n' if tensor == 'o' else 'k'}_in": 1})
    return {"modules": ["aiter.ops.triton._triton_kernels.mha", "aiter.ops.triton._triton_kernels.attention.mha"],
            "kernel": "_attn_fwd", "values": values, "tensor_dtype": dtype,
            "tensors": {"cu_seqlens_q": "int32", "cu_seqlens_k": "int32", "softmax_lse_ptr": "fp32",
                        "descale_q_ptr": "fp32", "descale_k_ptr": "fp32", "descale_v_ptr": "fp32",
                        "alibi_slopes_ptr": "fp32", "s_dmask_ptr": "fp32", "dropout_mask_ptr": "fp32",
                        "sink_ptr": "fp32"}}


def mha_fwd(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """``fwd.<key>`` of the MHA file: which of _get_config's cases it serves decides the paths."""
    key = key.rsplit(".", 1)[-1]
    pe = key.startswith("pe")
    if key.endswith("dropout_or_fp32"):
        return [("dropout bf16" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dropout=True)),
                ("fp32" + (" +pe" if pe else ""), _mha_request(config, pe=pe, dtype="fp32"))]
    return [("bf16 causal varlen" + (" +pe" if pe else ""), _mha_request(config, pe=pe, causal=True, varlen=True)),
            ("bf16 non-causal" + (" +pe" if pe else ""), _mha_request(config, pe=pe))]



def _strides(prefix: str, heads: int, width: int, token: str, head: str = "h") -> dict:
    """A (tokens, heads, width) tensor's token and head strides, named as the kernel names them."""
    return {f"stride_{prefix}{token}": heads * width, f"stride_{prefix}{head}": width}


def _extend_request(config: dict, *, lq: int, lv: int, dtype: str = "bf16", causal: bool = True,
                    custom_mask: bool = False, logit_cap: float = 0.0) -> dict:
    # attention/extend_attention.py extend_attention_fwd (0.1.7: extend_attention.py): head dims 576, 288 and 192
    # split into a power-of-two part and a positional part, others padded to a power of two
    dmodel, dpe = {576: (512, 64), 288: (256, 32), 192: (128, 64)}.get(lq, (1 << (lq - 1).bit_length(), 0))
    values = {**config, "sm_scale": lq ** -0.5, "kv_group_num": Q_HEADS // KV_HEADS, "logit_cap": logit_cap,
              "Lq": lq, "Lv": lv, "BLOCK_DMODEL": dmodel, "BLOCK_DPE": dpe, "BLOCK_DV": 1 << (lv - 1).bit_length(),
              "USE_CUSTOM_MASK": custom_mask, "IS_CAUSAL": causal, "SKIP_PREFIX_CUSTOM_MASK": True,
              "STORE_TRANSPOSE": True, "NUM_Q_HEADS": Q_HEADS, "NUM_BLOCKS": -(-SEQ // config["BLOCK_M"]),
              "NUM_XCDS": NUM_XCDS,
              **_strides("q", Q_HEADS, lq, "bs"), **_strides("k", KV_HEADS, lq, "bs"),
              **_strides("v", KV_HEADS, lv, "bs"), **_strides("o", Q_HEADS, lv, "bs"),
              **_strides("buf_k", KV_HEADS, lq, "bs"), **_strides("buf_v", KV_HEADS, lv, "bs")}
    return {"modules": ["aiter.ops.triton._triton_kernels.extend_attention",
                        "aiter.ops.triton._triton_kernels.attention.extend_attention"],
            "kernel": "_fwd_kernel", "values": values, "tensor_dtype": dtype,
            "tensors": {**dict.fromkeys(("Q_Extend", "K_Extend", "V_Extend", "O_Extend", "K_Buffer", "V_Buffer"),
                                        dtype),
                        **dict.fromkeys(("qo_indptr", "kv_indptr", "kv_indices", "mask_indptr"), "int32"),
                        "mask_ptr": "bool"}}


def extend_attention(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """``_get_config(HEAD_SIZE, dtype)``: ``large_head_or_fp32`` for a head above 192 or fp32, else ``default``."""
    if key == "large_head_or_fp32":
        return [("bf16 causal head 576 (512 + 64 positional, MLA)", _extend_request(config, lq=576, lv=512)),
                ("fp32 causal head 128", _extend_request(config, lq=128, lv=128, dtype="fp32"))]
    return [("bf16 causal head 128", _extend_request(config, lq=128, lv=128)),
            ("bf16 custom mask, logit cap, head 192 (128 + 64 positional)",
             _extend_request(config, lq=192, lv=128, causal=False, custom_mask=True, logit_cap=30.0))]


def _lean_schedule(causal: bool, batch: int, n_ctx_q: int, n_ctx_k: int, heads: int, block_m: int, block_n: int,
                   programs: int, xcd_remap: bool) -> dict:
    """attention/lean_atten.py get_num_splits_and_buffer_sizes and calculate_max_output_tiles_analytically
    (0.1.7: lean_atten.py; the same arithmetic on every release): the kernel's schedule constexprs."""
    m_blocks, n_blocks = -(-n_ctx_q // block_m), -(-n_ctx_k // block_n)
    causal = causal and n_ctx_q != 1
    if causal:
        per_head = batch * sum(((i + 1) * block_m + block_n - 1) // block_n for i in range(m_blocks))
    else:
        per_head = m_blocks * n_blocks
    tiles = per_head * (heads // NUM_XCDS if xcd_remap else heads)
    grid = min((tiles + 1) // 2, (32 * tiles + n_blocks - 1) // n_blocks) if tiles <= programs else programs
    xcd_programs = grid // NUM_XCDS if xcd_remap else grid
    per_wg = -(-tiles // xcd_programs)
    if tiles % xcd_programs == 0:
        splits = 1 + (n_blocks + per_wg - 2) // per_wg
    else:
        splits = 1 + (n_blocks + per_wg - 3) // (per_wg - 1)
    high = tiles - (per_wg - 1) * xcd_programs
    masked = block_m // block_n
    if causal:  # ping-pong order of the output tiles (CAUSAL_MODE 0)
        bounds, total = [], 0
        for i in range(m_blocks):
            total += ((i // 2 if i % 2 == 0 else m_blocks - 1 - i // 2) + 1) * masked
            bounds.append(total)
        most = 0
        for wg in range(grid):
            start = per_wg * wg if wg < high else (per_wg - 1) * (wg - high) + high * per_wg
            end = start + (per_wg if wg < high else per_wg - 1)
            count = 0
            for head in range(start // per_head, (end - 1) // per_head + 1):
                first = head * per_head
                low, top = max(start, first) - first, min(end, first + per_head) - first
                count += bisect.bisect_right(bounds, top - 1) - bisect.bisect_right(bounds, low) + 1
            most = max(most, count)
    else:
        most = -(-heads * batch // grid) + 4
    return {"num_m_blocks": m_blocks, "num_n_blocks": n_blocks // batch, "high_load_wgs": high,
            "max_tiles_per_wg": per_wg, "tiles_per_head": per_head, "total_programs": grid, "num_splits": splits,
            "max_output_tile_cnt": most}


def _lean_request(config: dict, num_sms: int, *, causal: bool, batch: int, n_ctx_q: int, n_ctx_k: int) -> dict:
    # attention/lean_atten.py persistent_lean_attention: total_programs = get_num_sms() * SM_CNT_FACTOR, the host's
    # CU count read from the device; BLOCK_M/BLOCK_N/XCD_REMAP/num_warps/waves_per_eu from the config
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    schedule = _lean_schedule(causal, batch, n_ctx_q, n_ctx_k * batch, Q_HEADS, block_m, block_n,
                              num_sms * config["SM_CNT_FACTOR"], config["XCD_REMAP"])
    values = {**config, **schedule, "is_pod": False, "pod_pid": 0, "n_ctx_q_rows": n_ctx_q,
              "SM_SCALE": HEAD_DIM ** -0.5, "HEADS_PER_XCD": Q_HEADS // NUM_XCDS, "HEAD_DIM_ORIG": HEAD_DIM,
              "HEAD_DIM": HEAD_DIM, "BLOCK_M": block_m, "BLOCK_N": block_n, "MASKED_BLOCKS": block_m // block_n,
              "NUM_XCDS": NUM_XCDS, "batch_size": batch, "causal": causal, "num_stages": 1,
              "gqa_group_size": Q_HEADS // KV_HEADS, "use_64_indexing": False, "RAGGED_BATCH": False,
              **_strides("q", Q_HEADS, HEAD_DIM, "m"), "stride_qk": 1, **_strides("k", KV_HEADS, HEAD_DIM, "n"),
              "stride_kk": 1, **_strides("v", KV_HEADS, HEAD_DIM, "n"), "stride_vk": 1,
              **_strides("o", Q_HEADS, HEAD_DIM, "m"), "stride_on": 1, "stride_oph": n_ctx_q * HEAD_DIM,
              "stride_opm": HEAD_DIM, "stride_opn": 1}
    return {"modules": ["aiter.ops.triton._triton_kernels.lean_atten",
                        "aiter.ops.triton._triton_kernels.attention.lean_atten"],
            "kernel": "la_persistent", "values": values, "tensor_dtype": "bf16",
            "tensors": {**dict.fromkeys(("Q", "K", "V", "Out"), "bf16"), **dict.fromkeys(("Mp", "Lp", "Op"), "fp32"),
                        **dict.fromkeys(("batch_num_block_n", "locks"), "int32")}}


def lean_attention(config: dict, key: str, shape: tuple[int, int] | None, *, num_sms: int) -> list[Path]:
    """The one ``any`` config serves causal prefill and decode (``num_sms``: the host's CU count)."""
    return [("bf16 causal prefill", _lean_request(config, num_sms, causal=True, batch=1, n_ctx_q=SEQ,
                                                  n_ctx_k=SEQ)),
            ("bf16 decode, batch 8", _lean_request(config, num_sms, causal=False, batch=8, n_ctx_q=16,
                                                   n_ctx_k=SEQ))]


# DeepSeek's MLA: the latent KV (kv_lora_rank) and its rotary part, 16 query heads per rank over one latent head
MLA_RANK, MLA_ROPE, MLA_HEADS, MLA_SPLITS, MLA_BATCH = 512, 64, 16, 8, 32


def _mla_request(config: dict, stage: str, *, dtype: str = "bf16", rope: bool = True) -> dict:
    modules = ["aiter.ops.triton._triton_kernels.mla_decode_rope",
               "aiter.ops.triton._triton_kernels.attention.mla_decode_rope"]
    if stage == "fwd_kernel_stage2":
        # attention/mla_decode_rope.py _decode_softmax_reducev_fwd: BLOCK_DV from v_buffer's width
        values = {**config, "NUM_KV_SPLITS": MLA_SPLITS, "BLOCK_DV": MLA_RANK, "Lv": MLA_RANK,
                  "batch": MLA_BATCH, "head_num": MLA_HEADS, "stride_mid_ob": MLA_HEADS * MLA_SPLITS * (MLA_RANK + 1),
                  "stride_mid_oh": MLA_SPLITS * (MLA_RANK + 1), "stride_mid_os": MLA_RANK + 1,
                  "stride_obs": MLA_HEADS * MLA_RANK, "stride_oh": MLA_RANK}
        return {"modules": modules, "kernel": "_fwd_kernel_stage2", "values": values, "tensor_dtype": dtype,
                "tensors": {"Mid_O": "fp32", "O": dtype, "kv_indptr": "int32"}}
    # _decode_grouped_att_m_fwd_rope: BLOCK_C and BLOCK_R the next powers of two of the latent and rotary widths
    width = MLA_RANK + MLA_ROPE
    values = {**config, "sm_scale": (128 + MLA_ROPE) ** -0.5, "stride_qb": MLA_HEADS * width, "stride_qh": width,
              "stride_buf_kbs": width, "stride_buf_vbs": width,
              "stride_mid_ob": MLA_HEADS * MLA_SPLITS * (MLA_RANK + 1), "stride_mid_oh": MLA_SPLITS * (MLA_RANK + 1),
              "stride_mid_os": MLA_RANK + 1, "stride_kpe_tokens_out_b": MLA_ROPE if rope else 0,
              "stride_cos_sin_cache_s": MLA_ROPE if rope else 0, "stride_positions_b": 1 if rope else 0,
              "rotary_dim": MLA_ROPE, "kv_lora_rank": MLA_RANK, "qk_rope_head_dim": MLA_ROPE,
              "kv_group_num": MLA_HEADS, "q_head_num": MLA_HEADS, "batch": MLA_BATCH, "BLOCK_C": MLA_RANK,
              "BLOCK_R": MLA_ROPE, "NUM_KV_SPLITS": MLA_SPLITS, "logit_cap": 0.0, "USE_ROPE": rope,
              "IS_NEOX_STYLE": False}
    return {"modules": modules, "kernel": "_fwd_grouped_kernel_stage1_rope", "values": values, "tensor_dtype": dtype,
            "tensors": {**dict.fromkeys(("Q", "K_Buffer", "V_buffer", "cos_sin_cache", "k_pe_t_out"), dtype),
                        "positions": "int64", "Att_Out": "fp32",
                        **dict.fromkeys(("kv_indptr", "kv_indices"), "int32")}}


def mla_decode_rope(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
    """``decode_attention_fwd_grouped_rope``: each stage's section; fp32 tensors take the base stage-1 section where
    the file has no ``_fp32`` one (gfx942's has none; 0.1.7 always takes the base one)."""
    if key == "fwd_kernel_stage2":
        return [("bf16", _mla_request(config, key)), ("fp32", _mla_request(config, key, dtype="fp32"))]
    return [("bf16 rope fused", _mla_request(config, key)), ("bf16 no rope", _mla_request(config, key, rope=False)),
            ("fp32 rope fused", _mla_request(config, key, dtype="fp32"))]


HSTU_HEADS, HSTU_DIM = 4, 128  # generative-recommender HSTU: attention and linear dims of 128


def _hstu_request(config: dict, kernel: str, *, causal: bool, masks: bool) -> dict:
    # attention/hstu_attention.py triton_hstu_attention_fwd/_bwd (0.1.7: hstu_attention.py): the mask flags follow
    # the optional inputs (num_targets, contextual_seq_len, max_attn_len, sort_by_length); 0.1.7's kernel also
    # takes Z/AUTOTUNE_Z/AUTOTUNE_MAX_SEQ_LEN/DimQ/DimV scalars, which later kernels do not (dropped there)
    values = {**config, "alpha": 1 / HSTU_DIM, "H": HSTU_HEADS, "MAX_SEQ_LEN": SEQ, "contextual_seq_len": 8 * masks,
              "max_attn_len": 1024 * masks, "CAUSAL": causal, "HAS_MULTIPLE_TARGETS": masks,
              "HAS_CONTEXTUAL_SEQ_LEN": masks, "HAS_MAX_ATTN_LEN": masks, "HAS_SORT_BY_LENGTH_INDICES": masks,
              "ALLOW_TF32": False, "BLOCK_D_Q": HSTU_DIM, "BLOCK_D_V": HSTU_DIM, "Z": 64, "AUTOTUNE_Z": 64,
              "AUTOTUNE_MAX_SEQ_LEN": SEQ, "DimQ": HSTU_DIM, "DimV": HSTU_DIM}
    tensors = {**dict.fromkeys(("Q", "K", "V"), "bf16"),
               **dict.fromkeys(("sort_by_length_indices", "seq_offsets", "num_targets"), "int64")}
    names = ["q", "k", "v"]
    if kernel == "_hstu_attn_fwd":
        values.update(DeltaSize=0, IS_DELTA_Q=False)
        tensors["Out"] = "bf16"
        names.append("o")
    else:
        tensors.update(dict.fromkeys(("DOut", "DQ", "DK", "DV"), "bf16"), LOCK="int32")
        names += ["do", "dq", "dk", "dv"]
    for name in names:
        token = "m" if name in ("q", "o", "do", "dq") else "n"
        values.update(_strides(name, HSTU_HEADS, HSTU_DIM, token))
    return {"modules": ["aiter.ops.triton._triton_kernels.hstu_attention",
                        "aiter.ops.triton._triton_kernels.attention.hstu_attention"],
            "kernel": kernel, "values": values, "tensor_dtype": "bf16", "tensors": tensors}


def _hstu(kernel: str):
    def recipe(config: dict, key: str, shape: tuple[int, int] | None) -> list[Path]:
        """Every batch bucket's config: causal with every optional mask input, and non-causal without any."""
        return [("bf16 causal, targets/contextual/max-len/sorted",
                 _hstu_request(config, kernel, causal=True, masks=True)),
                ("bf16 non-causal", _hstu_request(config, kernel, causal=False, masks=False))]
    return recipe


hstu_attention_fwd, hstu_attention_bwd = _hstu("_hstu_attn_fwd"), _hstu("_hstu_attn_bwd")

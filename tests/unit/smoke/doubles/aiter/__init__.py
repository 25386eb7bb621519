"""TEST DOUBLE of AITER (amd-aiter), installed as the fixture host's ``aiter`` package: no MI210 and no ROCm exist
here, so the ASM kernels cannot run. It computes what AITER documents, on CPU torch, and prints load lines as
AITER's loader does, so the smoke test's GPU half runs end to end.

What it keeps from amd-aiter 0.1.7.post2.dev18 (read from the wheel): the signatures of ``flash_attn_func``,
``flash_attn_varlen_func`` and ``pa_fwd_asm``; ``AITER_ASM_DIR`` set at import to ``<aiter_meta>/hsa/gfx90a/``
(``aiter/jit/core.py``); batched calls with seqlen_q <= 128 going to CK (no load line); sliding-window calls
going to CK; the load line ``[aiter] hipModuleLoad: <AITER_ASM_DIR><co> GetFunction: <symbol>`` written to fd 1
once per process per code object (``AiterAsmKernel`` in ``aiter_hip_common.h``); a JIT build's lock taken with
``os.open(O_CREAT|O_EXCL)`` and held open (``FileBaton``). The arithmetic follows the kernels' rounding points:
fp32 scores and accumulation, softmax weights rounded to bf16 before they multiply V, a bf16 output.

``CDNA2_AITER_DOUBLE`` (JSON) makes calls misbehave the ways a broken port does:
``{"faults": {"<entry>:<causal|full>:<seqlen_q>": FAULT}}`` (``pa_fwd_asm:full:1`` for the decode call), FAULT
being ``zero_rows`` (rows 256-511 of head 0 of the first sequence zeroed), ``drop_last_keys`` (the last 64 keys of
every sequence ignored), ``five_percent`` (every output 5% off), ``fallback`` (correct, but no load line: a
fallback computed it), ``hang`` (in a ``smoke_gpu run`` or ``bench_gpu run`` process: take a JIT lock, start a
"compiler" grandchild, never return), ``crash`` (in such a process: die with SIGSEGV, as a bad code object does) or
``slow`` (correct, but every call takes SLOW_MS longer: a throttled or degraded GPU). ``paged_attention_rocm``
(AITER's HIP decode kernel, the benchmarks' decode fallback) takes the same faults under
``paged_attention_rocm:full:1``. ``gemm_a8w8_CK`` (CK INT8 GEMM) logs AITER's JIT import line for
``module_gemm_a8w8`` on stderr once per process, as ``aiter/jit/core.py`` does, and takes them under
``gemm_a8w8_CK:full:<M>`` (``fallback``: no import line). The other families' entries (``topk_softmax_asm``,
``gemm_a16w16_asm``, ``layernorm2d_with_add_asm``, ``aiter.mla.mla_decode_fwd``, ``aiter.fused_moe_bf16_asm.asm_moe``)
compute their torch semantics, print their load lines and take ``five_percent``, ``zero_rows``, ``fallback`` and
the process faults under ``<entry>:full:<size>`` (their docstrings say which size). The Triton GEMM
``aiter.ops.triton.gemm_a16w16`` (the module vLLM imports it from) announces its launch to Triton's launch-enter
hook, as Triton's launcher does, and takes them under ``gemm_a16w16:full:<M>`` (``fallback``: no launch); so do
``aiter.ops.triton.rope.rope.rope_cached_thd_positions_offsets_2c_fwd_inplace`` (NeoX or GPT-J, in place, under
``rope:full:<tokens>``) and ``aiter.ops.triton.unified_attention.unified_attention`` (paged, causal, a window from
window_size; the 2d kernel with a window or KV up to 512, else the 3d one and its reduction, as AITER chooses; under
``unified_attention:causal:<max_seqlen_q>``).
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
AITER_META_DIR = os.path.abspath(os.path.join(_HERE, "..", "aiter_meta"))
AITER_ASM_DIR = f"{AITER_META_DIR}/hsa/gfx90a/"
os.environ["AITER_ASM_DIR"] = AITER_ASM_DIR
JIT_BUILD_DIR = os.path.join(_HERE, "jit", "build")
_BEHAVIOUR = json.loads(os.environ.get("CDNA2_AITER_DOUBLE", "{}"))
_LOADED = set()
SLOW_MS = 300


def _load(code_object, symbol, fault):
    if fault == "fallback" or code_object in _LOADED:
        return
    _LOADED.add(code_object)
    os.write(1, f"[aiter] hipModuleLoad: {AITER_ASM_DIR}{code_object} GetFunction: {symbol} Success\n".encode())


def _hang_if_asked(fault):
    """The faults that act before the call computes anything: ``hang``, ``crash``, ``slow``."""
    if fault == "slow":
        torch.cuda._sleep(int(SLOW_MS * 1e6))  # a kernel that keeps the device busy SLOW_MS longer
    if fault not in ("hang", "crash") or sys.argv[1:2] != ["run"]:
        return
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    os.makedirs(JIT_BUILD_DIR, exist_ok=True)
    os.open(os.path.join(JIT_BUILD_DIR, "lock_module_fmha_v3_fwd"), os.O_CREAT | os.O_EXCL)  # held, never released
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # the build's compiler
    time.sleep(3600)


def _fault(entry, causal, seqlen):
    return _BEHAVIOUR.get("faults", {}).get(f"{entry}:{'causal' if causal else 'full'}:{seqlen}")


def _in_sequence(fault, sequence):
    """The fault as it applies to the ``sequence``-th sequence of a call (rows are zeroed in the first only)."""
    return None if fault == "zero_rows" and sequence > 0 else fault


def _attention(q, k, v, causal, window, scale, fault):
    """One sequence: q ``[seq_q, heads_q, dim]``, k and v ``[seq_k, heads_kv, dim]``; bf16 ``[seq_q, heads_q, dim]``."""
    group = q.shape[1] // k.shape[1]
    q32 = q.float().transpose(0, 1)
    k32 = k.float().transpose(0, 1).repeat_interleave(group, dim=0)
    v32 = v.float().transpose(0, 1).repeat_interleave(group, dim=0)
    scores = q32 @ k32.transpose(1, 2) * scale
    rows = torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])  # causal: aligned bottom right
    keys = torch.arange(k.shape[0])[None, :]
    keep = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool)
    if causal:
        keep &= keys <= rows
    if window is not None:
        keep &= keys > rows - 1 - window
    if fault == "drop_last_keys":
        keep &= keys < k.shape[0] - 64
    scores = scores.masked_fill(~keep, -math.inf)
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    out = (weights.to(torch.bfloat16).float() @ v32) / weights.sum(dim=-1, keepdim=True)
    out = out.transpose(0, 1)
    if fault == "zero_rows":
        out[256:512, 0] = 0.0
    if fault == "five_percent":
        out = out * 1.05
    return out.to(torch.bfloat16)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), bias=None,
                    alibi_slopes=None, deterministic=True, return_lse=False, return_attn_probs=False,
                    how_v3_bf16_cvt=1, cu_seqlens_q=None, cu_seqlens_kv=None):
    fault = _fault("flash_attn_func", causal, q.shape[1])
    _hang_if_asked(fault)
    scale = softmax_scale or q.shape[-1] ** -0.5
    if q.shape[1] > 128:
        _load(f"fmha_v3_fwd/MI300/fwd_hd128_bf16{'_causal' if causal else ''}_rtna.co",
              f"_ZN5aiter{'fmha_fwd_hd128_bf16' + ('_causal' if causal else '') + '_rtna'}E", fault)
    out = torch.empty_like(q)  # AITER's C++ allocates its output: torch::empty, the caching allocator
    for index in range(q.shape[0]):
        out[index] = _attention(q[index], k[index], v[index], causal, None, scale, _in_sequence(fault, index))
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q=0,
                           dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False,
                           window_size=(-1, -1), bias=None, alibi_slopes=None, deterministic=False, return_lse=False,
                           return_attn_probs=False, how_v3_bf16_cvt=1, block_table=None, out=None,
                           cu_seqlens_q_padded=None, cu_seqlens_k_padded=None):
    fault = _fault("flash_attn_varlen_func", causal, max_seqlen_q)
    _hang_if_asked(fault)
    scale = softmax_scale or q.shape[-1] ** -0.5
    left = window_size[0] if window_size[0] < max_seqlen_k else -1
    sliding = left > 0
    if not sliding:
        _load(f"fmha_v3_fwd/MI300/fwd_hd128_bf16{'_causal' if causal else ''}_rtna_group.co",
              f"_ZN5aiter{'fmha_fwd_hd128_bf16' + ('_causal' if causal else '') + '_rtna_group'}E", fault)
    if out is None:
        out = torch.empty_like(q)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for index in range(len(starts_q) - 1):
        rows, keys = slice(starts_q[index], starts_q[index + 1]), slice(starts_k[index], starts_k[index + 1])
        out[rows] = _attention(q[rows], k[keys], v[keys], causal, left if sliding else None, scale,
                               _in_sequence(fault, index))
    return out


def pa_fwd_asm(Q, K, V, block_tables, context_lens, block_tables_stride0, max_qlen=1, K_QScale=None, V_QScale=None,
               out_=None, qo_indptr=None, high_precision=1, kernelName=None):
    fault = _fault("pa_fwd_asm", False, max_qlen)
    _hang_if_asked(fault)
    blocks, heads_kv, _, block, x = K.shape
    dim = Q.shape[-1]
    _load(f"pa/pa_bf16_noquant_gqa{Q.shape[1] // heads_kv}_1tg_4w.co", "_ZN5aiter27pa_bf16_noquant_gqa8_1tg_4wE",
          fault)
    keys = K.permute(0, 1, 3, 2, 4).reshape(blocks, heads_kv, block, dim)  # from [blocks, kv, dim/x, block, x]
    values = V.permute(0, 1, 2, 4, 3).reshape(blocks, heads_kv, block, dim)  # from [blocks, kv, block/x, dim, x]
    out = out_ if out_ is not None else torch.empty_like(Q)
    for seq, length in enumerate(context_lens.tolist()):
        table = block_tables[seq].long()
        seq_keys = keys[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].transpose(0, 1)
        seq_values = values[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].transpose(0, 1)
        out[seq] = _attention(Q[seq][None], seq_keys, seq_values, False, None, dim ** -0.5, None)[0]
    return out


def paged_attention_rocm(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                         block_tables, context_lens, block_size, max_context_len, alibi_slopes, kv_cache_dtype,
                         k_scale, v_scale, fp8_out_scale=None, partition_size=256, mtp=1, q_scale=None):
    """AITER's HIP decode kernel (no code object, no load line): K ``[blocks, kv, dim/x, block, x]`` as for
    ``pa_fwd_asm``, V in vLLM's layout ``[blocks, kv, dim, block]``; writes ``out``."""
    fault = _fault("paged_attention_rocm", False, 1)
    _hang_if_asked(fault)
    blocks, heads_kv, _, block, x = key_cache.shape
    dim = query.shape[-1]
    keys = key_cache.permute(0, 1, 3, 2, 4).reshape(blocks, heads_kv, block, dim)
    values = value_cache.permute(0, 1, 3, 2)  # to [blocks, kv, block, dim]
    for seq, length in enumerate(context_lens.tolist()):
        table = block_tables[seq].long()
        seq_keys = keys[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].transpose(0, 1)
        seq_values = values[table].permute(1, 0, 2, 3).reshape(heads_kv, -1, dim)[:, :length].transpose(0, 1)
        out[seq] = _attention(query[seq][None], seq_keys, seq_values, False, None, scale, fault)[0]
    return out


def gemm_a8w8_CK(XQ, WQ, x_scale, w_scale, bias=None, dtype=torch.bfloat16, splitK=None):
    """CK INT8 GEMM: exact integer products, then the scales, one rounding to ``dtype``; AITER allocates Y."""
    fault = _fault("gemm_a8w8_CK", False, XQ.shape[0])
    _hang_if_asked(fault)
    if fault != "fallback" and "module_gemm_a8w8" not in _LOADED:
        _LOADED.add("module_gemm_a8w8")
        os.write(2, f"[aiter] import [module_gemm_a8w8] under {_HERE}/jit/module_gemm_a8w8.so\n".encode())
    out = torch.empty(XQ.shape[0], WQ.shape[0], dtype=dtype)
    exact = (XQ.double() @ WQ.double().T) * x_scale.double() * w_scale.double()
    out.copy_(exact * (1.05 if fault == "five_percent" else 1.0))
    return out


def _fault_of(entry, size):
    fault = _fault(entry, False, size)
    _hang_if_asked(fault)
    return fault


def _wrong(out, fault):
    """The output faults of the entries below: ``five_percent`` (every output 5% off) and ``zero_rows`` (the first
    row zeroed)."""
    if fault == "five_percent":
        out.mul_(1.05)
    if fault == "zero_rows":
        out.view(-1, out.shape[-1])[0] = 0
    return out


def topk_softmax_asm(topk_weights, topk_indices, token_expert_indices, gating_output, need_renorm):
    """``topksoftmax/topksoftmax_4x128x8.co`` (0.1.7's pick for 128 experts, top 8); faults under
    ``topk_softmax_asm:full:<tokens>``."""
    fault = _fault_of("topk_softmax_asm", gating_output.shape[0])
    topk = topk_weights.shape[1]
    _load(f"topksoftmax/topksoftmax_4x{gating_output.shape[1]}x{topk}.co", "_ZN5aiter21topksoftmax_4x128x8E", fault)
    weights, ids = gating_output.float().softmax(dim=-1).topk(topk, dim=-1)
    if need_renorm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    topk_weights.copy_(_wrong(weights, fault))
    topk_indices.copy_(ids)


def gemm_a16w16_asm(A, B, out, bias=None, splitK=None, kernelName=None):
    """``bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co``: fp32 accumulation of bf16 products into ``out``; faults under
    ``gemm_a16w16_asm:full:<M>``."""
    fault = _fault_of("gemm_a16w16_asm", A.shape[0])
    _load("bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co", "_ZN5aiter28bf16gemm_outf32_tn_32x64_pf3E", fault)
    out.copy_(_wrong(A.float() @ B.float().T, fault))
    return out


def layernorm2d_with_add_asm(out, input, residual_in, residual_out, weight, bias, epsilon, x_bias=None):
    """``layer_norm.co``: the residual sum in fp32 (written rounded), LayerNorm of it; faults under
    ``layernorm2d_with_add_asm:full:<rows>``."""
    fault = _fault_of("layernorm2d_with_add_asm", input.shape[0])
    _load("layer_norm.co", "layer_norm_kernel_func", fault)
    summed = input.float() + residual_in.float()
    residual_out.copy_(summed)
    normed = torch.nn.functional.layer_norm(summed, (summed.shape[-1],), weight.float(), bias.float(), epsilon)
    out.copy_(_wrong(normed, fault))


def _mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                    sm_scale=None, logit_cap=0.0, num_kv_splits=None, **_):
    """aiter.mla.mla_decode_fwd for one query per sequence, page size 1, one latent KV head:
    ``mla/mla_dec_stage1_bf16_a16w16_subQ16_mqa16.co`` for 16 heads; faults under ``mla_decode_fwd:full:1``."""
    fault = _fault_of("mla_decode_fwd", max_seqlen_q)
    _load(f"mla/mla_dec_stage1_bf16_a16w16_subQ{q.shape[1]}_mqa{q.shape[1]}.co",
          "_ZN5aiter39mla_dec_stage1_bf16_a16w16_subQ16_mqa16E", fault)
    scale = sm_scale or q.shape[-1] ** -0.5
    bounds = kv_indptr.tolist()
    for seq in range(len(bounds) - 1):
        keys = kv_buffer[kv_indices[bounds[seq]:bounds[seq + 1]].long(), 0, 0].float()
        weights = (q[seq].float() @ keys.T * scale).softmax(dim=-1)
        o[seq] = _wrong(weights.to(torch.bfloat16).float() @ keys[:, :o.shape[-1]], fault)
    return o, None


def shuffle_weight(x, layout=(16, 16)):
    """The double keeps weights as they are: its asm_moe reads them so (AITER's kernels read the shuffled layout)."""
    return x


def _asm_moe(hidden_states, w1, w2, topk_weight, topk_ids, *args, **kwargs):
    """AITER's asm_moe for fp16 g1u0 weights (aiter.fmoe, ``fmoe_f16.co``): SiLU of the gate GEMM rounded to fp16,
    the down GEMM, weighted by the routing, summed; faults under ``asm_moe:full:<tokens>``."""
    fault = _fault_of("asm_moe", hidden_states.shape[0])
    _load("fmoe_f16.co", "fmoe_kernel_func", fault)
    out = torch.empty_like(hidden_states)  # moe_buf, from the caching allocator
    total = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for slot in range(topk_ids.shape[1]):
        for expert in range(w1.shape[0]):
            rows = topk_ids[:, slot] == expert
            if bool(rows.any()):
                act = torch.nn.functional.silu(hidden_states[rows].float() @ w1[expert].float().T).half().float()
                total[rows] += (act @ w2[expert].float().T) * topk_weight[rows, slot:slot + 1]
    out.copy_(_wrong(total, fault))
    return out


def _submodule(name, **attributes):
    """``aiter.<name>`` as a module of this double, importable by ``importlib.import_module``."""
    import types
    module = types.ModuleType(f"{__name__}.{name}")
    module.__dict__.update(attributes)
    sys.modules[module.__name__] = module
    return module


mla = _submodule("mla", mla_decode_fwd=_mla_decode_fwd)
fused_moe_bf16_asm = _submodule("fused_moe_bf16_asm", asm_moe=_asm_moe)
ops = _submodule("ops", shuffle=_submodule("ops.shuffle", shuffle_weight=shuffle_weight))


class _LaunchMetadata:
    """What Triton's launcher hands its launch-enter hook: ``get()`` gives the launch's fields."""

    def __init__(self, name):
        self._data = {"name": name, "function": None, "stream": 0}

    def get(self):
        return self._data


def _triton_gemm_a16w16(x, w, bias=None, dtype=torch.bfloat16, y=None, config=None, activation=None,
                        skip_reduce=False):
    """AITER's Triton bf16 GEMM (``aiter.ops.triton.gemm_a16w16``): fp32 accumulation, one rounding to ``dtype``,
    written into ``y`` when given; the launch is announced to Triton's launch-enter hook as the real launcher does
    (``fallback``: computed without it)."""
    fault = _fault("gemm_a16w16", False, x.shape[0])
    _hang_if_asked(fault)
    if fault != "fallback":
        _announce("_gemm_a16_w16_kernel")
    out = y if y is not None else torch.empty(x.shape[0], w.shape[0], dtype=dtype)
    out.copy_((x.float() @ w.float().T) * (1.05 if fault == "five_percent" else 1.0))
    return out


def _announce(*names):
    from triton import knobs

    for name in names:
        knobs.runtime.launch_enter_hook(_LaunchMetadata(name))


def _rope_inplace(x, y, cos, sin, positions, offsets, rotate_style, reuse_freqs_front_part, nope_first,
                  transpose_output=False):
    """AITER's cached rope, in place on ``x`` and ``y`` (``[tokens, heads, dim]``): fp32, one rounding to bf16."""
    fault = _fault("rope", False, x.shape[0])
    _hang_if_asked(fault)
    if fault != "fallback":
        _announce("_rope_kernel_cached_thd_2c_gqa_onehead_fwd" if x.shape[1] != y.shape[1]
                  else "_rope_kernel_thd_cached_2c_fwd")
    at = positions if offsets is None else positions + offsets
    c, s = cos[at].float()[:, None, :], sin[at].float()[:, None, :]
    for tensor in (x, y):
        if rotate_style == 0:  # NeoX: halves
            first, second = tensor.float().chunk(2, dim=-1)
            rotated = torch.cat([first * c - second * s, second * c + first * s], dim=-1)
        else:  # GPT-J: interleaved pairs
            first, second = tensor.float()[..., 0::2], tensor.float()[..., 1::2]
            rotated = torch.stack([first * c - second * s, second * c + first * s], dim=-1).flatten(-2)
        tensor.copy_(rotated * (1.05 if fault == "five_percent" else 1.0))


def _unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                       window_size, block_table, softcap, q_descale, k_descale, v_descale, **unused):
    """AITER's unified attention over a paged cache ``[blocks, block, kv_heads, dim]``, per sequence."""
    fault = _fault("unified_attention", causal, max_seqlen_q)
    _hang_if_asked(fault)
    if fault != "fallback":
        _announce(*(("kernel_unified_attention_2d",) if window_size[0] >= 0 or max_seqlen_k <= 512
                    else ("kernel_unified_attention_3d", "reduce_segments")))
    block = k.shape[1]
    for seq in range(len(seqused_k)):
        start, stop, length = int(cu_seqlens_q[seq]), int(cu_seqlens_q[seq + 1]), int(seqused_k[seq])
        table = block_table[seq, :-(-length // block)].long()
        keys = k[table].reshape(-1, k.shape[2], k.shape[3])[:length]
        values = v[table].reshape(-1, v.shape[2], v.shape[3])[:length]
        window = window_size[0] if window_size[0] >= 0 else None
        out[start:stop] = _attention(q[start:stop], keys, values, causal, window, softmax_scale,
                                     _in_sequence(fault, seq))
    return out


# ``aiter.ops.triton.gemm_a16w16``, ``.rope.rope`` and ``.unified_attention``: the modules vLLM imports them from.
ops.triton = _submodule("ops.triton", gemm_a16w16=_submodule("ops.triton.gemm_a16w16", gemm_a16w16=_triton_gemm_a16w16),
                        rope=_submodule("ops.triton.rope", rope=_submodule(
                            "ops.triton.rope.rope", rope_cached_thd_positions_offsets_2c_fwd_inplace=_rope_inplace)),
                        unified_attention=_submodule("ops.triton.unified_attention",
                                                     unified_attention=_unified_attention))

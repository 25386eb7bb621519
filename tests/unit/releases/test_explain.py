"""``python -m releases explain`` (issue 29): the interpretation of the gate runner's answers on hand-made outcomes, the
deploy report as the source of a host's vLLM, and (slow) the real runner on vLLM 0.33.0 for two model configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from releases import explain, gates

REPO = Path(__file__).resolve().parents[3]
MODELS = gates.MODELS
LLAMA, GEMMA = MODELS / "llama-full-attention.json", MODELS / "gemma3-interleaved-sliding.json"


def _config(path: Path) -> dict:
    return json.loads(path.read_text())


def _gate(is_open: bool, value: str = "") -> dict:
    return {"open": is_open, "value": value or repr(is_open), "error": None}


def _outcome(kinds: dict[str, int], prefer: str, explicit: dict, shuffle: bool = True,
             int8: bool = False) -> dict:
    gate_answers = {name: _gate(True) for name in explain.MHA_GATES}
    gate_answers[explain.SHUFFLE_GATE] = _gate(shuffle)
    gate_answers.update({name: _gate(int8) for name in explain.INT8_GATES})
    choices = {"prefer": {kind: {"backend": prefer} for kind in kinds},
               "stock order": {kind: {"backend": "ROCM_ATTN"} for kind in kinds},
               "explicit ROCM_AITER_FA": {kind: explicit for kind in kinds}}
    return {"ok": True, "result": {"detected": {"gcn_arch": "gfx90a"}, "gates": gate_answers,
                                   "selection": {"models": {"m": {"layers": kinds, "choices": choices}}}}}


def _shape(**overrides) -> dict:
    return {"head_size": 128, "heads": 32, "kv_heads": 4, "gqa": 8, "dtype": "bfloat16", "quantization": "none",
            **overrides}


def test_model_shape_reads_the_text_config_and_quantization():
    assert explain.model_shape(_config(GEMMA)) == {"head_size": 256, "heads": 16, "kv_heads": 8, "gqa": 2,
                                                   "dtype": "bfloat16", "quantization": "none"}
    assert explain.model_shape(_config(LLAMA))["head_size"] == 128
    int8 = {**_config(LLAMA), "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}}}}
    assert explain.model_shape(int8)["quantization"] == "int8"
    block = {**_config(LLAMA), "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert explain.model_shape(block)["quantization"] == "fp8-block"
    with pytest.raises(explain.ExplainError, match="num_attention_heads"):
        explain.model_shape({"hidden_size": 4096})


def test_full_attention_on_aiter_fa_reaches_fmha_v3_and_pa_fwd_asm():
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"})
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    [layer] = result["attention"]
    assert (layer["backend"], layer["prefill"]["kernel"], layer["decode"]["kernel"]) == \
        ("ROCM_AITER_FA", "fmha_v3_fwd", "pa_fwd_asm")
    assert "> 208 on an MI210" in layer["decode"]["why"]
    assert [entry["kernel"] for entry in result["code_objects"]] == ["fmha_v3_fwd", "pa_fwd_asm"]
    assert result["code_objects"][1]["code_objects"] == "hsa/gfx90a/pa/pa_bf16_noquant_gqa8_1tg_4w.co"
    text = explain.render(result, {"label": "host h", "environment": explain.SERVING_ENVIRONMENT})
    assert "32 full layers: attention backend ROCM_AITER_FA" in text and "prefill: fmha_v3_fwd" in text


def test_shuffle_layout_off_or_a_gqa_no_kernel_ships_keeps_decode_off_pa_fwd_asm():
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"}, shuffle=False)
    layer = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)["attention"][0]
    assert layer["decode"]["kernel"] == "AITER paged_attention_v1 (HIP)"
    assert "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1" in layer["decode"]["why"]
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"})
    layer = explain.interpret(outcome, "m", _shape(gqa=4), explain.SERVING_ENVIRONMENT)["attention"][0]
    assert layer["decode"]["kernel"] == "AITER paged_attention_v1 (HIP)" and "GQA 4" in layer["decode"]["why"]


def test_a_sliding_model_names_the_guard_and_reaches_no_code_object():
    refusal = {"refused": "Selected backend ... Reason: ['sliding-window attention (...) is served wrong by "
                          "ROCM_AITER_FA on gfx90a (silent corruption): serve this model with ROCM_ATTN or "
                          "TRITON_ATTN']"}
    outcome = _outcome({"full": 8, "sliding": 40}, "ROCM_ATTN", refusal)
    result = explain.interpret(outcome, "m", _shape(head_size=256), explain.SERVING_ENVIRONMENT)
    assert [layer["backend"] for layer in result["attention"]] == ["ROCM_ATTN", "ROCM_ATTN"]
    assert all(any(gates.GUARD_REASON in line for line in layer["decided_by"]) for layer in result["attention"])
    assert result["code_objects"] == []
    assert "provisioned code objects reached: none" in explain.render(
        result, {"label": "host h", "environment": explain.SERVING_ENVIRONMENT})


def test_aiter_fa_valid_but_not_first_says_what_would_put_it_first():
    outcome = _outcome({"full": 32}, "ROCM_ATTN", {"backend": "ROCM_AITER_FA"})
    layer = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)["attention"][0]
    assert layer["backend"] == "ROCM_ATTN"
    assert any("ROCM_AITER_FA is valid, but ROCM_ATTN comes first" in line and "vllm-prefer-aiter-fa" in line
               for line in layer["decided_by"])


def test_int8_linear_layers_reach_ck_only_with_every_int8_gate_open():
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"}, int8=True)
    result = explain.interpret(outcome, "m", _shape(quantization="int8"), explain.SERVING_ENVIRONMENT)
    assert result["linear"]["kernel"].startswith("AiterInt8ScaledMMLinearKernel -> CK int8 GEMM")
    assert "CK gemm_a8w8" in [entry["kernel"] for entry in result["code_objects"]]
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"}, int8=False)
    result = explain.interpret(outcome, "m", _shape(quantization="int8"), explain.SERVING_ENVIRONMENT)
    assert result["linear"]["kernel"] == "TritonInt8ScaledMMLinearKernel"
    assert "vllm-ck-int8-gemm" in result["linear"]["why"]


def test_unquantized_linear_layers_name_the_aiter_triton_gemm_only_with_its_gate_open():
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"})
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    assert result["linear"]["kernel"] == "unquantized GEMM (torch, hipBLASLt)"
    outcome["result"]["gates"][explain.TRITON_GEMM_GATE] = _gate(True)
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    assert result["linear"]["kernel"].startswith("AITER Triton gemm_a16w16")
    assert "aiter-triton-gfx90a" in result["linear"]["why"]


def test_rotary_embedding_and_unified_attention_name_aiter_triton_only_where_chosen():
    outcome = _outcome({"full": 32}, "ROCM_AITER_UNIFIED_ATTN", {"backend": "ROCM_AITER_FA"})
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    assert result["rotary"]["kernel"] == "vLLM's own rotary embedding"
    assert "vllm-aiter-triton-ops" in result["rotary"]["why"]
    [layer] = result["attention"]
    assert layer["prefill"]["kernel"].startswith("AITER Triton unified_attention") and layer["decode"] == layer["prefill"]
    assert result["code_objects"] == []  # no ASM code object on this path
    outcome["result"]["gates"][explain.TRITON_ROPE_GATE] = _gate(True)
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    assert result["rotary"]["kernel"] == "AITER Triton rope_cached_thd_positions_offsets_2c_fwd_inplace"
    assert "rotary embedding: AITER Triton rope" in explain.render(result, {"label": "x", "environment": {}})


def _report(tmp_path: Path, **row) -> Path:
    host = {"host": "mi210-a", "arch": "gfx90a", "packages": {"vllm": "0.23.0"},
            "details": {"patches vllm": {"status": "patched", "sets": ["vllm-attention-gate"]}}, **row}
    path = tmp_path / "latest.json"
    path.write_text(json.dumps({"mode": "deploy", "executed": True, "started": "2026-12-05T08:00:00+00:00",
                                "hosts": [host]}))
    return path


def test_host_target_comes_from_the_deploy_report(tmp_path):
    target = explain.host_target(_report(tmp_path), "mi210-a")
    assert (target["arch"], target["version"], target["sets"]) == ("gfx90a", "0.23.0", ["vllm-attention-gate"])
    with pytest.raises(explain.ExplainError, match="has no host mi210-z .it has mi210-a."):
        explain.host_target(_report(tmp_path), "mi210-z")
    with pytest.raises(explain.ExplainError, match="no settled vLLM version"):
        explain.host_target(_report(tmp_path, packages={"vllm": "0.23.0 -> 0.26.0"}), "mi210-a")
    with pytest.raises(explain.ExplainError, match="no vLLM patch plan"):
        explain.host_target(_report(tmp_path, details={}), "mi210-a")
    refused = _report(tmp_path, details={"patches vllm": {"status": "refused", "sets": ["vllm-attention-gate"]}})
    assert explain.host_target(refused, "mi210-a")["sets"] == []


def test_the_families_of_the_reached_code_objects_carry_the_hosts_verdicts(tmp_path):
    outcome = _outcome({"full": 32}, "ROCM_AITER_FA", {"backend": "ROCM_AITER_FA"})
    result = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)
    verdicts = {"fmha_v3_fwd": {"verdict": "proven", "reason": "fmha_v3_fwd_bf16_hd128, ... passed on this GPU"},
                "pa": {"verdict": "withheld", "reason": "pa_fwd_asm_bf16_block16_gqa8 wrong: WRONG: ..."}}
    families = explain.reached_families(result, verdicts)
    assert [(family["family"], family["verdict"]) for family in families] == [("fmha_v3_fwd", "proven"),
                                                                              ("pa", "withheld")]
    assert families[1]["judged"] == "withheld on this host: pa_fwd_asm_bf16_block16_gqa8 wrong: WRONG: ..."
    without_host = explain.reached_families(result, None)
    assert without_host[1]["judged"].startswith("proven on a host by GPU checks pa_fwd_asm_bf16_block16_gqa8;")
    assert explain.reached_families(result, {})[0]["judged"].startswith("not judged on this host")
    target = explain.host_target(_report(tmp_path, details={
        "patches vllm": {"status": "patched", "sets": []}, "families": verdicts}), "mi210-a")
    assert target["families"] == verdicts
    text = explain.render({**result, "families": families}, {"label": "mi210-a", "environment": {}})
    assert "    family pa: withheld on this host: pa_fwd_asm_bf16_block16_gqa8 wrong" in text


def test_command_refuses_a_config_without_a_shape_before_anything_runs(tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"model_type": "x"}))
    result = subprocess.run([sys.executable, "-m", "releases", "explain", "--config", str(config), "--vllm-version",
                             "0.33.0"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.startswith("explain: the model config has no usable num_attention_heads")


@pytest.mark.slow
def test_explain_on_vllm_033_names_backend_and_kernels_for_gemma_and_llama():
    """The real runner: vLLM 0.33.0 patched with the required set and the prefer set, on a pretend gfx90a."""
    sets = ["vllm-attention-gate", "vllm-prefer-aiter-fa"]
    llama = explain.explain(_config(LLAMA), "llama", "0.33.0", "gfx90a", sets, explain.SERVING_ENVIRONMENT)
    assert [(layer["kind"], layer["backend"]) for layer in llama["attention"]] == [("full", "ROCM_AITER_FA")]
    assert llama["attention"][0]["prefill"]["kernel"] == "fmha_v3_fwd"
    assert llama["attention"][0]["decode"]["kernel"] == "AITER paged_attention_v1 (HIP)"  # GQA 4: no pa kernel
    assert [entry["kernel"] for entry in llama["code_objects"]] == ["fmha_v3_fwd"]
    assert llama["patch_sets"] == sets
    gemma = explain.explain(_config(GEMMA), "gemma", "0.33.0", "gfx90a", sets, explain.SERVING_ENVIRONMENT)
    assert [(layer["kind"], layer["count"], layer["backend"]) for layer in gemma["attention"]] == \
        [("full", 8, "ROCM_ATTN"), ("sliding", 40, "ROCM_ATTN")]
    for layer in gemma["attention"]:
        assert any(gates.GUARD_REASON in line for line in layer["decided_by"]), layer["decided_by"]
    assert gemma["code_objects"] == []


def test_a_sliding_model_names_why_unified_attention_declines_it_without_the_hosts_record():
    refusal = {"refused": "Selected backend ... Reason: ['sliding-window attention (...) is served wrong by "
                          "ROCM_AITER_FA on gfx90a (silent corruption): ...']"}
    outcome = _outcome({"sliding": 40}, "ROCM_ATTN", refusal)
    declined = {"refused": f"Selected backend ... Reason: ['{gates.UNIFIED_GUARD_REASON} unless this host's GPU smoke "
                           f"test proved it on a sliding window (no record: ...)']"}
    outcome["result"]["selection"]["models"]["m"]["choices"][gates.EXPLICIT_UNIFIED] = {"sliding": declined}
    [layer] = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)["attention"]
    assert f"{gates.AITER_UNIFIED} (--attention-backend) refused: {declined['refused']}" in layer["decided_by"]
    # with the record of a passed smoke check the backend serves the model: nothing to say about a refusal
    outcome["result"]["selection"]["models"]["m"]["choices"][gates.EXPLICIT_UNIFIED] = {
        "sliding": {"backend": gates.AITER_UNIFIED}}
    [layer] = explain.interpret(outcome, "m", _shape(), explain.SERVING_ENVIRONMENT)["attention"]
    assert not any(gates.AITER_UNIFIED in line for line in layer["decided_by"])

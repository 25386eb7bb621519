"""``python -m releases explain``: the attention backend, kernels and provisioned code objects vLLM would use.

Given a model's ``config.json`` and either a host (as the deploy report last recorded it: arch, vLLM version, the
vLLM patch sets applied) or a vLLM release (patched with the required sets and any ``--set``), the gate runner of
``python -m releases gates`` (vllm_gates/runner.py) imports that release's real vLLM, patched as the host holds it,
on a pretend GPU of that arch, and asks vLLM's own selector which attention backend each kind of layer gets. This
module turns the runner's answers into the kernels that backend reaches for the model's shape (head size, dtype,
GQA, quantization), each with the gates that decided it (``interpret``, pure). Read from AITER's and vLLM's source,
not run (no GPU here): the prefill and decode paths inside ROCM_AITER_FA and their shape conditions (read from
AITER's attention dispatch), which are stated as conditions, never as runs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdna2.cache import cache_root
from cdna2.families import host_families
from cdna2.host.families import family_of
from cdna2.patches.catalog import load_catalog
from cdna2.patches.releases import load_releases
from lab import torchvenv
from releases import gates
from releases.gates import AITER_UNIFIED, EXPLICIT_UNIFIED, UNIFIED_GUARD_REASON

AITER_FA, ROCM_ATTN = "ROCM_AITER_FA", "ROCM_ATTN"
# The serving environment the project recommends on gfx90a (docs/serving.md): every AITER switch the
# translated kernels need. --env NAME=VALUE overrides one.
SERVING_ENVIRONMENT = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MHA": "1",
                       "VLLM_ROCM_USE_AITER_LINEAR": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
                       "VLLM_PREFER_AITER_FA": "1"}
MHA_GATES = ("rocm_aiter_ops.is_mha_enabled()", "AiterFlashAttentionBackend.supports_compute_capability()",
             "_get_backend_priorities() has ROCM_AITER_FA")
SHUFFLE_GATE = "rocm_aiter_ops.is_shuffle_kv_cache_enabled()"
INT8_GATES = ("rocm_aiter_ops.is_linear_enabled()", "AiterInt8ScaledMMLinearKernel.is_supported()",
              "rocm_aiter_w8a8_gemm op registered")
# The optional vllm-aiter-triton-ops set opens these on gfx90a, one AITER Triton op each.
TRITON_GEMM_GATE = "rocm_aiter_ops.is_triton_gemm_enabled()"
TRITON_ROPE_GATE = "rocm_aiter_ops.is_triton_rotary_embed_enabled()"
AITER_UNIFIED = "ROCM_AITER_UNIFIED_ATTN"
MI210_CUS = 104  # pa_fwd_asm runs only when num_seqs * num_heads > 2 * CUs (AITER's paged-attention dispatch)


class ExplainError(ValueError):
    """The command cannot answer; the message names the file or host and what to do."""


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def model_shape(config: dict) -> dict[str, Any]:
    """What the kernel choice depends on, read from a HF config.json (its text config for a multimodal model)."""
    text = _text_config(config)
    try:
        heads = int(text["num_attention_heads"])
        head_size = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as error:
        raise ExplainError(f"the model config has no usable num_attention_heads/head_dim/hidden_size ({error!r})")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    quantization = config.get("quantization_config") or text.get("quantization_config") or {}
    return {"head_size": head_size, "heads": heads, "kv_heads": kv_heads, "gqa": heads // kv_heads,
            "dtype": text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16",
            "quantization": _quantization(quantization)}


def _quantization(quantization: dict) -> str:
    """none, int8 (W8A8 int8, compressed-tensors), fp8-block, fp8 or the quant_method vLLM would name."""
    method = quantization.get("quant_method")
    if not method:
        return "none"
    if method == "compressed-tensors":
        weights = [group.get("weights") or {} for group in (quantization.get("config_groups") or {}).values()]
        if any(w.get("num_bits") == 8 and w.get("type") == "int" for w in weights):
            return "int8"
        if any(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights):
            return "fp8"
    if method == "fp8":
        return "fp8-block" if quantization.get("weight_block_size") else "fp8"
    return str(method)


def _gate(gates: dict, name: str) -> str:
    answer = gates.get(name)
    if answer is None:
        return f"{name}: not evaluated"
    if answer.get("error"):
        return f"{name}: error ({answer['error']})"
    return f"{name}: {'open' if answer['open'] else 'closed'} ({answer['value']})"


def _is_open(gates: dict, name: str) -> bool:
    answer = gates.get(name) or {}
    return bool(answer.get("open")) and not answer.get("error")


def _attention_kernels(backend: str, arch: str, shape: dict, gates: dict) -> tuple[dict, dict, list[dict]]:
    """Prefill and decode kernel of ``backend`` for this shape, and the provisioned code objects they reach."""
    hsa = f"hsa/{arch}"
    if backend == AITER_UNIFIED:
        kernel = {"kernel": "AITER Triton unified_attention (kernel_unified_attention_2d, or _3d and reduce_segments)",
                  "asm": False, "why": "ROCM_AITER_UNIFIED_ATTN serves prefill and decode with AITER's Triton kernels, "
                                       "their tiles chosen in code per call (proven by compiling for gfx90a: "
                                       "python -m cdna2 triton-configs)"}
        return kernel, dict(kernel), []
    if backend != AITER_FA:
        path = {ROCM_ATTN: "vLLM's ROCm attention (Triton prefill, HIP/Triton paged decode)",
                "TRITON_ATTN": "vLLM's Triton attention"}.get(backend, backend)
        kernel = {"kernel": path, "asm": False, "why": f"{backend} uses no AITER ASM code object"}
        return kernel, dict(kernel), []
    reached = []
    if shape["dtype"] == "bfloat16" and shape["head_size"] == 128:
        prefill = {"kernel": "fmha_v3_fwd", "asm": True,
                   "why": "AITER's flash_attn_varlen_func takes the ASM fmha_v3 path for bf16 and head_dim 128 "
                          "(the only shape the gfx942 tree ships and the AITER patch admits on gfx90a)"}
        reached.append({"kernel": "fmha_v3_fwd", "code_objects": f"{hsa}/fmha_v3_fwd/MI300/fwd_hd128_bf16*_group.co",
                        "when": "every prefill (varlen group mode)"})
    else:
        prefill = {"kernel": "AITER CK-tile mha_varlen_fwd", "asm": False,
                   "why": f"fmha_v3 ASM needs bf16 and head_dim 128; this model has {shape['dtype']}, head_dim "
                          f"{shape['head_size']}"}
    shuffle = _is_open(gates, SHUFFLE_GATE)
    if shape["head_size"] < 64:
        decode = {"kernel": "AITER Triton unified_attention", "asm": False,
                  "why": f"head_dim {shape['head_size']} < 64 (paged_attention_v1 needs 64)"}
    elif not shuffle:
        decode = {"kernel": "AITER paged_attention_v1 (HIP)", "asm": False,
                  "why": f"the shuffled KV cache layout is off ({_gate(gates, SHUFFLE_GATE)}); pa_fwd_asm needs it "
                         "(VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1)"}
    elif shape["dtype"] == "bfloat16" and shape["head_size"] == 128 and shape["gqa"] in (8, 16):
        decode = {"kernel": "pa_fwd_asm", "asm": True,
                  "why": f"shuffled KV layout on, bf16, head_dim 128, GQA {shape['gqa']}; AITER runs it only when "
                         f"num_seqs x num_heads > 2 x CUs (> {2 * MI210_CUS} on an MI210, so never at batch 1), "
                         "else paged_attention_v1, with block size 16"}
        reached.append({"kernel": "pa_fwd_asm", "code_objects": f"{hsa}/pa/pa_bf16_noquant_gqa{shape['gqa']}_1tg_4w.co",
                        "when": f"decode batches with num_seqs x {shape['heads']} heads > {2 * MI210_CUS}"})
    else:
        decode = {"kernel": "AITER paged_attention_v1 (HIP)", "asm": False,
                  "why": f"pa_fwd_asm ships bf16, head_dim 128, GQA 8 or 16; this model has {shape['dtype']}, "
                         f"head_dim {shape['head_size']}, GQA {shape['gqa']}"}
    return prefill, decode, reached


def _linear_kernel(shape: dict, gates: dict) -> tuple[dict, list[dict]]:
    quantization = shape["quantization"]
    if quantization == "none":
        if _is_open(gates, TRITON_GEMM_GATE):
            return {"kernel": "AITER Triton gemm_a16w16 for the shapes vLLM routes to it, else torch (hipBLASLt)",
                    "asm": False,
                    "why": f"no quantization_config, and {_gate(gates, TRITON_GEMM_GATE)}: use_aiter_triton_gemm takes "
                           "bf16/fp16 GEMMs of its listed (out, in) feature pairs (gpt-oss shapes) unless there are "
                           "more than 2048 tokens and 512 out features, with the gfx90a configs aiter-triton-gfx90a "
                           "installs"}, []
        return {"kernel": "unquantized GEMM (torch, hipBLASLt)", "asm": False,
                "why": "no quantization_config: vLLM's unquantized linear method, no AITER code object"}, []
    if quantization == "int8":
        decided = [_gate(gates, name) for name in INT8_GATES]
        if all(_is_open(gates, name) for name in INT8_GATES):
            return {"kernel": "AiterInt8ScaledMMLinearKernel -> CK int8 GEMM (module_gemm_a8w8)", "asm": False,
                    "why": "W8A8 int8 with every CK int8 gate open: " + "; ".join(decided)}, [
                {"kernel": "CK gemm_a8w8", "code_objects": "AITER JIT module module_gemm_a8w8 (built on the host "
                                                           "from the patched CK sources, not an hsa code object)",
                 "when": "every linear layer"}]
        return {"kernel": "TritonInt8ScaledMMLinearKernel", "asm": False,
                "why": "W8A8 int8, but a CK int8 gate is closed (enable the optional vllm-ck-int8-gemm and "
                       "aiter-ck-int8-gemm sets and VLLM_ROCM_USE_AITER_LINEAR=1): " + "; ".join(decided)}, []
    if quantization == "fp8-block":
        fast = next((name for name in gates if name.startswith("_gfx90a_fast_fp8_eligible")), None)
        how = (f"the gfx90a fast FP8 decode applies ({_gate(gates, fast)})" if fast and _is_open(gates, fast)
               else "software FP8 decode in vLLM's Triton block-scaled GEMM (the optional vllm-fast-fp8-dequant set "
                    "makes it faster)")
        return {"kernel": "Triton w8a8 block-scaled GEMM", "asm": False,
                "why": f"block FP8 on gfx90a, which has no FP8 hardware: {how}"}, []
    return {"kernel": f"{quantization}: not modelled here", "asm": False,
            "why": "explain models unquantized, W8A8 int8 and block-FP8 checkpoints"}, []


def interpret(outcome: dict, model: str, shape: dict, environment: dict[str, str]) -> dict[str, Any]:
    """One runner outcome (patched tree, one arch) -> the explanation of ``model``. Pure."""
    if not outcome.get("ok"):
        raise ExplainError(f"the gate runner failed: {outcome.get('error')}")
    result = outcome["result"]
    arch, gates = result["detected"]["gcn_arch"], result["gates"]
    selected = result["selection"]["models"][model]
    order = "prefer" if environment.get("VLLM_PREFER_AITER_FA") == "1" else "stock order"
    choices = selected["choices"][order]
    layers = []
    reached: list[dict] = []
    for kind, choice in choices.items():
        backend = choice.get("backend")
        if backend is None:
            raise ExplainError(f"vLLM's selector found no backend for the {kind} layers: "
                               f"{choice.get('refused') or choice.get('error')}")
        explicit = selected["choices"]["explicit ROCM_AITER_FA"][kind]
        decided = [_gate(gates, name) for name in MHA_GATES]
        if "refused" in explicit:
            decided.append(f"ROCM_AITER_FA refused: {explicit['refused']}")
        unified = selected["choices"].get(EXPLICIT_UNIFIED, {}).get(kind, {})
        if UNIFIED_GUARD_REASON in unified.get("refused", ""):  # vllm-aiter-triton-ops: the host's record decides
            decided.append(f"{AITER_UNIFIED} (--attention-backend) refused: {unified['refused']}")
        elif backend != AITER_FA:
            decided.append(f"ROCM_AITER_FA is valid, but {backend} comes first in vLLM's priority list "
                           f"(VLLM_PREFER_AITER_FA={environment.get('VLLM_PREFER_AITER_FA', 'unset')}; with the "
                           "optional vllm-prefer-aiter-fa set applied, 1 puts ROCM_AITER_FA first)")
        prefill, decode, kernels = _attention_kernels(backend, arch, shape, gates)
        reached += [entry for entry in kernels if entry not in reached]
        layers.append({"kind": kind, "count": selected["layers"][kind], "backend": backend, "prefill": prefill,
                       "decode": decode, "decided_by": decided})
    linear, kernels = _linear_kernel(shape, gates)
    reached += kernels
    return {"model": model, "arch": arch, "order": order, "shape": shape, "attention": layers, "linear": linear,
            "rotary": _rotary_kernel(gates), "code_objects": reached}


def _rotary_kernel(gates: dict) -> dict:
    if _is_open(gates, TRITON_ROPE_GATE):
        return {"kernel": "AITER Triton rope_cached_thd_positions_offsets_2c_fwd_inplace", "asm": False,
                "why": f"{_gate(gates, TRITON_ROPE_GATE)}: RotaryEmbedding calls AITER's Triton rope in place"}
    return {"kernel": "vLLM's own rotary embedding", "asm": False,
            "why": f"{_gate(gates, TRITON_ROPE_GATE)} (VLLM_ROCM_USE_AITER_TRITON_ROPE=1 and, on gfx90a, the optional "
                   "vllm-aiter-triton-ops set open it)"}


def render(explanation: dict, target: dict) -> str:
    shape = explanation["shape"]
    lines = [f"{explanation['model']} on {target['label']}",
             f"  model: head_dim {shape['head_size']}, {shape['heads']} query / {shape['kv_heads']} KV heads (GQA "
             f"{shape['gqa']}), {shape['dtype']}, quantization {shape['quantization']}",
             f"  environment: " + " ".join(f"{k}={v}" for k, v in sorted(target["environment"].items()))]
    for layer in explanation["attention"]:
        lines.append(f"  {layer['count']} {layer['kind']} layers: attention backend {layer['backend']}")
        lines.append(f"    prefill: {layer['prefill']['kernel']} ({layer['prefill']['why']})")
        lines.append(f"    decode: {layer['decode']['kernel']} ({layer['decode']['why']})")
        lines += [f"    gate: {line}" for line in layer["decided_by"]]
    lines.append(f"  linear layers: {explanation['linear']['kernel']} ({explanation['linear']['why']})")
    lines.append(f"  rotary embedding: {explanation['rotary']['kernel']} ({explanation['rotary']['why']})")
    if explanation["code_objects"]:
        lines.append("  provisioned code objects reached:")
        lines += [f"    {entry['kernel']}: {entry['code_objects']} ({entry['when']})"
                  for entry in explanation["code_objects"]]
        lines += [f"    family {family['family']}: {family['judged']}" for family in explanation.get("families", ())]
    else:
        lines.append("  provisioned code objects reached: none (no AITER ASM kernel on this model's path)")
    return "\n".join(lines)


def reached_families(explanation: dict, verdicts: dict | None) -> list[dict]:
    """The kernel family of each provisioned code object the model reaches (cdna2/data/kernel-families.yaml), with
    the GPU checks proving it and, for a host (``verdicts``: its deploy report's ``details.families``), its verdict
    there: a family withheld on the host is not there to run, AITER takes its fallback or fails to load it."""
    found = []
    for entry in explanation["code_objects"]:
        head, _, relpath = entry["code_objects"].partition(f"hsa/{explanation['arch']}/")
        if head or not relpath:
            continue  # a JIT module, not an hsa code object
        name = family_of(relpath, host_families())
        if name in (family["family"] for family in found):
            continue
        checks = next((family["checks"] for family in host_families() if family["name"] == name), [])
        proof = f"GPU checks {', '.join(checks)}" if checks else "no GPU check"
        if verdicts is None:
            judged = f"proven on a host by {proof}; the host's verdict is in its deploy report (details.families)"
        elif name not in verdicts:
            judged = f"not judged on this host (no smoke verdict recorded for it): unproven; proven by {proof}"
        else:
            judged = f"{verdicts[name]['verdict']} on this host: {verdicts[name]['reason']}"
        found.append({"family": name, "checks": checks, "verdict": (verdicts or {}).get(name, {}).get("verdict"),
                      "judged": judged})
    return found


def host_target(report_path: Path, host: str) -> dict[str, Any]:
    """A host as the deploy report recorded it: arch, vLLM version and the vLLM patch sets it holds."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as error:
        raise ExplainError(f"{report_path}: cannot read the deploy report ({error}); pass --report FILE")
    rows = [row for row in report.get("hosts", []) if row.get("host") == host]
    if not rows:
        names = ", ".join(row.get("host", "?") for row in report.get("hosts", []))
        raise ExplainError(f"{report_path} has no host {host} (it has {names or 'none'})")
    row = rows[0]
    version = (row.get("packages") or {}).get("vllm")
    if not version or "->" in version:
        raise ExplainError(f"{report_path}: host {host} has no settled vLLM version ({version or 'none'}); run the "
                           "deploy again, then explain")
    if not report.get("executed", True):
        raise ExplainError(f"{report_path} is a dry run's report: nothing it plans was applied; pass the report of "
                           "an applied deploy with --report")
    plan = (row.get("details") or {}).get("patches vllm")
    if plan is None and row.get("arch") == "gfx90a":
        raise ExplainError(f"{report_path} ({report.get('mode')}) has no vLLM patch plan for {host}: pass the "
                           "report of a deploy (reports/deploy-*.json) with --report")
    sets = plan["sets"] if plan and plan["status"] in ("apply", "patched") else []
    return {"label": f"{host} ({row.get('arch')}, vLLM {version}, {report.get('mode')} report {report_path} of "
                     f"{report.get('started')}; patch sets: {', '.join(sets) or 'none'})",
            "arch": row.get("arch"), "version": version, "sets": sets,
            "families": (row.get("details") or {}).get("families")}


def explain(config: dict, model: str, version: str, arch: str, sets: list[str], environment: dict[str, str],
            progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Patch a copy of ``version`` with ``sets``, run the gate runner on ``arch`` for the model, and interpret its
    answer: from the patched copy, or from stock vLLM when ``sets`` is empty (a host the deploy left alone)."""
    catalog = load_catalog()
    optional = [name for name in sets if name in catalog.optional_sets()]
    with tempfile.TemporaryDirectory(prefix="cdna2-explain-") as scratch:
        release, entry = gates.prepare_release(version, catalog, Path(scratch), progress, optional)
        if entry["patched"] is None:
            raise ExplainError(f"vLLM {version}: the patch sets do not apply ({release.patch_status})")
        refused = {name: reason for name, reason in release.refused_sets.items() if name in optional}
        if refused:
            raise ExplainError(f"vLLM {version}: optional set(s) {', '.join(refused)} refused: "
                               + "; ".join(reason.splitlines()[0] for reason in refused.values()))
        progress(f"vLLM {version}: asking vLLM's selector on a pretend {arch}")
        spec = {"releases": [entry], "arches": [arch], "environment": environment, "models": {model: config},
                "bytecode_cache": str(cache_root() / "vllm-gates-bytecode")}
        answers = gates.run_runner(torchvenv.torch_cpu_python(), spec)
    tree = "patched" if sets else "stock"
    explanation = interpret(answers[version][tree][arch], model, model_shape(config), environment)
    explanation["patch_sets"] = release.applied_sets if sets else []
    return explanation


def command(args) -> int:
    """``python -m releases explain``: print the explanation (or JSON); exit 1 when it cannot be answered."""
    try:
        config = json.loads(Path(args.config).read_text())
        if not isinstance(config, dict):
            raise ExplainError(f"{args.config}: not a JSON object (a model's config.json)")
        model_shape(config)  # refuse a config without the shape before anything is unpacked
        environment = dict(SERVING_ENVIRONMENT)
        for assignment in args.env:
            name, equals, value = assignment.partition("=")
            if not equals:
                raise ExplainError(f"--env {assignment}: write NAME=VALUE")
            environment[name] = value
        if args.host:
            report = Path(args.report) if args.report else \
                Path(os.environ.get("CDNA2_REPORT_DIR") or "reports") / "latest.json"
            target = host_target(report, args.host)
            version, arch, sets = target["version"], target["arch"], target["sets"]
        else:
            version, arch, sets = args.vllm_version, args.arch, ["vllm-attention-gate", *args.sets]
            target = {"label": f"vLLM {version} on {arch} (patch sets: {', '.join(sets)})"}
        if arch not in ("gfx90a", "gfx942"):
            raise ExplainError(f"arch {arch}: the gate runner pretends gfx90a or gfx942")
        known = gates.releases()
        if version not in known:
            raise ExplainError(load_releases().refusal("vllm", version) or
                               f"vLLM {version} is not one of the releases python -m releases gates takes "
                               f"({known[0]} to {known[-1]}, from the floor in cdna2/data/releases.yaml to the "
                               "newest on the index)")
        target["environment"] = environment
        model = Path(args.config).stem
        explanation = explain(config, model, version, arch, sets, environment,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (ExplainError, OSError, ValueError) as error:
        print(f"explain: {error}", file=sys.stderr)
        return 1
    explanation["families"] = reached_families(explanation, target.get("families") if args.host else None)
    explanation["target"] = target
    print(json.dumps(explanation, indent=1, sort_keys=True) if args.json else render(explanation, target))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="which attention backend, kernels and provisioned code objects vLLM would use for a model",
        description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, metavar="CONFIG.json", help="the model's HF config.json")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--host", help="a host of the last deploy report (its arch, vLLM version and patch sets)")
    where.add_argument("--vllm-version", help="a vLLM release of python -m releases gates (from the floor in "
                                              "cdna2/data/releases.yaml to the newest on the index), patched with "
                                              "the required sets")
    parser.add_argument("--report", help="with --host: the deploy report JSON (default: $CDNA2_REPORT_DIR or "
                                         "reports/, latest.json)")
    parser.add_argument("--arch", default="gfx90a", choices=("gfx90a", "gfx942"), help="with --vllm-version")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME",
                        help="with --vllm-version: an optional vLLM patch set to apply too (repeatable)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="override the serving environment (default: " +
                             " ".join(f"{k}={v}" for k, v in SERVING_ENVIRONMENT.items()) + ")")
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    parser.set_defaults(func=command)

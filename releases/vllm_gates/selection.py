"""Attention backend selection as vLLM's own selector decides it, for the layers of a model's config.json.

The model's VllmConfig is the one test double (ConfigDouble); the selector, the platform's priority list and every
backend's validate_configuration are vLLM's code from the trees the runner loaded.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import logging
import os
import types
from pathlib import Path


class ConfigDouble:
    """Test double of vLLM's VllmConfig and ModelConfig for one model, for backend selection.

    The real ModelConfig needs the model's files, its tokenizer and vLLM's whole dependency set (transformers, the
    model registry). This one holds what selection reads: the model's HF config as given (``hf_config``,
    ``hf_text_config``) and vLLM's own CacheConfig, AttentionConfig and ParallelConfig with their defaults. Any other
    attribute reads as None (unset, as in a plain single-GPU run) and its name is listed in the result, so a release
    that starts reading something new shows it.
    """

    def __init__(self, values: dict, unset: set[str]) -> None:
        self.__dict__.update(values)
        self._unset = unset

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        self._unset.add(name)
        return None


FULL, SLIDING = "full", "sliding"
AITER_FA = "ROCM_AITER_FA"
# The orders vLLM's ROCm priority list can have: VLLM_PREFER_AITER_FA (the optional vllm-prefer-aiter-fa set) puts
# ROCM_AITER_FA ahead of ROCM_ATTN; stock vLLM ignores the variable. "explicit" is --attention-backend ROCM_AITER_FA.
ORDERS = {"prefer": "1", "stock order": "0"}
EXPLICIT = "explicit ROCM_AITER_FA"
AITER_UNIFIED = "ROCM_AITER_UNIFIED_ATTN"
EXPLICIT_UNIFIED = f"explicit {AITER_UNIFIED}"
EXPLICITS = {EXPLICIT: AITER_FA, EXPLICIT_UNIFIED: AITER_UNIFIED}  # --attention-backend NAME, each AITER backend


def layer_kinds(text_config: dict) -> dict[str, int]:
    """How many layers of each kind (full, sliding) the model's vLLM code builds, as its model files derive the
    per-layer window from the HF config: ``layer_types``, else a per-layer ``sliding_window`` list, else one
    ``sliding_window`` for every layer (unless ``use_sliding_window`` is false)."""
    layers = int(text_config.get("num_hidden_layers") or 0)
    layer_types = text_config.get("layer_types")
    window = text_config.get("sliding_window")
    if layer_types:
        kinds = [SLIDING if "sliding" in str(kind) else FULL for kind in layer_types]
    elif isinstance(window, list):
        kinds = [SLIDING if size else FULL for size in window]
    elif window and text_config.get("use_sliding_window", True) is not False:
        kinds = [SLIDING] * layers
    else:
        kinds = [FULL] * layers
    return {kind: kinds.count(kind) for kind in (FULL, SLIDING) if kinds.count(kind)}


def _backend_name(backend_class) -> str:
    """The AttentionBackendEnum name whose class path is this class (members with no class here are skipped)."""
    registry = importlib.import_module("vllm.v1.attention.backends.registry")
    path = f"{backend_class.__module__}.{backend_class.__qualname__}"
    for member in registry.AttentionBackendEnum:
        try:
            if member.get_path() == path:
                return member.name
        except ValueError:  # a backend that must be registered by a plugin first (TORCH_SDPA on ROCm)
            continue
    return path


def _select(selector, head_size: int, dtype, sliding: bool) -> dict:
    """One layer's choice through vLLM's entry point (what its Attention layer calls), as a name or a refusal."""
    arguments = {"head_size": head_size, "dtype": dtype, "kv_cache_dtype": "auto"}
    if "has_sliding_window" in inspect.signature(selector.get_attn_backend).parameters:  # vLLM 0.26 on
        arguments["has_sliding_window"] = sliding
    selector._cached_get_attn_backend.cache_clear()
    try:
        backend = selector.get_attn_backend(**arguments)
    except ValueError as error:  # vLLM's own refusal: no valid backend, or the selected one is not valid
        return {"refused": str(error)}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"backend": _backend_name(backend)}


class WarningCapture(logging.Handler):
    """The warnings vLLM's loggers emit (they do not propagate to the root logger), in order."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


WINDOW_RECORD = "gfx90a_sliding_window_proof.json"  # cdna2/host/window_proof.py RECORD, beside the guarded module


def _window_record(directory: Path, record: dict | str | None) -> None:
    """Put the sliding-window record vllm-aiter-triton-ops' guard reads beside it (a str: these bytes, unparsed;
    None: none). What the controller cannot know is this runner's: its node name and installed triton."""
    path = directory / WINDOW_RECORD
    path.unlink(missing_ok=True)
    if isinstance(record, dict):
        try:
            triton = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            triton = None
        record = json.dumps({"node": os.uname().nodename, "triton": triton, **record})
    if record is not None:
        path.write_text(record)


def evaluate_selection(models: dict[str, dict], window_records: dict[str, dict | str] | None = None,
                       guarded: Path | None = None) -> dict:
    """Per model: its layer kinds and, per order (and for --attention-backend ROCM_AITER_FA), the attention backend
    vLLM's selector picks for each kind, with the model's config current as during vLLM's model construction, and
    the warnings vLLM logged meanwhile that name ROCM_AITER_FA.

    ``window_records``: per extra order, the sliding-window record (cdna2/host/window_proof.py) put in ``guarded``
    (the directory of the patched ROCM_AITER_UNIFIED_ATTN module) while --attention-backend ROCM_AITER_UNIFIED_ATTN
    is chosen; no record is there for the other orders."""
    import torch

    warnings = WarningCapture()
    logging.getLogger("vllm").addHandler(warnings)
    config = importlib.import_module("vllm.config")
    selector = importlib.import_module("vllm.v1.attention.selector")
    caller_preference = os.environ.get("VLLM_PREFER_AITER_FA")
    unset: set[str] = set()
    results = {}
    for name, hf_config in models.items():
        text = hf_config.get("text_config") or hf_config
        kinds = layer_kinds(text)
        head_size = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
        dtype = getattr(torch, text.get("torch_dtype") or hf_config.get("torch_dtype") or "bfloat16")
        namespace = json.loads(json.dumps(text), object_hook=lambda values: types.SimpleNamespace(**values))
        model_config = ConfigDouble({"hf_config": namespace, "hf_text_config": namespace, "dtype": dtype}, unset)
        defaults = {"cache_config": config.CacheConfig(), "attention_config": config.AttentionConfig(),
                    "parallel_config": config.ParallelConfig()}
        vllm_config = ConfigDouble({"model_config": model_config, **defaults}, unset)
        choices = {}
        with config.set_current_vllm_config(vllm_config):
            for order, preference in ORDERS.items():
                os.environ["VLLM_PREFER_AITER_FA"] = preference
                choices[order] = {kind: _select(selector, head_size, dtype, kind == SLIDING) for kind in kinds}
            for explicit, backend in EXPLICITS.items():
                vllm_config.attention_config = config.AttentionConfig(backend=backend)
                choices[explicit] = {kind: _select(selector, head_size, dtype, kind == SLIDING) for kind in kinds}
            vllm_config.attention_config = config.AttentionConfig(backend=AITER_UNIFIED)
            for order, record in (window_records or {}).items():
                _window_record(guarded, record)
                choices[order] = {kind: _select(selector, head_size, dtype, kind == SLIDING) for kind in kinds}
                _window_record(guarded, None)
        results[name] = {"layers": kinds, "head_size": head_size, "dtype": str(dtype).removeprefix("torch."),
                         "choices": choices, "warnings": [text for text in warnings.messages if AITER_FA in text]}
        warnings.messages.clear()
    if caller_preference is None:
        os.environ.pop("VLLM_PREFER_AITER_FA", None)
    else:
        os.environ["VLLM_PREFER_AITER_FA"] = caller_preference
    return {"models": results, "unset_configs": sorted(unset)}


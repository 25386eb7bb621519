"""Evaluate vLLM's arch gates, as vLLM's own code decides them, for one release on a pretend gfx90a and gfx942.

Usage, inside the torch-CPU venv (lab/torchvenv.py):  python runner.py < SPEC.json > RESULT.json
SPEC: {"releases": [{"version": V, "stock": DIR, "patched": DIR or null}, ...], "arches": ["gfx90a", "gfx942"],
"environment": {NAME: VALUE}, "bytecode_cache": DIR or null, "models": {NAME: HF config.json} (optional),
"window_records": {ORDER: record}, "aiter_double": DIR (optional: selection.py, loader.AiterDouble)};
RESULT: {V: {"stock"|"patched": {arch: outcome}}}. With models, each outcome also holds "selection": the attention
backend vLLM's own selector picks for each kind of layer of each model (selection.py).
``stock`` is an unpacked vLLM tree (site-packages layout); ``patched`` holds only the files the patch engine wrote
(and the dist-info), which shadow the stock files of the same path.

vLLM is imported from those trees, file by file as it is installed, statement by statement (loader.py). What
cannot exist here is doubled, by name: amdsmi (the device query, doubles/amdsmi), amd-aiter (loader.AiterDouble)
and, for backend selection, the model's VllmConfig (selection.ConfigDouble); vLLM's compiled extensions fail to load
as they would on any machine without a GPU, and vLLM carries on as it does there. Every substitution the loader
makes is listed in the result. The runner judges nothing: releases/gates.py compares the values.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
import types
from pathlib import Path

import loader  # the runner's own modules, beside it (the script's directory is on sys.path)
from loader import SUBSTITUTIONS, AiterDouble, TreeFinder, Unavailable
from selection import evaluate_selection

DOUBLES = Path(__file__).resolve().parent / "doubles"
# The modules holding the gates the vLLM patch sets touch (cdna2/data/patchsets/vllm-*.yaml).
GATE_MODULES = {
    "aiter_ops": "vllm._aiter_ops",
    "rocm": "vllm.platforms.rocm",
    "aiter_fa": "vllm.v1.attention.backends.rocm_aiter_fa",
    "torch_scaled_mm": "vllm.model_executor.kernels.linear.scaled_mm.pytorch",
    "aiter_scaled_mm": "vllm.model_executor.kernels.linear.scaled_mm.aiter",
    "fp8_utils": "vllm.model_executor.layers.quantization.utils.fp8_utils",
    "model_configs": "vllm.model_executor.models.config",
}
# Model config hooks that pick an attention backend themselves from a gate the sets open (vLLM 0.34 on).
BACKEND_PINNING_CONFIGS = ("MuseGlimmerAttentionConfig",)
FAST_FP8_ELIGIBLE = "_gfx90a_fast_fp8_eligible"  # added by the vllm-fast-fp8-dequant set
UNIFIED_MODULE = "vllm.v1.attention.backends.rocm_aiter_unified_attn"  # its guard reads the sliding-window record



def _verdict(value) -> bool:
    """Whether a gate's answer admits the arch: is_supported() gives (ok, reason); is_*_enabled() a bool or None."""
    if isinstance(value, tuple):
        return bool(value[0])
    return bool(value)


def _describe(value) -> str:
    if isinstance(value, tuple):
        return repr(tuple(value))
    if isinstance(value, list):
        return repr([getattr(item, "name", item) for item in value])
    return repr(value)


def _evaluate(gates: dict, gate_id: str, call) -> None:
    try:
        value = call()
    except Exception as error:
        gates[gate_id] = {"open": None, "value": None, "error": f"{type(error).__name__}: {error}",
                          "traceback": traceback.format_exc(limit=-4)}
        return
    gates[gate_id] = {"open": _verdict(value), "value": _describe(value), "error": None}


def _module(key: str, gates: dict):
    try:
        return importlib.import_module(GATE_MODULES[key])
    except Exception as error:
        gates[f"import {GATE_MODULES[key]}"] = {"open": None, "value": None,
                                                "error": f"{type(error).__name__}: {error}",
                                                "traceback": traceback.format_exc(limit=-4)}
        return None


def _no_argument_classmethods(cls) -> list[str]:
    names = []
    for name, attribute in vars(cls).items():
        if name.startswith("is_") and isinstance(attribute, classmethod):
            parameters = inspect.signature(getattr(cls, name)).parameters
            if all(p.default is not inspect.Parameter.empty for p in parameters.values()):
                names.append(name)
    return sorted(names)


def rocm_candidates(roots: list[Path]) -> set[str]:
    """The linear kernels vLLM may choose on ROCm: the names in its ``PlatformEnum.ROCM: [...]`` lists."""
    for root in roots:
        path = root / "vllm/model_executor/kernels/linear/__init__.py"
        if path.is_file():
            names = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values):
                        if isinstance(key, ast.Attribute) and key.attr == "ROCM" and isinstance(value, ast.List):
                            names.update(element.id for element in value.elts if isinstance(element, ast.Name))
            return names
    return set()


def _is_supported_of(cls: type):
    return next(vars(base)["is_supported"] for base in cls.__mro__ if "is_supported" in vars(base))


def _on_rocm(cls: type, classes: list[type], candidates: set[str]) -> bool:
    """Whether ROCm can reach this ``is_supported``: the class, or a subclass using the same one, is a candidate."""
    function = _is_supported_of(cls)
    return any(other.__name__ in candidates and issubclass(other, cls) and _is_supported_of(other) is function
               for other in classes)


def _own_classes_with_is_supported(module) -> list[type]:
    return [obj for _, obj in sorted(vars(module).items())
            if isinstance(obj, type) and obj.__module__ == module.__name__ and "is_supported" in dir(obj)]


def _backend_priorities(rocm):
    function = rocm._get_backend_priorities
    defaults = {"use_mla": False, "use_sparse": False, "use_kv_connector": False}
    return function(**{name: defaults[name] for name in inspect.signature(function).parameters if name in defaults})


def evaluate_gates(registered_ops: list[str], candidates: set[str]) -> dict:
    """Every gate of the patch sets' files, on the platform vLLM detected, with the env set by the caller.

    A linear kernel's ``is_supported()`` carries ``on_rocm``: whether vLLM's ROCm kernel lists can reach it.
    """
    gates: dict[str, dict] = {}
    platform = importlib.import_module("vllm.platforms").current_platform
    capability = platform.get_device_capability()
    aiter_ops = _module("aiter_ops", gates)
    if aiter_ops is not None:
        _evaluate(gates, "is_aiter_found_and_supported()", aiter_ops.is_aiter_found_and_supported)
        ops = aiter_ops.rocm_aiter_ops
        for name in _no_argument_classmethods(ops):
            _evaluate(gates, f"rocm_aiter_ops.{name}()", getattr(ops, name))
        # register_ops_once() runs when vLLM imports the module; the CK int8 GEMM needs this op.
        gates["rocm_aiter_w8a8_gemm op registered"] = {
            "open": "rocm_aiter_w8a8_gemm" in registered_ops,
            "value": f"{len(registered_ops)} ops registered by vllm._aiter_ops", "error": None}
    rocm = _module("rocm", gates)
    if rocm is not None:
        for backend in ("ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN"):
            _evaluate(gates, f"_get_backend_priorities() has {backend}",
                      lambda backend=backend: (backend in [b.name for b in _backend_priorities(rocm)],
                                               [b.name for b in _backend_priorities(rocm)]))
    aiter_fa = _module("aiter_fa", gates)
    if aiter_fa is not None:
        _evaluate(gates, "AiterFlashAttentionBackend.supports_compute_capability()",
                  lambda: aiter_fa.AiterFlashAttentionBackend.supports_compute_capability(capability))
    for key in ("torch_scaled_mm", "aiter_scaled_mm"):
        module = _module(key, gates)
        if module is None:
            continue
        classes = _own_classes_with_is_supported(module)
        for cls in classes:
            gate = f"{cls.__name__}.is_supported()"
            _evaluate(gates, gate, lambda cls=cls: cls.is_supported(capability.to_int()))
            gates[gate]["on_rocm"] = _on_rocm(cls, classes, candidates)
    configs_source = _source_of(GATE_MODULES["model_configs"])
    pinning = [name for name in BACKEND_PINNING_CONFIGS if f"class {name}(" in configs_source]
    model_configs = _module("model_configs", gates) if pinning else None
    for name in pinning if model_configs is not None else ():
        _evaluate(gates, f"{name} pins ROCM_AITER_FA", lambda name=name: _pinned_backend(getattr(model_configs, name)))
    fp8_utils = _module("fp8_utils", gates)
    if fp8_utils is not None and hasattr(fp8_utils, FAST_FP8_ELIGIBLE):
        import torch

        operand, scales = torch.zeros(128, 128, dtype=torch.float8_e4m3fn), torch.ones(1, 1, dtype=torch.float32)
        _evaluate(gates, f"{FAST_FP8_ELIGIBLE}() (e4m3fn, fp32 scales, 128x128 blocks)",
                  lambda: getattr(fp8_utils, FAST_FP8_ELIGIBLE)(operand, operand, scales, scales, [128, 128]))
    return gates


def _source_of(module_name: str) -> str:
    """The text of a vLLM module as the trees hold it, without importing it ("" where no tree has it)."""
    spec = importlib.util.find_spec(module_name)
    origin = getattr(spec, "origin", None) if spec else None
    return Path(origin).read_text(encoding="utf-8") if origin and Path(origin).is_file() else ""


def _pinned_backend(config_hook) -> tuple[bool, str | None]:
    """Whether a model config hook sets --attention-backend ROCM_AITER_FA by itself, on vLLM's default attention
    and compilation configs (the other attributes it reads are unset, as the selection's ConfigDouble has them)."""
    config = importlib.import_module("vllm.config")
    vllm_config = types.SimpleNamespace(attention_config=config.AttentionConfig(),
                                        compilation_config=config.CompilationConfig())
    config_hook.verify_and_update_config(vllm_config)
    backend = vllm_config.attention_config.backend
    name = getattr(backend, "name", backend)
    return name == "ROCM_AITER_FA", name


def _record_op_registrations(registered: list[str]) -> None:
    """Note the name of each op vLLM registers; vLLM's own registration still runs.

    An op whose implementation is an Unavailable marker (imported from a dependency not installed here) is noted
    but cannot be given to torch: torch reads the function's globals.
    """
    torch_utils = importlib.import_module("vllm.utils.torch_utils")
    register = torch_utils.direct_register_custom_op

    def recording_register(op_name, *args, **kwargs):
        registered.append(op_name)
        if any(isinstance(value, Unavailable) for value in (*args, *kwargs.values())):
            return None
        return register(op_name, *args, **kwargs)

    torch_utils.direct_register_custom_op = recording_register



def run_configuration(roots: list[Path], arch: str, environment: dict[str, str], models: dict[str, dict],
                      window_records: dict[str, dict | str] | None = None, aiter_double: str | None = None) -> dict:
    """In a fresh process: vLLM from ``roots`` on a pretend ``arch``, and what its gates answer there.
    ``window_records``, ``aiter_double``: see selection.evaluate_selection and loader.AiterDouble."""
    sys.path.append(str(roots[-1]))  # the stock tree, for the dist-info only (vLLM reads its own version)
    os.environ.update(environment)
    os.environ["CDNA2_GATES_ARCH"] = arch
    sys.meta_path[:0] = [TreeFinder(roots), AiterDouble(aiter_double)]
    registered: list[str] = []
    _record_op_registrations(registered)
    platform = importlib.import_module("vllm.platforms").current_platform
    rocm = importlib.import_module("vllm.platforms.rocm")
    detected = {"platform": type(platform).__name__, "gcn_arch": rocm._GCN_ARCH,
                "capability": platform.get_device_capability().to_int()}
    gates = evaluate_gates(registered, rocm_candidates(roots))
    result = {"arch": arch, "detected": detected, "gates": gates}
    if models:
        # The record beside the guarded module is written only into a patched copy, never into the stock tree, and
        # only read on gfx90a (on gfx942 the guard has nothing to decline: EXPLICIT_UNIFIED shows it).
        guarded = Path(importlib.import_module(UNIFIED_MODULE).__file__).parent \
            if window_records and arch == "gfx90a" else None
        patched = guarded is not None and len(roots) > 1 and guarded.is_relative_to(roots[0])
        result["selection"] = evaluate_selection(models, window_records if patched else None, guarded)
    outside = sorted(name for name in sys.modules if name.split(".")[0] not in ("vllm", "amdsmi", "aiter"))
    return {**result, "substitutions": SUBSTITUTIONS.to_json(), "modules_outside_vllm": outside}


def in_child(work, *args) -> dict:
    """Run ``work(*args)`` in a forked child and return its JSON-able result.

    vLLM's import registers types and ops in torch's process-wide registries and resolves the platform once, so each
    configuration gets a process of its own; forking after ``import torch`` pays for torch's import only once.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            payload = {"ok": True, "result": work(*args)}
        except BaseException as error:  # the child must always report and exit, never return into the parent
            payload = {"ok": False, "error": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc(limit=-6)}
        with os.fdopen(write_end, "w") as pipe:
            json.dump(payload, pipe)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return {"ok": False, "error": f"child exited with status {status} before reporting"}
    return json.loads(text)


def _preload(names: list[str]) -> None:
    """Import in this process what vLLM imported from outside itself (torch._dynamo, ... about 7 s of CPU), so the
    next forked children find it loaded. None of it depends on the arch or on vLLM's files."""
    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # a module that only imports inside vLLM's context; the child imports it again
                pass


def main() -> int:
    spec = json.load(sys.stdin)
    if spec.get("bytecode_cache"):
        loader.BYTECODE_CACHE = Path(spec["bytecode_cache"])
    # vLLM logs to stdout; the result gets the real stdout, everything else goes to stderr.
    result_stream = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.path.insert(0, str(DOUBLES))
    import torch  # noqa: F401  (imported once, before the forks)

    results: dict[str, dict] = {}
    for release in spec["releases"]:
        trees = {"stock": [Path(release["stock"])]}
        if release.get("patched"):
            trees["patched"] = [Path(release["patched"]), Path(release["stock"])]
        results[release["version"]] = {label: {} for label in trees}
        for label, roots in trees.items():
            for arch in spec["arches"]:
                outcome = in_child(run_configuration, roots, arch, spec["environment"], spec.get("models") or {},
                                   spec.get("window_records"), spec.get("aiter_double"))
                if outcome["ok"]:
                    _preload(outcome["result"].pop("modules_outside_vllm"))
                results[release["version"]][label][arch] = outcome
    json.dump(results, result_stream, indent=1, sort_keys=True)
    result_stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

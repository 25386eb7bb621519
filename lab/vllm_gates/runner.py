"""Evaluate vLLM's arch gates, as vLLM's own code decides them, for one release on a pretend gfx90a and gfx942.

Usage, inside the torch-CPU venv (lab/torchvenv.py):  python runner.py < SPEC.json > RESULT.json
SPEC: {"releases": [{"version": V, "stock": DIR, "patched": DIR or null}, ...], "arches": ["gfx90a", "gfx942"],
"environment": {NAME: VALUE}, "bytecode_cache": DIR or null, "models": {NAME: HF config.json} (optional)};
RESULT: {V: {"stock"|"patched": {arch: outcome}}}. With models, each outcome also holds "selection": the attention
backend vLLM's own selector picks for each kind of layer of each model (``evaluate_selection``).
``stock`` is an unpacked vLLM tree (site-packages layout); ``patched`` holds only the files the patch engine wrote
(and the dist-info), which shadow the stock files of the same path.

vLLM is imported from those trees, file by file as it is installed. What cannot exist here is doubled, by name:
amdsmi (the device query, doubles/amdsmi), amd-aiter (AiterDouble) and, for backend selection, the model's
VllmConfig (ConfigDouble); vLLM's compiled extensions fail to load
as they would on any machine without a GPU, and vLLM carries on as it does there. vLLM's wheels are unpacked without
their dependencies, so a vLLM module is loaded statement by statement: a top-level import that fails binds the
names it would have bound to ``Unavailable`` markers, which raise on any use (a gate that needs one reports an
error, never a value); a class whose bases cannot be built is rebuilt from its own body without them. Every such
substitution is listed in the result. The runner judges nothing: cdna2/patches/gates.py compares the values.
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import importlib.abc
import importlib.util
import inspect
import json
import logging
import marshal
import os
import sys
import traceback
import types
from pathlib import Path

DOUBLES = Path(__file__).resolve().parent / "doubles"
# The modules holding the gates the vLLM patch sets touch (cdna2/data/patchsets/vllm-*.yaml).
GATE_MODULES = {
    "aiter_ops": "vllm._aiter_ops",
    "rocm": "vllm.platforms.rocm",
    "aiter_fa": "vllm.v1.attention.backends.rocm_aiter_fa",
    "torch_scaled_mm": "vllm.model_executor.kernels.linear.scaled_mm.pytorch",
    "aiter_scaled_mm": "vllm.model_executor.kernels.linear.scaled_mm.aiter",
    "fp8_utils": "vllm.model_executor.layers.quantization.utils.fp8_utils",
}
FAST_FP8_ELIGIBLE = "_gfx90a_fast_fp8_eligible"  # added by the vllm-fast-fp8-dequant set


class Unavailable:
    """Stands for a name a vLLM module imports from a dependency that is not installed here; any use raises."""

    def __init__(self, name: str, reason: str) -> None:
        self._name, self._reason = name, reason

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is unavailable here ({self._reason})")

    __call__ = __getitem__ = __iter__ = __bool__ = _refuse

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        self._refuse()

    def __mro_entries__(self, bases):
        self._refuse()


class Substitutions:
    """What the loader put in place of vLLM's own objects, for the result."""

    def __init__(self) -> None:
        self.unavailable: dict[str, dict[str, str]] = {}  # module -> name -> reason
        self.rebuilt_classes: dict[str, dict[str, str]] = {}  # module -> class -> why its bases were dropped

    def to_json(self) -> dict:
        return {"unavailable": self.unavailable, "rebuilt_classes": self.rebuilt_classes}


SUBSTITUTIONS = Substitutions()


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            flags |= sum(getattr(__future__, alias.name).compiler_flag for alias in node.names)
    return flags


def _bind_unavailable(names: tuple[tuple[str, str], ...], namespace: dict, error: Exception) -> None:
    """Bind each name a failed import would have bound (``names``: imported name, bound name) to a marker."""
    reason = f"{type(error).__name__}: {error}"
    for imported, bound in names:
        namespace[bound] = Unavailable(imported, reason)
        SUBSTITUTIONS.unavailable.setdefault(namespace["__name__"], {})[bound] = reason


def _without_bases(node: ast.ClassDef) -> ast.ClassDef:
    rebuilt = ast.ClassDef(name=node.name, bases=[], keywords=[], body=node.body, decorator_list=[],
                           type_params=getattr(node, "type_params", []))
    return ast.fix_missing_locations(ast.copy_location(rebuilt, node))


IMPORT, CLASS, OTHER = "import", "class", "other"
BYTECODE_CACHE: Path | None = None  # set from the spec: compiled statements, keyed by the source bytes
STATEMENTS_FORMAT = b"2"  # what one cached statement holds (part of the key)


def _compile_statements(path: str, source: bytes) -> list[tuple[str, int, object, object]]:
    """(kind, line, code, fallback) per top-level statement. The fallback is what the loader needs when the statement
    fails, made here so that no process parses a module again: for an import, (imported name, bound name) pairs; for
    a class, its name and the class compiled without its bases."""
    tree = ast.parse(source, path)
    flags = _future_flags(tree)
    statements = []
    for node in tree.body:
        code = compile(ast.Module([node], []), path, "exec", flags=flags, dont_inherit=True)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = tuple((alias.name, alias.asname or alias.name.split(".")[0]) for alias in node.names)
            statements.append((IMPORT, node.lineno, code, names))
        elif isinstance(node, ast.ClassDef):
            # Annotations stay unevaluated in the rebuilt class: they may name unavailable types.
            rebuilt = compile(ast.Module([_without_bases(node)], []), path, "exec",
                              flags=flags | __future__.annotations.compiler_flag, dont_inherit=True)
            statements.append((CLASS, node.lineno, code, (node.name, rebuilt)))
        else:
            statements.append((OTHER, node.lineno, code, None))
    return statements


def compiled_statements(path: str) -> list[tuple[str, int, object, object]]:
    """``_compile_statements`` of a file; compiling vLLM statement by statement costs seconds per process,
    so the code objects are kept in BYTECODE_CACHE (marshal, like a .pyc) under the hash of the source."""
    source = Path(path).read_bytes()
    if BYTECODE_CACHE is None:
        return _compile_statements(path, source)
    key = hashlib.sha256(b"\0".join((STATEMENTS_FORMAT, sys.version.encode(), path.encode(), source))).hexdigest()
    cached = BYTECODE_CACHE / f"{key}.marshal"
    if cached.is_file():
        return marshal.loads(cached.read_bytes())
    statements = _compile_statements(path, source)
    BYTECODE_CACHE.mkdir(parents=True, exist_ok=True)
    staging = cached.with_name(f"{cached.name}.{os.getpid()}")
    staging.write_bytes(marshal.dumps(statements))
    staging.replace(cached)
    return statements


class StatementLoader(importlib.abc.Loader):
    """Executes a vLLM source file one top-level statement at a time (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        for kind, line, code, fallback in compiled_statements(self.path):
            try:
                exec(code, module.__dict__)
            except ImportError as error:
                if kind != IMPORT:
                    raise
                _bind_unavailable(fallback, module.__dict__, error)
            except Exception as error:
                if kind != CLASS:
                    raise ImportError(f"{self.path}:{line}: {type(error).__name__}: {error}") from error
                name, rebuilt = fallback
                exec(rebuilt, module.__dict__)
                SUBSTITUTIONS.rebuilt_classes.setdefault(module.__name__, {})[name] = f"{type(error).__name__}: {error}"


class AiterDouble(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Test double of an installed amd-aiter: ``find_spec("aiter")`` finds it and ``import aiter.x.y`` works, but its
    compiled extensions cannot load without a GPU, so every name taken from it is an Unavailable marker."""

    def find_spec(self, name: str, path, target=None):
        if name != "aiter" and not name.startswith("aiter."):
            return None
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name, "Test double of amd-aiter (no GPU here).")
        module.__path__ = []

        def unavailable(attribute: str):
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            return Unavailable(f"{spec.name}.{attribute}", "AITER's compiled extensions cannot load without a GPU")

        module.__getattr__ = unavailable
        return module

    def exec_module(self, module) -> None:
        pass


class TreeFinder(importlib.abc.MetaPathFinder):
    """Finds vllm.* in the patched files first, then in the stock tree; loads them with StatementLoader."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        relative = Path(*name.split("."))
        for root in self.roots:
            package_init = root / relative / "__init__.py"
            if package_init.is_file():
                locations = [str(r / relative) for r in self.roots if (r / relative).is_dir()]
                return importlib.util.spec_from_file_location(name, package_init,
                                                              loader=StatementLoader(str(package_init)),
                                                              submodule_search_locations=locations)
            module_file = root / relative.with_suffix(".py")
            if module_file.is_file():
                return importlib.util.spec_from_file_location(name, module_file,
                                                              loader=StatementLoader(str(module_file)))
        return None  # a compiled extension (vllm._C, ...): the normal finders try it and it fails without a GPU


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
        _evaluate(gates, "_get_backend_priorities() has ROCM_AITER_FA",
                  lambda: ("ROCM_AITER_FA" in [b.name for b in _backend_priorities(rocm)],
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
    fp8_utils = _module("fp8_utils", gates)
    if fp8_utils is not None and hasattr(fp8_utils, FAST_FP8_ELIGIBLE):
        import torch

        operand, scales = torch.zeros(128, 128, dtype=torch.float8_e4m3fn), torch.ones(1, 1, dtype=torch.float32)
        _evaluate(gates, f"{FAST_FP8_ELIGIBLE}() (e4m3fn, fp32 scales, 128x128 blocks)",
                  lambda: getattr(fp8_utils, FAST_FP8_ELIGIBLE)(operand, operand, scales, scales, [128, 128]))
    return gates


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


def evaluate_selection(models: dict[str, dict]) -> dict:
    """Per model: its layer kinds and, per order (and for --attention-backend ROCM_AITER_FA), the attention backend
    vLLM's selector picks for each kind, with the model's config current as during vLLM's model construction, and
    the warnings vLLM logged meanwhile that name ROCM_AITER_FA."""
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
            vllm_config.attention_config = config.AttentionConfig(backend="ROCM_AITER_FA")
            choices[EXPLICIT] = {kind: _select(selector, head_size, dtype, kind == SLIDING) for kind in kinds}
        results[name] = {"layers": kinds, "head_size": head_size, "dtype": str(dtype).removeprefix("torch."),
                         "choices": choices, "warnings": [text for text in warnings.messages if AITER_FA in text]}
        warnings.messages.clear()
    if caller_preference is None:
        os.environ.pop("VLLM_PREFER_AITER_FA", None)
    else:
        os.environ["VLLM_PREFER_AITER_FA"] = caller_preference
    return {"models": results, "unset_configs": sorted(unset)}


def run_configuration(roots: list[Path], arch: str, environment: dict[str, str], models: dict[str, dict]) -> dict:
    """In a fresh process: vLLM from ``roots`` on a pretend ``arch``, and what its gates answer there."""
    sys.path.append(str(roots[-1]))  # the stock tree, for the dist-info only (vLLM reads its own version)
    os.environ.update(environment)
    os.environ["CDNA2_GATES_ARCH"] = arch
    sys.meta_path[:0] = [TreeFinder(roots), AiterDouble()]
    registered: list[str] = []
    _record_op_registrations(registered)
    platform = importlib.import_module("vllm.platforms").current_platform
    rocm = importlib.import_module("vllm.platforms.rocm")
    detected = {"platform": type(platform).__name__, "gcn_arch": rocm._GCN_ARCH,
                "capability": platform.get_device_capability().to_int()}
    gates = evaluate_gates(registered, rocm_candidates(roots))
    result = {"arch": arch, "detected": detected, "gates": gates}
    if models:
        result["selection"] = evaluate_selection(models)
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
    global BYTECODE_CACHE
    spec = json.load(sys.stdin)
    if spec.get("bytecode_cache"):
        BYTECODE_CACHE = Path(spec["bytecode_cache"])
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
                outcome = in_child(run_configuration, roots, arch, spec["environment"], spec.get("models") or {})
                if outcome["ok"]:
                    _preload(outcome["result"].pop("modules_outside_vllm"))
                results[release["version"]][label][arch] = outcome
    json.dump(results, result_stream, indent=1, sort_keys=True)
    result_stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

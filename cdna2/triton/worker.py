"""Compile AITER Triton kernels for gfx90a on a machine with no GPU; run by the controller inside an isolated venv
holding one triton wheel (``python worker.py < job.json``). Standard library and that triton only.

Input (stdin, JSON): ``{"site_packages": DIR, "arch": "gfx90a", "compiles": [{"id", "modules", "kernel", "values",
"tensor_dtype", "tensors", "language_dtypes"?, "arch"?}]}`` (``cdna2.triton.recipes`` writes them): the first of
``modules`` present in the tree holds ``kernel``; pointers are Triton MockTensors of ``tensor_dtype`` (or the dtype
``tensors`` names); a constexpr named in ``language_dtypes`` gets that ``tl`` dtype (a compute type); a value
``{"call", "modules", "args"}`` is what that AITER function returns (a ``@triton.jit`` activation, say). A kernel
under ``@triton.autotune`` is compiled with the one config the request's ``autotune`` names (its Config's kwargs,
``num_warps`` and ``num_stages``), never with the autotuner's own.
With ``"lookups": [{"id", "modules", "function", "args", "kwargs"}]`` it calls AITER's own config lookups instead,
as they run on a host of that arch. With ``"results": DIR`` a compile Triton has measured before (in any tree, any
earlier job) is not compiled again: its measured result is read from DIR (``reuse_compiles``). Output (stdout, JSON):
one result per lookup (``config`` or ``error``), per compile: ``ok``, ``error``, ``lds_bytes``, ``vgprs``, ``agprs``,
``sgprs``, ``vgpr_spills``, ``sgpr_spills``, ``scratch_bytes``, ``mfma`` (instruction -> count); and ``reused``, how
many compiles were read from DIR.

What this stands in for, and why: Triton asks the active driver for the target, the device and the stream before it
compiles (a stand-in answers gfx90a, device 0); the AMD backend imports ``torch`` to size pointer ranges and the
specializer keys tensors by their dtype object (a minimal ``torch`` module whose dtypes are singletons); AITER's
package ``__init__`` files import its C++ extensions (the packages are registered by path without running them).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import re
import sys
import types
from pathlib import Path

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int8": "int8", "int32": "int32",
          "int64": "int64", "uint8": "uint8", "int16": "int16", "bool": "bool"}
# AITER modules read FP8 ranges at import (utils/types.py, unified attention's FP8_MIN/FP8_MAX defaults): the
# stand-in answers torch.finfo for the FP8 formats too; no FP8 kernel is ever compiled here.
FINFO = {"float8_e4m3fnuz": (-240.0, 240.0), "float8_e4m3fn": (-448.0, 448.0), "float8_e5m2fnuz": (-57344.0, 57344.0),
         "float8_e5m2": (-57344.0, 57344.0), "bfloat16": (-3.3895313892515355e38, 3.3895313892515355e38),
         "float16": (-65504.0, 65504.0), "float32": (-3.4028234663852886e38, 3.4028234663852886e38),
         "float64": (-1.7976931348623157e308, 1.7976931348623157e308)}


def _minimal_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")

    class dtype:  # noqa: N801 - Triton recognises torch dtypes by the class name "dtype" in module "torch"
        def __init__(self, name: str) -> None:
            self.name = name

        def __str__(self) -> str:
            return f"torch.{self.name}"

        __repr__ = __str__

    class Tensor:  # isinstance checks only; no value is ever a Tensor here
        pass

    dtype.__module__ = Tensor.__module__ = "torch"
    torch.dtype, torch.Tensor = dtype, Tensor
    torch.LongTensor = Tensor  # an annotation chunk_delta_attn's helpers evaluate at import
    for name in set(DTYPES.values()) | set(FINFO):
        setattr(torch, name, dtype(name))
    torch.float = torch.float32  # moe_config_utils compares the activation dtype with torch.float
    torch.finfo = lambda of: types.SimpleNamespace(min=FINFO[of.name][0], max=FINFO[of.name][1])
    torch.version = types.SimpleNamespace(hip="stand-in", cuda=None)
    return torch


def _stand_in_driver(arch: str):
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnlyDriver(DriverBase):
        """Answers what Triton asks before compiling; nothing is ever launched."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self):
            return GPUTarget("hip", arch, 64)

        def get_active_torch_device(self):
            raise RuntimeError("compile-only driver: no device")

        def get_benchmarker(self):
            raise RuntimeError("compile-only driver: no benchmarking")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device=None) -> int:
            return 0

        def map_python_to_cpp_type(self, ty):
            return ty

    return CompileOnlyDriver()


def _register_packages(site_packages: Path, module: str) -> None:
    """Make every package above ``module`` importable without running its ``__init__`` (AITER's loads C++)."""
    parts = module.split(".")[:-1]
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules:
            continue
        package = types.ModuleType(name)
        package.__path__ = [str(site_packages.joinpath(*parts[:depth]))]
        sys.modules[name] = package


_REGISTER = {"vgprs": r"\.vgpr_count:\s+(\d+)", "agprs": r"\.agpr_count:\s+(\d+)", "sgprs": r"\.sgpr_count:\s+(\d+)",
             "vgpr_spills": r"\.vgpr_spill_count:\s+(\d+)", "sgpr_spills": r"\.sgpr_spill_count:\s+(\d+)",
             "scratch_bytes": r"\.private_segment_fixed_size:\s+(\d+)"}


class MeasuredCompile:
    """A compile whose measured result was read back (``reuse_compiles``): what Triton's JIT gets in place of the
    CompiledKernel, and ``measure`` returns as it was measured."""

    def __init__(self, measured: dict) -> None:
        self.measured = measured


def measure(kernel) -> dict:
    """LDS from the metadata (Triton checks it only at load time), registers, spills, scratch and MFMA from the
    kernel's amdgcn and its code-object metadata."""
    if isinstance(kernel, MeasuredCompile):
        return kernel.measured
    asm = kernel.asm["amdgcn"]
    found = {"lds_bytes": int(kernel.metadata.shared)}
    for key, pattern in _REGISTER.items():
        values = [int(value) for value in re.findall(pattern, asm)]
        found[key] = max(values) if values else 0
    mfma: dict[str, int] = {}
    for instruction in re.findall(r"^\s*(v_mfma_\w+)", asm, re.MULTILINE):
        mfma[instruction] = mfma.get(instruction, 0) + 1
    found["mfma"] = dict(sorted(mfma.items()))
    return found


def _jit_function(kernel):
    """The JITFunction under ``kernel``, the ``triton.heuristics`` value tables above it (outermost first, the order
    Heuristics.run computes them in), and the names an ``@triton.autotune`` among them tunes (None: not autotuned)."""
    heuristics, tuned = [], None
    while not hasattr(kernel, "params"):
        if hasattr(kernel, "configs"):  # an Autotuner: its configs are never used, the request names one
            tuned = {name for config in kernel.configs for name in config.kwargs}
        else:
            heuristics.append(kernel.values)
        kernel = kernel.fn
    return kernel, heuristics, tuned


def _kernel(site_packages: Path, modules: list[str], name: str):
    for module in modules:
        if site_packages.joinpath(*module.split(".")).with_suffix(".py").is_file():
            _register_packages(site_packages, module)
            return module, getattr(importlib.import_module(module), name)
    raise LookupError(f"none of {', '.join(modules)} is in this AITER tree")


def kernel_arguments(jit, computed: set[str], request: dict, torch) -> tuple[dict, list[str]]:
    """Every argument of the kernel by name, and the request's values it does not take. A pointer parameter
    (``*_ptr``, or named in ``tensors``) gets a MockTensor, a stride or other scalar the request leaves out 64; a
    constexpr without a value or default is left out, and Triton names it."""
    import triton.language as tl
    from triton.runtime.jit import MockTensor
    from triton.backends.amd.compiler import HIPOptions

    values, tensors = request["values"], request.get("tensors", {})
    values = {**values, **{name: getattr(tl, DTYPES[dtype]) for name, dtype in
                           request.get("language_dtypes", {}).items()}}
    arguments = {}
    for param in jit.params:
        name = param.name
        if name in computed:
            continue
        if name in tensors or (name.endswith("_ptr") and name not in values):
            dtype = tensors.get(name, request["tensor_dtype"])
            arguments[name] = MockTensor(getattr(torch, DTYPES[dtype]))
        elif name in values:
            arguments[name] = values[name]
        elif not param.is_constexpr:
            arguments[name] = 64
    options = set(HIPOptions.__dataclass_fields__)
    arguments.update({name: value for name, value in values.items() if name in options})
    ignored = sorted(name for name in values if name not in arguments and name not in computed)
    return arguments, ignored


def _resolved(site_packages: Path, value):
    """A value as the wrapper passes it: ``{"call", "modules", "args"}`` calls that AITER function (AITER's wrappers
    pass ``_get_activation_from_str(name)``, a JITFunction, as a constexpr)."""
    if isinstance(value, dict) and "call" in value:
        return _kernel(site_packages, value["modules"], value["call"])[1](*value["args"])
    return value


def _autotune_config(request: dict, tuned: set[str] | None) -> dict:
    """The config an autotuned kernel is compiled with: the request's ``autotune``, exactly the autotuner's names
    plus num_warps and num_stages (an autotuner warms every config it holds; this compiles the one the proof asks)."""
    named = request.get("autotune")
    if tuned is None:
        if named is not None:
            raise ValueError(f"{request['kernel']} is not under @triton.autotune; the request names an autotune config")
        return {}
    if named is None or set(named) != tuned | {"num_warps", "num_stages"}:
        raise ValueError(f"{request['kernel']} is under @triton.autotune over {sorted(tuned)}: the request's "
                         f"'autotune' must name exactly those, num_warps and num_stages (got {sorted(named or {})})")
    return named


def compile_one(site_packages: Path, request: dict, torch) -> dict:
    module, kernel = _kernel(site_packages, request["modules"], request["kernel"])
    jit, heuristics, tuned = _jit_function(kernel)
    values = {name: _resolved(site_packages, value) for name, value in request["values"].items()}
    request = {**request, "values": {**values, **_autotune_config(request, tuned)}}
    arguments, ignored = kernel_arguments(jit, {name for table in heuristics for name in table}, request, torch)
    for table in heuristics:  # as Heuristics.run: each value from the arguments and the values computed before it
        for name, heuristic in table.items():
            arguments[name] = heuristic(dict(arguments))
    jit.device_caches.clear()  # its binder holds the target of its first compile; this request may name another
    compiled = jit.warmup(grid=(1,), **arguments)
    return {"id": request["id"], "ok": True, "kernel": f"{module}:{request['kernel']}", "ignored": ignored,
            **measure(compiled)}


def _lookup_argument(value, torch):
    """A lookup argument as AITER passes it: ``{"dtype": "bf16"}`` a torch dtype, ``{"config": {...}}`` a
    triton.Config (a fallback tile: its kwargs, num_warps and num_stages)."""
    if isinstance(value, dict) and "dtype" in value:
        return getattr(torch, DTYPES[value["dtype"]])
    if isinstance(value, dict) and "config" in value:
        import triton

        kwargs = dict(value["config"])
        return triton.Config(kwargs, num_warps=kwargs.pop("num_warps"), num_stages=kwargs.pop("num_stages"))
    return value


def look_up(site_packages: Path, request: dict, torch) -> dict:
    """Call AITER's own config lookup (``request["function"]`` of the first of ``modules`` in the tree) with the
    arch the stand-in driver reports; a triton.Config it returns is answered as its kwargs, num_warps and
    num_stages."""
    module, function = _kernel(site_packages, request["modules"], request["function"])
    args = [_lookup_argument(arg, torch) for arg in request.get("args", [])]
    # keyword arguments the release's lookup does not take are dropped (0.1.7's HSTU lookups take seven, later one)
    taken = inspect.signature(function).parameters
    found = function(*args, **{name: value for name, value in request.get("kwargs", {}).items() if name in taken})
    config = found[0] if isinstance(found, tuple) else found  # 0.1.20's GEMM lookup also says whether it was tuned
    if hasattr(config, "all_kwargs"):  # get_tuned_kernel_config's triton.Config
        config = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return {"id": request["id"], "ok": True, "function": f"{module}:{request['function']}", "config": dict(config)}


def reuse_compiles(results: Path, counts: dict[str, int]) -> None:
    """Wrap ``triton.compiler.compile`` (what every JITFunction's binder calls to compile) so that a compile whose
    identity was measured before returns that measurement (a MeasuredCompile) instead of compiling again, and a
    compile that succeeds stores its measurement in ``results`` (one small JSON per compile, staged and renamed: safe
    beside other workers); a compile that fails raises as before and stores nothing.

    The identity is the key Triton's own on-disk cache takes the kernel by (triton 3.7.1, compiler.compile ->
    runtime.cache.get_cache_key): triton_key() (its version and the hashes of its compiler, backends, language and
    libtriton), the ASTSource's hash (the JITFunction's cache_key: its source, its line, the cache_keys of the jit
    functions it calls and the constexpr globals it reads; the signature, the constexpr values, the specialisation
    attributes), the backend's hash (the target: arch, warp size) and the parsed options' hash (warps, stages,
    waves_per_eu, every HIPOptions field) and the cache-invalidating environment variables. Triton trusts that key to
    hand back the compiled binary; the measurement is a function of the binary and of ``measure``, whose source is
    in the key too."""
    import triton.compiler
    from triton.compiler import get_cache_key, make_backend
    from triton._C.libtriton import get_cache_invalidating_env_vars

    compile_kernel = triton.compiler.compile
    measuring = hashlib.sha256((inspect.getsource(measure) + json.dumps(_REGISTER)).encode()).hexdigest()
    results.mkdir(parents=True, exist_ok=True)

    def compile_or_reuse(src, target=None, options=None, _env_vars=None):
        backend = make_backend(target)  # the JIT always names its target
        parsed = backend.parse_options(dict(options or {}, **src.parse_options()))
        env_vars = get_cache_invalidating_env_vars() if _env_vars is None else _env_vars
        identity = f"{get_cache_key(src, backend, parsed, env_vars)}\0{measuring}"
        stored = results / f"{hashlib.sha256(identity.encode()).hexdigest()}.json"
        if stored.is_file():
            counts["reused"] += 1
            return MeasuredCompile(json.loads(stored.read_text()))
        kernel = compile_kernel(src, target=target, options=options, _env_vars=_env_vars)
        staging = stored.with_name(f"{stored.stem}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(measure(kernel)))  # key order kept: a reused result reads as measured
        os.replace(staging, stored)
        return kernel

    triton.compiler.compile = compile_or_reuse


def main() -> int:
    job = json.load(sys.stdin)
    site_packages = Path(job["site_packages"])
    torch = sys.modules.setdefault("torch", _minimal_torch())
    import triton
    from triton.runtime import driver

    sys.path.insert(0, str(site_packages))
    counts = {"reused": 0}
    if job.get("results"):
        reuse_compiles(Path(job["results"]), counts)
    results = []
    answer = sys.stdout
    sys.stdout = sys.stderr  # stdout carries the JSON answer only; AITER prints (0.1.7's batched lookup its path)
    for request in job.get("lookups", []):
        driver.set_active(_stand_in_driver(job["arch"]))
        try:
            results.append(look_up(site_packages, request, torch))
        except Exception as error:  # a lookup that fails is the answer asked for, named
            results.append({"id": request["id"], "ok": False, "error": f"{type(error).__name__}: {error}"[:600]})
    for request in job.get("compiles", []):
        driver.set_active(_stand_in_driver(request.get("arch", job["arch"])))
        try:
            results.append(compile_one(site_packages, request, torch))
        except Exception as error:  # one kernel's failure is that kernel's result, named, not the run's
            message = f"{type(error).__name__}: {error}".strip().splitlines()
            results.append({"id": request["id"], "ok": False, "error": " / ".join(message[-3:])[:600]})
        print(f"compiled {len(results)}/{len(job['compiles'])} ({counts['reused']} reused)", file=sys.stderr,
              flush=True)
    json.dump({"triton": triton.__version__, "results": results, "reused": counts["reused"]}, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())

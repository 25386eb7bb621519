"""Derive AITER's gfx90a Triton configs from gfx942's and prove each by compiling it for gfx90a.

For one AITER site-packages tree and one triton version: every gfx942 config file under
``aiter/ops/triton/configs`` is refused (an op that cannot work on gfx90a: the rules' reason), left unproven (no
launch recipe: no config is written for it), or derived: MI300X-only values replaced by the host's, then each config
compiled, for every code path its recipe names, for gfx90a and, as the spill baseline, gfx942. A config whose gfx90a
kernel holds more LDS than gfx90a has, or spills where gfx942's does not, is stepped down by its op's rule and
compiled again until it does not; one that still does after the last step is named, and its file is not derived.
The result is cached by (triton version, AITER tree digest, host profile, rules and this code) under
``$CDNA2_CACHE/triton-proofs``; the proofs of the trees the tool serves are committed (cdna2/data/triton-proofs/,
``python -m releases triton-proofs`` writes them) and found there first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from cdna2.cache import cache_lock, cache_root, code_digest
from cdna2.host.digests import triton_sources_digest
from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.schema import load_packaged
from cdna2.triton import recipes, toolchain, worker

CONFIGS = "aiter/ops/triton/configs"
RULES_FILE = "triton-gfx90a.yaml"
COMMITTED = PACKAGE_DIR / "data" / "triton-proofs"  # <release>.json: proofs of the trees the tool serves
MAX_STEPS = 6  # step-downs per config; each halves one key, so the op's list ends sooner in practice


class ProofError(RuntimeError):
    pass


@cache
def rules_text() -> str:
    return resources.files("cdna2").joinpath("data", RULES_FILE).read_text()


@cache
def load_rules() -> dict:
    document = load_packaged(RULES_FILE, "triton-gfx90a-1.0.json", ProofError)
    unknown = [op["recipe"] for op in document["ops"] if op["recipe"] not in recipes.RECIPES]
    unknown += [op["recipe"] for op in document["in_code"] if op["recipe"] not in recipes.IN_CODE]
    if unknown or document["default_host"] not in document["hosts"]:
        raise ProofError(f"cdna2/data/{RULES_FILE}: unknown recipe {unknown} or default_host")
    return document


@dataclass
class ConfigProof:
    """One config of one file: its gfx90a compiles per code path, and the steps it was taken down."""
    key: str
    original: dict
    config: dict
    steps: list[str] = field(default_factory=list)
    paths: dict[str, dict] = field(default_factory=dict)  # path -> gfx90a result
    baseline: dict[str, dict] = field(default_factory=dict)  # path -> gfx942 result
    problem: str = ""  # why it is not accepted yet (empty: accepted)

    def to_json(self) -> dict:
        results = list(self.paths.values())
        mfma = sorted({name for result in results for name in result.get("mfma", {})})
        return {"key": self.key, "compiled": bool(results) and all(r["ok"] for r in results),
                "lds_bytes": max((r.get("lds_bytes", 0) for r in results), default=0),
                "spills": max((r.get("vgpr_spills", 0) + r.get("sgpr_spills", 0) for r in results), default=0),
                "gfx942_spills": max((r.get("vgpr_spills", 0) + r.get("sgpr_spills", 0)
                                      for r in self.baseline.values()), default=0),
                "scratch_bytes": max((r.get("scratch_bytes", 0) for r in results), default=0),
                "vgprs": max((r.get("vgprs", 0) for r in results), default=0),
                "mfma": mfma, "stepped_down": self.steps, "problem": self.problem, "original": self.original,
                "config": self.config, "paths": self.paths, "gfx942": self.baseline}


@dataclass
class FileProof:
    op: str
    file: str  # gfx942's file, relative to the configs directory
    target: str | None  # gfx90a's, where it is derived
    status: str  # derived | stepped-down | in-code | refused | unproven | failed
    reason: str
    configs: list[ConfigProof] = field(default_factory=list)
    derived: dict | None = None

    def to_json(self) -> dict:
        return {"op": self.op, "file": self.file, "target": self.target, "status": self.status,
                "reason": self.reason, "compiled": self.status in ("derived", "stepped-down", "in-code"),
                "lds_bytes": max((c.to_json()["lds_bytes"] for c in self.configs), default=None),
                "spills": max((c.to_json()["spills"] for c in self.configs), default=None),
                "mfma": sorted({m for c in self.configs for m in c.to_json()["mfma"]}),
                "configs": [c.to_json() for c in self.configs], "derived": self.derived}


def tree_digest(site_packages: Path) -> str:
    """sha256 over AITER's Triton sources and configs (paths and bytes): what the proof depends on in the tree."""
    digest = triton_sources_digest(site_packages)
    if digest is None:
        raise ProofError(f"{site_packages}: no aiter/ops/triton there; pass the site-packages AITER is installed in")
    return digest


def arch_names(configs: Path, rules: dict) -> tuple[str, str]:
    """(gfx942's name, gfx90a's name) in this release's file names: arches, or devices (AITER <= 0.1.7)."""
    source, target = rules["source_arch"], rules["target_arch"]
    if any(configs.rglob(f"{source}-*.json")) or (configs / source).is_dir():
        return source, target
    return rules["device_names"][source], rules["device_names"][target]


def _matches(patterns: list[str], name: str, relative: str) -> bool:
    return any(re.fullmatch(pattern.replace("{arch}", re.escape(name)), relative) for pattern in patterns)


def classify(configs: Path, rules: dict) -> list[FileProof]:
    """Every gfx942 config file of the tree: refused, unproven, or to be proven (status "pending")."""
    source, target = arch_names(configs, rules)
    found = sorted(path.relative_to(configs).as_posix() for path in configs.rglob("*.json")
                   if path.name.startswith(f"{source}-") or path.relative_to(configs).parts[0] == source)
    proofs = []
    for relative in found:
        refusal = next((r["reason"] for r in rules["refused"] if _matches(r["files"], source, relative)), None)
        op = next((op for op in rules["ops"] if _matches(op["files"], source, relative)), None)
        name = op["name"] if op else Path(relative).stem.removeprefix(f"{source}-")
        if refusal:
            proofs.append(FileProof(name, relative, None, "refused", refusal))
        elif op is None:
            proofs.append(FileProof(name, relative, None, "unproven", "no launch recipe in the rules: not compiled, "
                                                                      "so no gfx90a config is written"))
        else:
            nested = relative.startswith(f"{source}/")  # configs/<arch>/..., else a flat <arch>-NAME.json
            derived = (f"{target}/{relative.split('/', 1)[1]}" if nested
                       else relative.replace(f"{source}-", f"{target}-", 1))
            proofs.append(FileProof(name, relative, derived, "pending", op["why"]))
    return proofs


def in_code(site_packages: Path, rules: dict, host: str) -> list[FileProof]:
    """The ops of the tree whose wrapper picks the config in code: one entry per op (``file`` is the wrapper), one
    config per call vLLM makes, holding what the wrapper chooses for it on ``host``."""
    proofs = []
    for op in rules["in_code"]:
        module = next((name for name in op["modules"] if (site_packages / name).is_file()), None)
        if module is None:
            continue  # a release without the op (or where vLLM's import of it fails): nothing of it to prove
        cases = recipes.IN_CODE[op["recipe"]](rules["hosts"][host]["compute_units"])
        proofs.append(FileProof(op["name"], module, None, "in-code", op["why"],
                                [ConfigProof(key, case, case) for key, case in cases.items()]))
    return proofs


def _leaves(document: dict, prefix: str = ""):
    """(dotted key, config) for every dict of scalars in ``document``."""
    for key, value in document.items():
        if isinstance(value, dict):
            if any(isinstance(inner, dict) for inner in value.values()):
                yield from _leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value


def _with_host(config: dict, rules: dict, host: str) -> dict:
    """``config`` with each MI300X-only value replaced: by the host's property the rules name, or their literal."""
    profile, replaced = rules["hosts"][host], dict(config)
    for key, value in rules["host_values"].items():
        if key in replaced:
            replaced[key] = profile[value] if isinstance(value, str) else value
    return replaced


def _shape(relative: str) -> tuple[int, ...] | None:
    """The sizes a specialised file's name gives: (N, K) of a GEMM's ``-N=..-K=..``, (C,) of MHC's ``-C=..``."""
    found = re.search(r"-N=(\d+)-K=(\d+)\.json$", relative) or re.search(r"-C=(\d+)\.json$", relative)
    return tuple(int(size) for size in found.groups()) if found else None


def _run_worker(python: Path, site_packages: Path, requests: list[dict], arch: str, progress,
                kind: str = "compiles", results: Path | None = None) -> tuple[dict[str, dict], int]:
    """The worker's answer to ``requests`` by id, and how many of its compiles it read from ``results`` (the
    measured results of earlier compiles, worker.reuse_compiles; None: every kernel compiled)."""
    if not requests:
        return {}, 0
    job = {"site_packages": str(site_packages), "arch": arch, kind: requests,
           "results": str(results) if results else None}
    worker = Path(__file__).with_name("worker.py")
    with tempfile.TemporaryDirectory(prefix="cdna2-triton-") as scratch:
        # A fresh Triton cache: what is not reused is compiled here, never taken from an earlier run's binaries
        env = {**os.environ, "TRITON_CACHE_DIR": scratch, "PYTHONNOUSERSITE": "1"}
        env.pop("PYTHONPATH", None)
        process = subprocess.Popen([str(python), str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
        process.stdin.write(json.dumps(job))
        process.stdin.close()
        # stdout is read beside stderr: an answer larger than the pipe's buffer would otherwise block the worker
        # while this reads stderr to its end (a deadlock at about 150 compiles)
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(process.stdout.read()), daemon=True)
        reader.start()
        errors = []
        for line in process.stderr:
            if line.startswith("compiled "):
                progress(line.strip())
            else:
                errors.append(line)
        reader.join()
        output = answer[0] if answer else ""
        if process.wait() != 0:
            raise ProofError(f"the compile worker ({python}) failed (exit {process.returncode}): "
                             f"{''.join(errors)[-2000:]}")
    found = json.loads(output)
    return {result["id"]: result for result in found["results"]}, found["reused"]


def compile_results() -> Path:
    """Where the workers keep the measured result of each compile, by Triton's identity of it (shared by every tree,
    proof and triton version: the identity holds the version)."""
    return cache_root() / "triton-results"


# AITER's config lookups of the ops the aiter-triton-gfx90a set gives configs, by release layout.
LOOKUPS = (
    {"id": "gemm_a16w16", "function": "_get_config", "args": [4096, 4096, 4096],
     "modules": ["aiter.ops.triton._triton_kernels.gemm_a16w16",
                 "aiter.ops.triton._triton_kernels.gemm.basic.gemm_a16w16"]},
    {"id": "mha", "function": "_get_config", "args": [True, {"dtype": "bf16"}, True],
     "modules": ["aiter.ops.triton._triton_kernels.mha", "aiter.ops.triton._triton_kernels.attention.mha"]},
    {"id": "extend_attention", "function": "_get_config", "args": [576, {"dtype": "bf16"}],
     "modules": ["aiter.ops.triton._triton_kernels.extend_attention",
                 "aiter.ops.triton._triton_kernels.attention.extend_attention"]},
    {"id": "lean_attention", "function": "_get_config",
     "modules": ["aiter.ops.triton._triton_kernels.lean_atten",
                 "aiter.ops.triton._triton_kernels.attention.lean_atten"]},
    {"id": "mla_decode_rope", "function": "_get_config",
     "modules": ["aiter.ops.triton._triton_kernels.mla_decode_rope",
                 "aiter.ops.triton._triton_kernels.attention.mla_decode_rope"]},
    *({"id": f"hstu_attn_{way}", "function": f"_get_{way}_config",
       "kwargs": {"AUTOTUNE_Z": 512, "H": 4, "AUTOTUNE_MAX_SEQ_LEN": 4096, "DimQ": 128, "DimV": 128, "DeltaSize": 0,
                  "IS_DELTA_Q": False},
       "modules": ["aiter.ops.triton._triton_kernels.hstu_attention",
                   "aiter.ops.triton._triton_kernels.attention.hstu_attention"]} for way in ("fwd", "bwd")),
    # get_optimal_moe_config(dtype, use_int8_w8a16, use_int8_w8a8, use_fp8_w8a8, use_int4_w4a16, use_mxfp4, M): with
    # no file for the arch it returns a default written in code (0.1.16 on; 0.1.7 first fails at the device name)
    *({"id": f"moe {name}", "function": "get_optimal_moe_config", "args": [{"dtype": "bf16"}, *flags, False, 4096],
       "modules": ["aiter.ops.triton.utils.moe_config_utils"]}
      for name, flags in (("bf16", [False, False, False, False]), ("int8_w8a16", [True, False, False, False]),
                          ("int4_w4a16", [False, False, False, True]))),
    {"id": "moe_routing_sigmoid_top1", "function": "_get_config", "args": [4096, 128, 4096],
     "modules": ["aiter.ops.triton._triton_kernels.moe_routing_sigmoid_top1_fused",
                 "aiter.ops.triton._triton_kernels.moe.moe_routing_sigmoid_top1_fused"]},
    # the GEMM variants' lookups, (M, N, K) as their wrappers pass them, 0.1.7's module or the later one
    *({"id": op, "function": "_get_config", "args": args,
       "modules": [f"aiter.ops.triton._triton_kernels.{module}",
                   f"aiter.ops.triton._triton_kernels.gemm.{folder}.{module}"]}
      for op, args, folder, module in (
          ("batched_gemm_a16w16", [4096, 4096, 4096], "batched", "batched_gemm_bf16"),
          ("batched_gemm_a16w16 N=1024 K=4096", [64, 1024, 4096], "batched", "batched_gemm_bf16"),
          ("gemm_a16w16_atomic", [4096, 4096, 4096], "basic", "gemm_a16w16_atomic"),
          ("gemm_a16w16_gated", [4096, 4096, 4096], "basic", "gemm_a16w16_gated"),
          ("ff_a16w16_fused", [8, 14336, 4096], "feed_forward", "ff_a16w16_fused_gated"))),
    # GMM's: (variant, M, K, N, G)
    {"id": "gmm", "function": "get_config", "args": ["gmm", 4096, 4096, 4096, 8],
     "modules": ["aiter.ops.triton._triton_kernels.gmm"]},
    # conv's (0.1.18 on): each kernel module's _get_config(shape_key, M) reads its own file (utils/conv_config_utils:
    # exact shape, else M_LEQ_ bucket, else any); M = 56 * 56, the recipes' layer
    *({"id": f"conv {name}", "function": function, "kwargs": {"M": 3136},
       "modules": [f"aiter.ops.triton._triton_kernels.conv.{module}"]}
      for name, module, function in (
          ("CONV-1X1", "conv_1x1", "_get_config"), ("CONV-3X3-NHWC", "conv_3x3", "_get_config_nhwc"),
          ("CONV-3X3-CBLOCKED", "conv_3x3", "_get_config_cblocked"), ("CONV-GENERAL", "conv_general", "_get_config"),
          ("CONV-WINO-F4X3-GEMM", "conv_3x3_winograd_f4x3", "_get_config_gemm"),
          ("CONV-WINO-F4X3-INPUT", "conv_3x3_winograd_f4x3", "_get_config_input"),
          ("CONV-WINO-F4X3-OUTPUT", "conv_3x3_winograd_f4x3", "_get_config_output"))),
    # mHC (v0.1.16 on), M = 4096 tokens of a 2048-wide hidden state: the -C=1024 file's M_LEQ_4096 bucket
    {"id": "mhc_fused_sinkhorn", "function": "get_mhc_config", "args": ["MHC_FUSED", 4096, 2048],
     "kwargs": {"mode": "sinkhorn"}, "modules": ["aiter.ops.triton.utils.mhc_config_utils"]},
    # a DeepSeek-sized hidden state (C = 7168): the -C=4096 file's M_LEQ_4096 bucket
    {"id": "mhc_fused_sinkhorn C=4096", "function": "get_mhc_config", "args": ["MHC_FUSED", 4096, 7168],
     "kwargs": {"mode": "sinkhorn"}, "modules": ["aiter.ops.triton.utils.mhc_config_utils"]},
    {"id": "mhc_post", "function": "get_mhc_post_config", "args": [4096, 7168],
     "modules": ["aiter.ops.triton.utils.mhc_config_utils"]},
    # chunked delta attention (v0.1.20 on): what gla_output.py registers as its output kernel's autotune config at
    # import, the file's entry, else the fallback written beside the kernel (passed as it passes it)
    {"id": "chunk_delta_attn", "function": "chunk_delta_attn_tuned_config",
     "args": [recipes.delta_attention.KERNEL, {"config": recipes.delta_attention.FALLBACK}],
     "modules": ["aiter.ops.triton._triton_kernels.chunk_delta_attn.chunk_delta_attn_utils"]},
)


def look_up(site_packages: Path, triton_version: str, arch: str) -> dict[str, dict]:
    """AITER's own config lookups of the ops the set gives configs (LOOKUPS) in ``site_packages``, run as on a host
    of ``arch``: ``{op: {"ok", "config" | "error"}}``."""
    python = toolchain.triton_python(triton_version)
    return _run_worker(python, site_packages, list(LOOKUPS), arch, lambda line: None, kind="lookups")[0]


def _problem(proof: ConfigProof, limit: int) -> str:
    for path, result in proof.paths.items():
        if not result["ok"]:
            return f"{path}: does not compile for gfx90a: {result['error']}"
        if result["lds_bytes"] > limit:
            return f"{path}: {result['lds_bytes']} bytes of LDS > gfx90a's {limit}"
        base = proof.baseline.get(path, {})
        spills = result["vgpr_spills"] + result["sgpr_spills"]
        if spills and base.get("ok") and not base["vgpr_spills"] + base["sgpr_spills"]:
            return f"{path}: spills {spills} registers where gfx942's kernel spills none"
    return ""


def _step_down(proof: ConfigProof, op: dict) -> bool:
    for step in op.get("step_down", []):  # an op whose config is chosen in code has none: it is what AITER runs
        key, floor = step["halve"], step["floor"]
        if isinstance(proof.config.get(key), int) and proof.config[key] // 2 >= floor:
            proof.steps.append(f"{key} {proof.config[key]} -> {proof.config[key] // 2} ({proof.problem})")
            proof.config = {**proof.config, key: proof.config[key] // 2}
            return True
    return False


def config_compiles(op: dict, config: dict, key: str, file: str, profile: dict) -> list[recipes.sizes.Path]:
    """The compiles that prove one ``config`` (at dotted ``key``) of ``file`` for ``op`` of the rules: its recipe
    called as AITER's wrapper launches it, with the key below the op's sections and the host ``profile``'s values
    the wrapper reads from the device. ``[(path, worker request)]``, one per code path."""
    inputs = {name: profile[value] for name, value in op.get("host_inputs", {}).items()}
    # the key below the op's sections: a bucket ("M_LEQ_64", "default") or a path ("N16.small")
    below = key.split(".", 1)[1] if op.get("sections") else key
    return recipes.RECIPES[op["recipe"]](config, below, _shape(file), **inputs)


def prove_files(site_packages: Path, triton_version: str, host: str,
                progress=lambda line: None) -> tuple[list[FileProof], int]:
    """Every config file of the tree classified, and the proven ones compiled; and how many compiles were read from
    ``compile_results()`` rather than made."""
    rules = load_rules()
    configs = site_packages / CONFIGS
    python = toolchain.triton_python(triton_version)
    proofs = classify(configs, rules)
    ops = {op["name"]: op for op in rules["ops"] + rules["in_code"]}
    profile = rules["hosts"][host]
    pending: list[tuple[FileProof, ConfigProof]] = []
    for proof in in_code(site_packages, rules, host):
        proofs.append(proof)
        pending.extend((proof, config) for config in proof.configs)
    for proof in proofs:
        if proof.status != "pending":
            continue
        document = json.loads((configs / proof.file).read_text())
        sections = ops[proof.op].get("sections")
        kept = {key: value for key, value in document.items() if sections is None or key in sections}
        for key, config in _leaves(kept):
            proof.configs.append(ConfigProof(key, config, _with_host(config, rules, host)))
        proof.derived = kept
        pending.extend((proof, config) for config in proof.configs)
    first, reused = True, 0
    for _ in range(MAX_STEPS + 1):
        if not pending:
            break
        requests, owners = [], {}
        for index, (proof, config) in enumerate(pending):
            for path, request in config_compiles(ops[proof.op], config.config, config.key, proof.file, profile):
                for arch in ["gfx90a", "gfx942"] if first else ["gfx90a"]:
                    identifier = f"{index}|{arch}|{path}"
                    requests.append({**request, "id": identifier, "arch": arch})
                    owners[identifier] = (config, arch, path)
        progress(f"compiling {len(requests)} kernels of {len(pending)} configs")
        answers, reused_now = _run_worker(python, site_packages, requests, "gfx90a", progress,
                                          results=compile_results())
        reused += reused_now
        for identifier, result in answers.items():
            config, arch, path = owners[identifier]
            (config.paths if arch == "gfx90a" else config.baseline)[path] = result
        first = False
        still = []
        for proof, config in pending:
            config.problem = _problem(config, rules["lds_limit_bytes"])
            if config.problem and _step_down(config, ops[proof.op]):
                config.paths = {}
                still.append((proof, config))
        pending = still
    limit = rules["lds_limit_bytes"]
    for proof in proofs:
        if proof.status == "in-code":
            # AITER runs its own choice: a spill is named, a kernel that does not compile or fit in LDS fails the op
            fatal = [config for config in proof.configs if any(
                not result["ok"] or result["lds_bytes"] > limit for result in config.paths.values())]
            named = [config for config in proof.configs if config.problem]
            if fatal:
                proof.status = "failed"
            if named:
                proof.reason += "; " + "; ".join(f"{config.key}: {config.problem}" for config in named)
            continue
        if proof.status != "pending":
            continue
        failing = [config for config in proof.configs if config.problem]
        if failing:
            proof.status, proof.derived = "failed", None
            proof.reason = "; ".join(f"{config.key}: {config.problem} (after {len(config.steps)} step-downs)"
                                     for config in failing)
            proof.target = None
            continue
        proof.status = "stepped-down" if any(config.steps for config in proof.configs) else "derived"
        for config in proof.configs:
            _replace(proof.derived, config.key.split("."), config.config)
    return proofs, reused


def _replace(document: dict, keys: list[str], value: dict) -> None:
    for key in keys[:-1]:
        document = document[key]
    document[keys[-1]] = value


def derived_files(proofs: list[FileProof]) -> dict[str, bytes]:
    """Each derived gfx90a config file, by its path under site-packages, as AITER reads it (JSON)."""
    return {f"{CONFIGS}/{proof.target}": (json.dumps(proof.derived, indent=4) + "\n").encode()
            for proof in proofs if proof.target and proof.derived is not None}


@cache
def proof_code_digest() -> str:
    """What a proof depends on besides the tree and the triton version: the rules and this code (the recipes, the
    worker, this module)."""
    code = code_digest((*recipes.MODULES, worker, sys.modules[__name__]))
    return hashlib.sha256(f"{rules_text()}\0{code}".encode()).hexdigest()


def _cached_proof(triton_version: str, digest: str, host: str) -> Path:
    key = hashlib.sha256("\0".join([triton_version, digest, host, proof_code_digest()]).encode()).hexdigest()[:24]
    return cache_root() / "triton-proofs" / f"{key}.json"


def committed_proof(triton_version: str, digest: str, host: str) -> dict | None:
    """The committed proof (cdna2/data/triton-proofs/) of this tree, triton version and host profile made by this
    code and these rules, if there is one: the releases the tool serves need no compile on the controller."""
    for path in sorted(COMMITTED.glob("*.json")):
        committed = json.loads(path.read_text())
        if (committed["triton"], committed["tree_digest"], committed["host"], committed["code_digest"]) == \
                (triton_version, digest, host, proof_code_digest()):
            return {**committed, "source": f"committed ({path.name})"}
    return None


def known_proof(triton_version: str, digest: str, host: str) -> dict | None:
    """The proof of the tree with ``digest``, without the tree: committed, or in the controller's cache."""
    cached = _cached_proof(triton_version, digest, host)
    found = committed_proof(triton_version, digest, host)
    if found is None and cached.exists():
        found = {**json.loads(cached.read_text()), "source": "controller cache"}
    return found


def prove(site_packages: Path, triton_version: str, host: str | None = None, progress=lambda line: None) -> dict:
    """The proof of one tree: committed, cached, or made now and cached. ``{"triton", "tree_digest", "host",
    "code_digest", "entries", "files", "seconds", "reused", "source"}``; ``source`` says which; ``seconds`` is what
    making it took, ``reused`` how many of its compiles were read back from earlier ones (0: a cold proof)."""
    rules = load_rules()
    host = host or rules["default_host"]
    if host not in rules["hosts"]:
        raise ProofError(f"host {host!r} is not in cdna2/data/{RULES_FILE} (hosts: {', '.join(rules['hosts'])})")
    digest = tree_digest(site_packages)
    cached = _cached_proof(triton_version, digest, host)
    with cache_lock(f"triton-proof-{cached.stem}"):
        found = known_proof(triton_version, digest, host)
        if found is not None:
            return found
        started = time.monotonic()
        proofs, reused = prove_files(site_packages, triton_version, host, progress)
        files = derived_files(proofs)
        result = {"triton": triton_version, "tree_digest": digest, "host": host, "code_digest": proof_code_digest(),
                  "entries": [proof.to_json() for proof in proofs],
                  "files": {path: data.decode() for path, data in files.items()},
                  "seconds": round(time.monotonic() - started, 1), "reused": reused}
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = cached.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(json.dumps(result, indent=1, sort_keys=True))
        staging.rename(cached)
    return {**result, "source": "compiled now"}

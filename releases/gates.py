"""``python -m releases gates``: vLLM's arch gates, evaluated by vLLM's own code, before and after patching.

For each real vLLM release (PyPI wheel, unpacked once into the cache) the patch engine plans and applies the vLLM sets
on a copy of the files they target, exactly as ``patch apply`` would: the required set and every optional set the
planner accepts on that release (a refused optional set is named with its reason). releases/vllm_gates/runner.py then
imports vLLM from the stock and from the patched files in the torch-CPU venv, on a pretend gfx90a and gfx942, and
reports what each gate answers. This module only judges those answers; it imports neither torch nor vLLM.

Expected per release: stock gfx90a has every attention gate closed; patched gfx90a has every attention gate open,
every FP8/FP4 gate closed, the CK int8 GEMM gates open exactly when vllm-ck-int8-gemm was applied, the software FP8
decode gate open exactly when vllm-fast-fp8-dequant was applied, AITER's Triton op gates (GEMM, rope, the unified
attention backend in the candidate list) open exactly when vllm-aiter-triton-ops was applied, and every other gate as
stock; on gfx942 every gate
answers the same before and after (a gate the patch adds must stay closed there). A linear kernel that none of
vLLM's ROCm kernel lists names is shown but not judged: no ROCm model reaches it.

Backend selection, for the model configs in releases/vllm_gates/models/ (vLLM's own selector, each kind of layer of each
model, in the prefer order, the stock order and with --attention-backend ROCM_AITER_FA): patched gfx90a picks
ROCM_AITER_FA for a model with full attention only, and never for any layer of a model with a sliding-window layer
(it corrupts them silently on gfx90a), logging the guard's reason, with which an explicit ROCM_AITER_FA is
refused; stock gfx90a never picks it; where vllm-aiter-triton-ops was applied, an explicit ROCM_AITER_UNIFIED_ATTN
serves the full-attention model and is refused by its own sliding-window guard for the others (naming that no
record of the host's smoke test is there), and no order picks it for a sliding-window model; with the host's record
of a passed sliding-window smoke check beside the guard (cdna2/host/window_proof.py), it serves the sliding-window
models too, and a record that failed, names another AITER file or another node, or does not parse is refused naming
why (on gfx90a: on gfx942 the guard declines nothing); on gfx942 the stock order and both explicit choices are the
same before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cdna2.cache import cache_root, code_digest
from cdna2.host import checkouts, digests, distributions, txn, window_proof
from cdna2.host.state import write_file_atomically
from cdna2.host.window_proof import CHECK as WINDOW_CHECK, FORMAT as WINDOW_FORMAT
from cdna2.patches import audit, catalog as catalog_module, cli, matching, planner
from cdna2.patches.catalog import Catalog, load_catalog
from cdna2.patches.cli import apply_in_place, probe
from cdna2.patches.planner import PackagePlan, plan_package
from lab import torchvenv, wheelhouse
from releases.discovery import vllm_releases

ARCHES = ("gfx90a", "gfx942")
COLUMNS = (("gfx90a", "stock"), ("gfx90a", "patched"), ("gfx942", "stock"), ("gfx942", "patched"))
RUNNER = Path(__file__).resolve().parent / "vllm_gates" / "runner.py"
MODELS = RUNNER.parent / "models"  # HF config.json files of the model shapes the selection is judged on
AITER_FA = "ROCM_AITER_FA"
GUARD_REASON = "is served wrong by ROCM_AITER_FA on gfx90a"  # in vllm-attention-gate's sliding-window-guard site
PREFER, STOCK_ORDER, EXPLICIT = "prefer", "stock order", "explicit ROCM_AITER_FA"  # vllm_gates/runner.py ORDERS
AITER_UNIFIED = "ROCM_AITER_UNIFIED_ATTN"
EXPLICIT_UNIFIED = f"explicit {AITER_UNIFIED}"  # vllm_gates/selection.py EXPLICITS
UNIFIED_GUARD_REASON = "ROCM_AITER_UNIFIED_ATTN is declined on gfx90a for sliding-window models"  # vllm-aiter-triton-ops
# Its exception: an explicit ROCM_AITER_UNIFIED_ATTN with a record beside the guard (vllm_gates/selection.py), one
# order per kind of record, and what its refusal names; EXPLICIT_UNIFIED has no record there.
SMOKE_PASSED = f"{EXPLICIT_UNIFIED}, host smoke passed"
WINDOW_REFUSALS = {f"{EXPLICIT_UNIFIED}, host smoke failed": f"{WINDOW_CHECK} failed",
                   f"{EXPLICIT_UNIFIED}, record of another AITER": "is not the file the smoke test proved",
                   f"{EXPLICIT_UNIFIED}, record of another node": "not of this node",
                   f"{EXPLICIT_UNIFIED}, record unparseable": "does not parse"}
NO_RECORD = "no record"
AITER_DOUBLE_FILE = "ops/triton/attention/unified_attention.py"  # under the AITER double's package directory
CK_INT8_SET, FAST_FP8_SET, TRITON_OPS_SET = "vllm-ck-int8-gemm", "vllm-fast-fp8-dequant", "vllm-aiter-triton-ops"
# Every AITER feature switched on, so a closed gate is closed by the arch, never by an operator's default.
ENVIRONMENT = {name: "1" for name in (
    "VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_LINEAR", "VLLM_ROCM_USE_AITER_MOE", "VLLM_ROCM_USE_AITER_MLA",
    "VLLM_ROCM_USE_AITER_MHA", "VLLM_ROCM_USE_AITER_FP8BMM", "VLLM_ROCM_USE_AITER_FP4BMM",
    "VLLM_ROCM_USE_AITER_LINEAR_HIPBMM", "VLLM_ROCM_USE_AITER_FP4_ASM_GEMM", "VLLM_ROCM_USE_AITER_TRITON_ROPE",
    "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS",
    "VLLM_ROCM_USE_AITER_TRITON_GEMM", "VLLM_ROCM_USE_AITER_RMSNORM", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT",
    "VLLM_PREFER_AITER_FA")}

ATTENTION, FP8_FP4, FP8_SOFTWARE, INT8, TRITON, OTHER = ("attention", "FP8/FP4", "FP8 software decode", "int8 GEMM",
                                                         "AITER Triton op", "other")
KINDS = (ATTENTION, FP8_FP4, FP8_SOFTWARE, INT8, TRITON, OTHER)
ATTENTION_GATES = ("rocm_aiter_ops.is_mha_enabled()", "rocm_aiter_ops.is_shuffle_kv_cache_enabled()",
                   "AiterFlashAttentionBackend.supports_compute_capability()",
                   "_get_backend_priorities() has ROCM_AITER_FA")
INT8_GATES = ("rocm_aiter_ops.is_linear_enabled()", "AiterInt8ScaledMMLinearKernel.is_supported()",
              "rocm_aiter_w8a8_gemm op registered")
# vllm-fast-fp8-dequant's own gate: block-FP8 GEMMs already run on gfx90a in Triton, decoding FP8 in software; the
# set routes them to a faster decode. No FP8 hardware path is opened.
FP8_SOFTWARE_GATES = ("_gfx90a_fast_fp8_eligible() (e4m3fn, fp32 scales, 128x128 blocks)",)
# vllm-aiter-triton-ops's: AITER Triton ops whose kernels were proven by compiling them for gfx90a (cdna2.triton).
TRITON_GATES = ("rocm_aiter_ops.is_triton_gemm_enabled()", "rocm_aiter_ops.is_triton_rotary_embed_enabled()",
                f"_get_backend_priorities() has {AITER_UNIFIED}")
# The master gate admits every AITER op, AITER's FP8 GEMMs among them, which gfx90a cannot run.
FP8_FP4_PATTERN = re.compile(r"fp8|fp4|is_aiter_found_and_supported", re.IGNORECASE)

Progress = Callable[[str], None]


def category(gate: str) -> str:
    if gate in ATTENTION_GATES:
        return ATTENTION
    if gate in INT8_GATES:
        return INT8
    if gate in FP8_SOFTWARE_GATES:
        return FP8_SOFTWARE
    if gate in TRITON_GATES:
        return TRITON
    if FP8_FP4_PATTERN.search(gate):
        return FP8_FP4
    return OTHER


@dataclass
class ReleaseGates:
    """One release: how it was patched, what each gate answered per (arch, tree), and the verdict."""

    version: str
    patch_status: str  # the plan's status with every accepted set: "apply", or why nothing could be patched
    applied_sets: list[str] = field(default_factory=list)
    variants: dict[str, str] = field(default_factory=dict)
    refused_sets: dict[str, str] = field(default_factory=dict)  # optional set -> why the planner left it out
    answers: dict[str, dict] = field(default_factory=dict)  # "stock"/"patched" -> arch -> runner outcome
    failures: list[str] = field(default_factory=list)

    @property
    def patched(self) -> bool:
        return "patched" in self.answers

    @property
    def verdict(self) -> str:
        if not self.patched:
            return f"NOT PATCHED: {self.patch_status}"
        return "ok" if not self.failures else "FAIL"

    def gate_names(self) -> list[str]:
        names = set()
        for per_arch in self.answers.values():
            for outcome in per_arch.values():
                names.update(outcome.get("result", {}).get("gates", {}))
        return sorted(names, key=lambda gate: (KINDS.index(category(gate)), gate))

    def answer(self, gate: str, arch: str, tree: str) -> dict | None:
        outcome = self.answers.get(tree, {}).get(arch)
        if outcome is None or not outcome.get("ok"):
            return None
        return outcome["result"]["gates"].get(gate)

    def selection(self, arch: str, tree: str) -> dict[str, dict]:
        """Model name -> the runner's selection for it (layers, choices per order and kind) on that column."""
        outcome = self.answers.get(tree, {}).get(arch)
        if outcome is None or not outcome.get("ok"):
            return {}
        return outcome["result"].get("selection", {}).get("models", {})

    def models(self) -> list[str]:
        return sorted({name for arch, tree in COLUMNS for name in self.selection(arch, tree)})

    def to_json(self) -> dict:
        return {"version": self.version, "verdict": self.verdict, "failures": self.failures,
                "patch_status": self.patch_status, "applied_sets": self.applied_sets, "variants": self.variants,
                "refused_sets": self.refused_sets, "answers": self.answers}


def _cell(answer: dict | None) -> str:
    if answer is None:
        return "-"
    if answer["error"]:
        return "error"
    return "open" if answer["open"] else "closed"


def _unevaluable_on_gfx942(release: ReleaseGates, gate: str, arch: str) -> str | None:
    """The error, when a gate fails the same way on stock and patched gfx942 (it needs AITER's compiled code, which
    cannot load here); on gfx942 only sameness is expected, and the same failure before and after is that."""
    if arch != "gfx942" or not release.patched:
        return None
    stock, patched = release.answer(gate, arch, "stock"), release.answer(gate, arch, "patched")
    if stock and patched and stock["error"] and stock["error"] == patched["error"]:
        return stock["error"]
    return None


def reachable_on_rocm(release: ReleaseGates, gate: str) -> bool:
    """False for a linear kernel no ROCm kernel list of vLLM names (its answer cannot route a ROCm model)."""
    answers = [release.answer(gate, arch, tree) for arch, tree in COLUMNS]
    return not any(answer and answer.get("on_rocm") is False for answer in answers)


def kind_label(release: ReleaseGates, gate: str) -> str:
    return category(gate) + ("" if reachable_on_rocm(release, gate) else " (no ROCm path)")


def judge(release: ReleaseGates) -> list[str]:
    """The expectations of the module docstring, as failures naming the gate, the arch and both answers."""
    failures = []
    for tree, per_arch in release.answers.items():
        for arch, outcome in per_arch.items():
            if not outcome.get("ok"):
                failures.append(f"{arch} {tree}: the runner failed: {outcome.get('error')}")
            elif outcome["result"]["detected"]["gcn_arch"] != arch:
                failures.append(f"{arch} {tree}: vLLM detected {outcome['result']['detected']['gcn_arch']}")
    applied = {INT8: CK_INT8_SET in release.applied_sets, FP8_SOFTWARE: FAST_FP8_SET in release.applied_sets,
               TRITON: TRITON_OPS_SET in release.applied_sets}
    for gate in release.gate_names():
        kind = category(gate)
        cells = {(arch, tree): _cell(release.answer(gate, arch, tree)) for arch, tree in COLUMNS}
        for (arch, tree), cell in cells.items():
            if cell == "error" and tree in release.answers and not _unevaluable_on_gfx942(release, gate, arch):
                failures.append(f"{gate} on {arch} {tree}: {release.answer(gate, arch, tree)['error']}")
        if not reachable_on_rocm(release, gate):
            continue
        stock, patched = cells[("gfx90a", "stock")], cells[("gfx90a", "patched")]
        if kind == ATTENTION and stock not in ("closed", "-"):
            failures.append(f"{gate} ({kind}) is {stock} on stock gfx90a; expected closed")
        if release.patched:
            expected = {ATTENTION: "open", FP8_FP4: "closed", OTHER: stock}.get(kind)
            if expected is None:
                expected = "open" if applied[kind] else stock
            if patched != expected:
                failures.append(f"{gate} ({kind}) is {patched} on patched gfx90a; expected {expected}"
                                + (" (as stock)" if expected == stock and kind not in (ATTENTION, FP8_FP4) else ""))
            gfx942 = (cells[("gfx942", "stock")], cells[("gfx942", "patched")])
            if gfx942[0] != gfx942[1] and gfx942 != ("-", "closed"):
                failures.append(f"{gate} ({kind}) changed on gfx942: {cells[('gfx942', 'stock')]} stock, "
                                f"{cells[('gfx942', 'patched')]} patched")
    return failures


def choice_label(choice: dict) -> str:
    """A selector outcome as a table word: the backend's name, "refused" (vLLM raised) or "error"."""
    return choice.get("backend") or ("refused" if "refused" in choice else "error")


def _choices_cell(choices: dict[str, dict] | None) -> str:
    if not choices:
        return "-"
    labels = {kind: choice_label(choice) for kind, choice in choices.items()}
    if len(set(labels.values())) == 1:
        return next(iter(labels.values()))
    return ", ".join(f"{kind} {label}" for kind, label in labels.items())


def judge_selection(release: ReleaseGates) -> list[str]:
    """The selection expectations of the module docstring, as failures naming the model, order, kind and choice."""
    failures = []
    for arch, tree in COLUMNS:
        for model, selected in release.selection(arch, tree).items():
            for order, choices in selected["choices"].items():
                failures += [f"{model} on {arch} {tree} ({order}), {kind} layers: {choice['error']}"
                             for kind, choice in choices.items() if "error" in choice]
    if not release.patched:
        return failures
    for model in release.models():
        patched = release.selection("gfx90a", "patched").get(model)
        stock = release.selection("gfx90a", "stock").get(model)
        for order, choices in (stock or {}).get("choices", {}).items():
            failures += [f"{model} on stock gfx90a ({order}), {kind} layers: {AITER_FA} chosen; AITER is closed there"
                         for kind, choice in choices.items() if choice.get("backend") == AITER_FA]
        if patched is None:
            failures.append(f"{model}: no selection on patched gfx90a")
            continue
        sliding = "sliding" in patched["layers"]
        for kind, choice in patched["choices"][PREFER].items():
            if sliding and choice.get("backend") in (AITER_FA, AITER_UNIFIED, None):
                failures.append(f"{model} (sliding-window layers) on patched gfx90a ({PREFER}), {kind} layers: "
                                f"{choice_label(choice)}; expected a backend other than {AITER_FA} and "
                                f"{AITER_UNIFIED}")
            if not sliding and choice.get("backend") != AITER_FA:
                failures.append(f"{model} (full attention) on patched gfx90a ({PREFER}), {kind} layers: "
                                f"{choice_label(choice)}; expected {AITER_FA}")
        for kind, choice in patched["choices"][STOCK_ORDER].items():
            if sliding and choice.get("backend") in (AITER_FA, AITER_UNIFIED):
                failures.append(f"{model} (sliding-window layers) on patched gfx90a ({STOCK_ORDER}), {kind} layers: "
                                f"{choice['backend']}")
        if TRITON_OPS_SET in release.applied_sets:
            refusals = {EXPLICIT_UNIFIED: NO_RECORD, **WINDOW_REFUSALS}
            for order in (*refusals, SMOKE_PASSED):
                for kind, choice in patched["choices"].get(order, {}).items():
                    refused = choice.get("refused", "")
                    if sliding and order in refusals and not (UNIFIED_GUARD_REASON in refused
                                                              and refusals[order] in refused):
                        failures.append(f"{model} (sliding-window layers) on patched gfx90a ({order}), {kind} layers: "
                                        f"{choice_label(choice)}; expected the start-up refusal of its sliding-window "
                                        f"guard, naming '{refusals[order]}'")
                    if (not sliding or order == SMOKE_PASSED) and choice.get("backend") != AITER_UNIFIED:
                        failures.append(f"{model} on patched gfx90a ({order}), {kind} layers: {choice_label(choice)}; "
                                        f"expected {AITER_UNIFIED}")
            failures += [f"{model} on patched gfx90a: no choice with {order}" for order in (*WINDOW_REFUSALS,
                                                                                          SMOKE_PASSED)
                         if order not in patched["choices"]]
        if sliding and not any(GUARD_REASON in text for text in patched.get("warnings", [])):
            failures.append(f"{model} (sliding-window layers) on patched gfx90a: vLLM logged no warning naming the "
                            f"guard's reason ({patched.get('warnings')})")
        for kind, choice in patched["choices"][EXPLICIT].items():
            if sliding and GUARD_REASON not in choice.get("refused", ""):
                failures.append(f"{model} (sliding-window layers) on patched gfx90a ({EXPLICIT}), {kind} layers: "
                                f"{choice_label(choice)}; expected the start-up refusal of the sliding-window guard")
            if not sliding and choice.get("backend") != AITER_FA:
                failures.append(f"{model} (full attention) on patched gfx90a ({EXPLICIT}), {kind} layers: "
                                f"{choice_label(choice)}; expected {AITER_FA}")
        before = release.selection("gfx942", "stock").get(model, {}).get("choices", {})
        after = release.selection("gfx942", "patched").get(model, {}).get("choices", {})
        for order in (STOCK_ORDER, EXPLICIT, EXPLICIT_UNIFIED):
            if before.get(order) != after.get(order):
                failures.append(f"{model} on gfx942 ({order}) changed: {_choices_cell(before.get(order))} stock, "
                                f"{_choices_cell(after.get(order))} patched")
    return failures


def sliding_window_fallback(release: ReleaseGates) -> str:
    """Which backend patched gfx90a takes instead of ROCM_AITER_FA for the sliding-window models (prefer order)."""
    picks = sorted({choice_label(choice) for model in release.models()
                    for selected in [release.selection("gfx90a", "patched").get(model)] if selected
                    and "sliding" in selected["layers"] for choice in selected["choices"][PREFER].values()})
    return ", ".join(picks) or "-"


def render_selection(releases: list[ReleaseGates]) -> str:
    """The selection table: release x model x order, the backend per column (per layer kind where they differ)."""
    header = ["release", "model", "layers", "order", *(f"{arch} {tree}" for arch, tree in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for release in releases:
        for model in release.models():
            layers = next((selected["layers"] for arch, tree in COLUMNS
                           for selected in [release.selection(arch, tree).get(model)] if selected), {})
            layer_text = " + ".join(f"{count} {kind}" for kind, count in layers.items())
            for order in (PREFER, STOCK_ORDER, EXPLICIT, EXPLICIT_UNIFIED, SMOKE_PASSED):
                cells = [_choices_cell(release.selection(arch, tree).get(model, {}).get("choices", {}).get(order))
                         for arch, tree in COLUMNS]
                lines.append("| " + " | ".join([release.version, model, layer_text, order, *cells]) + " |")
    return "\n".join(lines)


def render(releases: list[ReleaseGates]) -> str:
    """The gate table (release x gate x the four columns) and one verdict line per release."""
    header = ["release", "gate", "kind", *(f"{arch} {tree}" for arch, tree in COLUMNS)]
    rows = []
    for release in releases:
        for gate in release.gate_names():
            rows.append([release.version, gate, kind_label(release, gate),
                         *(_cell(release.answer(gate, arch, tree)) for arch, tree in COLUMNS)])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if any(release.models() for release in releases):
        lines += ["", "Attention backend chosen by vLLM's selector per model (VLLM_PREFER_AITER_FA=1 for prefer, 0 for "
                  "the stock order; explicit: --attention-backend NAME, refused = vLLM raises at start-up)",
                  "", render_selection(releases)]
    lines.append("")
    for release in releases:
        sets = ", ".join(f"{name} ({release.variants.get(name, '?')})" for name in release.applied_sets)
        lines.append(f"vLLM {release.version}: {release.verdict}" + (f"; patched with {sets}" if sets else ""))
        if release.patched and release.models():
            lines.append(f"  sliding-window models on patched gfx90a are served by {sliding_window_fallback(release)}")
        if release.patched and release.models() and TRITON_OPS_SET in release.applied_sets:
            lines.append(f"  an explicit {AITER_UNIFIED} serves them only where the host's smoke test passed "
                         f"{WINDOW_CHECK} (its record beside the guard: {SMOKE_PASSED})")
        lines += [f"  optional set {name} not applied: {reason.splitlines()[0]}"
                  for name, reason in release.refused_sets.items()]
        lines += [f"  {failure}" for failure in release.failures]
    return "\n".join(lines)


def _plan(catalog: Catalog, root: Path, optional: list[str]) -> PackagePlan:
    version, files, record = probe(root, catalog, "vllm")
    return plan_package(catalog, "vllm", version, files, record, optional)


def patch_copy(catalog: Catalog, root: Path, release: ReleaseGates, backup_dir: Path,
               optional: list[str] | None = None) -> bool:
    """Apply the required vLLM sets plus every optional one the planner accepts on top of them (or exactly the
    ``optional`` ones, as a host holds them), to ``root``.

    The planner is all or nothing per package, so each optional set is tried on its own first; one it refuses is
    recorded with the reason and left out, never silently. Returns whether anything was applied.
    """
    accepted: list[str] = []
    for name in sorted(catalog.optional_sets()) if optional is None else optional:
        if catalog.by_name(name).package != "vllm":
            continue
        plan = _plan(catalog, root, [*accepted, name])
        if plan.status in ("apply", "patched"):
            accepted.append(name)
        else:
            release.refused_sets[name] = "\n".join(plan.reasons)
    plan = _plan(catalog, root, accepted)
    release.patch_status = plan.status if plan.status == "apply" else "; ".join(plan.reasons).splitlines()[0]
    if plan.status != "apply":
        return False
    release.applied_sets, release.variants = plan.sets, plan.variants
    release.refused_sets.update(plan.declined)  # an optional set whose feature upstream removed
    result = apply_in_place(root, plan, backup_dir)
    if not result["ok"]:
        release.patch_status = f"apply failed: {result.get('error')}"
        return False
    return True


def load_models(directory: Path = MODELS) -> dict[str, dict]:
    """The model configs (HF config.json) the selection is judged on, by file stem."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def run_runner(python: Path, spec: dict) -> dict:
    result = subprocess.run([str(python), str(RUNNER)], input=json.dumps(spec), capture_output=True, text=True)
    if result.returncode != 0:
        releases = ", ".join(release["version"] for release in spec["releases"])
        raise RuntimeError(f"{RUNNER} failed (exit {result.returncode}) for vLLM {releases}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout)


def prepare_release(version: str, catalog: Catalog, work_dir: Path, progress: Progress,
                    optional: list[str] | None = None) -> tuple[ReleaseGates, dict]:
    """Unpack (cached), copy and patch one release (``optional``: see patch_copy); the runner's entry for it.
    ``work_dir`` holds the patched copy."""
    requirement = f"vllm=={version}"
    progress(f"vLLM {version}: unpacking the wheel (cached after the first run)")
    tree = wheelhouse.installed_tree(requirement)
    copy = wheelhouse.copy_subset(tree, catalog.target_files("vllm"), work_dir / "site-packages")
    release = ReleaseGates(version=version, patch_status="")
    patched = patch_copy(catalog, copy, release, work_dir / "backups", optional)
    progress(f"vLLM {version}: {'patched with ' + ', '.join(release.applied_sets) if patched else 'not patched'}")
    return release, {"version": version, "stock": str(tree), "patched": str(copy) if patched else None}


def window_records(aiter_double: Path) -> dict[str, dict | str]:
    """The sliding-window record each window order puts beside the guard (a str: bytes that do not parse), of the
    AITER double's unified-attention file, which this writes: the node and triton are the runner's own."""
    source = aiter_double / AITER_DOUBLE_FILE
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("# Test double of AITER's Triton unified attention: the guard reads only its digest.\n")
    passed = {"format": WINDOW_FORMAT, "check": WINDOW_CHECK, "status": "passed", "at": "2026-12-07T12:00:00Z",
              "detail": "a stand-in record: no GPU ran it",
              "aiter_files": {AITER_DOUBLE_FILE: digests.file_sha256(source)}}
    failed, other_aiter, other_node, unparseable = WINDOW_REFUSALS
    return {SMOKE_PASSED: passed,
            failed: {**passed, "status": "failed", "detail": "a stand-in record of a failed check"},
            other_aiter: {**passed, "aiter_files": {AITER_DOUBLE_FILE: "0" * 64}},
            other_node: {**passed, "node": "another-node"},
            unparseable: '{"format": 1, "status": "passed"'}


def releases(catalog: Catalog | None = None) -> tuple[str, ...]:
    """The coverage table's vLLM releases: every one from the floor to the newest on the index (releases/discovery.py),
    but those refused by name."""
    found = vllm_releases(catalog or load_catalog())
    return tuple(release for release in found.releases if release not in found.refused)


def _evaluation_inputs(catalog: Catalog, python: Path) -> list[str] | None:
    """What every release's evaluation (patching and the runner's answers, not the verdict) depends on beside its own
    wheel: the catalog's bytes, the code that patches and evaluates (this module, the patch engine and the
    directories its transactions create, the sliding-window record's format, everything under releases/vllm_gates:
    runner, doubles, model configs), the torch-CPU venv (its path names its requirements) and the Python running the
    engine. None for a catalog built in code (no digest): never kept."""
    if not catalog.digest:
        return None
    runner_files = sorted(path for path in RUNNER.parent.rglob("*")
                          if path.is_file() and "__pycache__" not in path.parts)
    code = code_digest((sys.modules[__name__], planner, matching, audit, catalog_module, cli, txn, checkouts, digests,
                        distributions, wheelhouse, window_proof))
    evaluator = hashlib.sha256(b"".join(str(path.relative_to(RUNNER.parent)).encode() + b"\0" + path.read_bytes()
                                        for path in runner_files)).hexdigest()
    return [catalog.digest, code, evaluator, str(python), sys.version]


def _evaluation_path(inputs: list[str] | None, version: str) -> Path | None:
    """Where one release's evaluation is kept: keyed by ``inputs`` (``_evaluation_inputs``) and the wheel's files
    (the digest of its RECORD, which lists each file's sha256)."""
    if inputs is None:
        return None
    tree = wheelhouse.installed_tree(f"vllm=={version}")
    records = sorted(tree.glob("*.dist-info/RECORD"))
    if not records:
        raise RuntimeError(f"{tree}: no *.dist-info/RECORD; remove this cached tree and run again")
    key = json.dumps([*inputs, version, tree.name, [digests.file_sha256(record) for record in records]])
    return cache_root() / "vllm-gates-evaluations" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def _kept_evaluation(path: Path | None) -> ReleaseGates | None:
    if path is None or not path.is_file():
        return None
    with contextlib.suppress(ValueError, TypeError, KeyError):
        fields = json.loads(path.read_text())
        return ReleaseGates(fields["version"], fields["patch_status"], fields["applied_sets"], fields["variants"],
                            fields["refused_sets"], fields["answers"])
    return None


def evaluate(versions: tuple[str, ...] | None = None, progress: Progress = lambda line: None,
             workers: int = 2, catalog: Catalog | None = None) -> list[ReleaseGates]:
    """Every release in ``versions`` (default: ``releases()``), in the given order: ``workers`` runners (each one busy
    process) share them. ``catalog``: the patch sets to apply (default: the packaged ones).

    A runner imports torch and what vLLM pulls in from outside itself once, then forks a child per release, tree
    and arch: that import (about 10 CPU-s) is paid per runner, not per release. Each release's evaluation is kept in
    ``$CDNA2_CACHE/vllm-gates-evaluations`` (``_evaluation_inputs`` and ``_evaluation_path`` name its key): a
    release none of those inputs changed for is not patched or run again. The judging is never kept: it is done on
    every call.
    """
    catalog = catalog or load_catalog()
    versions = releases(catalog) if versions is None else versions
    progress("torch-CPU venv: building or reusing it")
    python = torchvenv.torch_cpu_python()
    inputs = _evaluation_inputs(catalog, python)
    paths = {version: _evaluation_path(inputs, version) for version in versions}
    evaluated = {version: kept for version in versions if (kept := _kept_evaluation(paths[version])) is not None}
    if evaluated:
        progress(f"vLLM {', '.join(evaluated)}: evaluated before with the same inputs (kept in "
                 f"{cache_root() / 'vllm-gates-evaluations'})")
    with tempfile.TemporaryDirectory(prefix="cdna2-gates-") as scratch:
        prepared = [prepare_release(version, catalog, Path(scratch) / version, progress)
                    for version in versions if version not in evaluated]
        entries = [entry for _, entry in prepared]
        shares = [entries[index::workers] for index in range(min(workers, len(entries)))]
        aiter_double = Path(scratch) / "aiter-double"
        spec = {"arches": list(ARCHES), "environment": ENVIRONMENT, "models": load_models(),
                "bytecode_cache": str(cache_root() / "vllm-gates-bytecode"),
                "window_records": window_records(aiter_double), "aiter_double": str(aiter_double)}
        if shares:
            progress(f"evaluating the gates of {len(entries)} releases in {len(shares)} runners")
        answers: dict[str, dict] = {}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for share_answers in pool.map(lambda share: run_runner(python, {**spec, "releases": share}), shares):
                answers.update(share_answers)
    for release, _ in prepared:
        release.answers = answers[release.version]
        evaluated[release.version] = release
        if paths[release.version] is not None:
            kept = {"version": release.version, "patch_status": release.patch_status,
                    "applied_sets": release.applied_sets, "variants": release.variants,
                    "refused_sets": release.refused_sets, "answers": release.answers}
            write_file_atomically(paths[release.version], json.dumps(kept, sort_keys=True).encode())
    for release in evaluated.values():
        release.failures = judge(release) + judge_selection(release)
    return [evaluated[version] for version in versions]


def command(json_path: Path | None) -> int:
    """Print the table; exit 1 when a release the current sets patch breaks an expectation."""
    releases = evaluate(progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(releases))
    if json_path is not None:
        json_path.write_text(json.dumps([release.to_json() for release in releases], indent=1, sort_keys=True))
    return 1 if any(release.verdict == "FAIL" for release in releases) else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("gates", help="vLLM's arch gates and attention backend selection on every vLLM "
                                                 "release from the floor to the newest on the index, stock and "
                                                 "patched, on gfx90a and gfx942")
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE (the table goes to stdout)")
    parser.set_defaults(func=lambda args: command(Path(args.json) if args.json else None))

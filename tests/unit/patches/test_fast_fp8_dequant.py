"""The optional vllm-fast-fp8-dequant set, on the real vLLM 0.23.0, 0.26.0 and 0.33.0 files.

Engine level: plan, apply (cdna2.host.txn), check and revert round-trip byte-identically, the patched file compiles,
the set adds lines and changes none, an edited anchor is refused. Kernel level (slow): the PATCHED text, as the
engine writes it, is run in a venv with CPU torch and the real triton wheel (lab/torchvenv.py): in Triton's CPU
interpreter (decode table, matmuls, eligibility) and through Triton's real AMD compiler for gfx90a (instruction
counts). The only test doubles are vLLM's platform queries (fast_fp8/platform_doubles.py): there is no GPU here.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from cdna2.host import txn
from cdna2.patches import plan_package
from cdna2.patches.cli import apply_in_place, probe
from tests.unit.patches.conftest import copy_real_subset
from lab.torchvenv import torch_cpu_python

SET = "vllm-fast-fp8-dequant"
FP8_UTILS = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
VERSIONS = ("0.23.0", "0.26.0", "0.33.0")
RUNNER = Path(__file__).resolve().parent / "fast_fp8" / "runner.py"
FAST, STOCK = "_gfx90a_fast_block_scaled_mm", "_w8a8_triton_block_scaled_mm"


def copy_vllm(catalog, version: str, destination: Path) -> Path:
    return copy_real_subset(catalog, f"vllm=={version}", "vllm", destination)


def plan_for(catalog, root: Path, optional: list[str]):
    version, files, record = probe(root, catalog, "vllm")
    return plan_package(catalog, "vllm", version, files, record, optional)


def change_of(plan, path: str):
    return next(change for change in plan.changes if change.path == path)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def function_source(text: str, name: str) -> str:
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node)


# ---------------------------------------------------------------------------------------------------- engine level

def test_set_is_optional_and_stands_alone(catalog):
    patch_set = catalog.by_name(SET)
    assert patch_set.optional and patch_set.package == "vllm"
    # Both sites read only names stock fp8_utils.py and vllm.platforms.rocm define (see the YAML header).
    assert patch_set.requires == ()
    assert [v.id for v in patch_set.variants] == ["0.23-0.33"]
    assert {site.file for site in patch_set.variants[0].sites} == {FP8_UTILS}


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_check_revert_round_trip(catalog, version, tmp_path):
    root = copy_vllm(catalog, version, tmp_path / "site-packages")
    pristine = (root / FP8_UTILS).read_text()
    before = snapshot(root)

    without = plan_for(catalog, root, [])
    plan = plan_for(catalog, root, [SET])
    assert plan.status == "apply", plan.reasons
    assert plan.variants[SET] == "0.23-0.33"
    assert {c.path for c in plan.changes} == {c.path for c in without.changes} | {FP8_UTILS}, \
        "the set must touch fp8_utils.py and nothing else"
    assert plan.jit_invalidations == without.jit_invalidations, "the set declares no JIT output to remove"
    assert snapshot(root) == before, "planning must not write"

    result = apply_in_place(root, plan, tmp_path / "backup")
    assert result["ok"], result
    patched = (root / FP8_UTILS).read_text()
    compile(patched, str(root / FP8_UTILS), "exec")
    assert function_source(patched, STOCK) == function_source(pristine, STOCK), \
        "the stock kernel's source (its Triton cache key) must stay byte-identical"

    check = plan_for(catalog, root, [SET])
    assert check.status == "patched" and check.changes == [], check.reasons
    assert {s.site: s.state for s in check.sites if s.set_name == SET} == {"fast-kernel": "patched",
                                                                          "fast-launch": "patched"}

    txn.revert(tmp_path / "backup", root)
    assert snapshot(root) == before, "revert must give back byte-identical files"


@pytest.mark.parametrize("version", VERSIONS)
def test_set_only_adds_lines(catalog, version, tmp_path):
    root = copy_vllm(catalog, version, tmp_path / "site-packages")
    diff = change_of(plan_for(catalog, root, [SET]), FP8_UTILS).diff.splitlines()
    removed = [line for line in diff[2:] if line.startswith("-")]
    added = [line for line in diff[2:] if line.startswith("+")]
    assert removed == [], f"the set must not change stock lines of {FP8_UTILS}: {removed[:5]}"
    assert any(line.startswith("+def _gfx90a_fast_block_scaled_mm(") for line in added)
    assert "+    if _gfx90a_fast_fp8_eligible(A, B, As, Bs, block_size):" in added


@pytest.mark.parametrize("site_id, edit", [
    ("fast-launch", lambda text: text.replace("    _w8a8_triton_block_scaled_mm[grid](\n        A,\n",
                                              "    _w8a8_triton_block_scaled_mm[grid](\n        A.contiguous(),\n")),
    ("fast-kernel", lambda text: text.replace("@triton.jit\ndef _w8a8_triton_block_scaled_mm(",
                                              "@triton.jit()\ndef _w8a8_triton_block_scaled_mm(")),
])
def test_edited_anchor_is_refused_and_nothing_changes(catalog, tmp_path, site_id, edit):
    root = copy_vllm(catalog, "0.26.0", tmp_path / "site-packages")
    path = root / FP8_UTILS
    edited = edit(path.read_text())
    assert edited != path.read_text(), "the edit must hit the anchor"
    path.write_text(edited)
    before = snapshot(root)

    refused = plan_for(catalog, root, [SET])
    assert refused.status == "refused" and refused.changes == []
    text = "\n".join(refused.reasons)
    assert f"vllm 0.26.0: set {SET}: no variant matches the installed text" in text, text
    assert f"{FP8_UTILS}: site {site_id}: expected the anchor 1x, found 0 unpatched and 0 patched" in text, text
    assert snapshot(root) == before


# ---------------------------------------------------------------------------------------------------- kernel level

def run_patched(mode: str, patched: Path, work_dir: Path) -> dict:
    """Run runner.py MODE on a patched fp8_utils.py in the fp8 venv; returns its JSON report."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    # A private Triton cache: the compile counts come from a real compile, and ~/.triton is left alone.
    environment["TRITON_CACHE_DIR"] = str(work_dir / "triton-cache")
    if mode == "interpret":
        environment["TRITON_INTERPRET"] = "1"
    result = subprocess.run([str(torch_cpu_python()), str(RUNNER), mode, str(patched), str(work_dir / "extract")],
                            capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, f"runner.py {mode} {patched} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout)


def patched_fp8_utils(catalog, version: str, directory: Path, mutate=None) -> Path:
    """fp8_utils.py exactly as the engine would write it for vLLM ``version`` (optionally mutated)."""
    root = copy_vllm(catalog, version, directory / "site-packages")
    text = change_of(plan_for(catalog, root, [SET]), FP8_UTILS).new_bytes.decode()
    if mutate is not None:
        text = mutate(text)
    target = directory / "patched" / "fp8_utils.py"
    target.parent.mkdir(parents=True)
    target.write_text(text)
    return target


@pytest.fixture(scope="module", params=VERSIONS)
def interpreted(request, catalog, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"interpret-{request.param}")
    return request.param, run_patched("interpret", patched_fp8_utils(catalog, request.param, directory), directory)


@pytest.mark.slow
def test_decode_is_bit_exact_on_every_non_nan_byte(interpreted):
    _, report = interpreted
    decode = report["decode"]
    assert decode["non_nan_bytes"] == 254
    assert decode["value_mismatches"] == [], "decoded * 256 must equal torch's e4m3fn value, bit for bit (-0 too)"
    assert decode["fp16_bit_mismatches"] == [], "the fp16 must be exactly 2**-8 times the e4m3fn value"
    assert decode["nan_bytes"] == {"0x7f": 480.0, "0xff": -480.0}, "e4m3fn NaN bytes decode to +-480"
    assert (decode["largest"], decode["smallest_nonzero"]) == (448.0, 2.0**-9)


@pytest.mark.slow
def test_fast_kernel_equals_stock_and_reference(interpreted):
    version, report = interpreted
    assert {case["name"] for case in report["matmul"]} >= {"ragged-all", "ragged-fp16-strided", "batched-fp32",
                                                           "e8m0-scales"}
    for case in report["matmul"]:
        where = f"vllm {version} case {case['name']} {case['a_shape']}x{case['n']} -> {case['out']}"
        assert case["kernels_gfx90a"] == [FAST], f"{where}: gfx90a must launch only the fast kernel"
        assert case["kernels_gfx942"] == [STOCK], f"{where}: MI300 must launch only the stock kernel"
        assert case["finite"], where
        # Same fp16 dot products scaled by 2**-16, and power-of-two scaling commutes with rounding: identical bits.
        assert case["fast_equals_stock_bitwise"], f"{where}: fast and stock kernels differ"
        # The bound (runner.reference_and_bound) is the rigorous fp32 summation bound plus output rounding.
        assert case["max_error_over_bound"] <= 1.0, f"{where}: error {case['max_abs_error']} exceeds the bound"


@pytest.mark.slow
def test_eligibility_only_gfx90a_e4m3fn_fp32_128x128(interpreted):
    _, report = interpreted
    rows = {row["case"]: row for row in report["eligibility"]}
    assert set(rows) >= {"gfx942", "gfx950", "gfx1100", "cuda", "a-fnuz", "b-fnuz", "a-e5m2", "b-e5m2", "a-int8",
                         "b-int8", "as-bf16", "bs-fp16", "block-64x128", "block-128x64", "block-256x128"}
    eligible = sorted(name for name, row in rows.items() if row["eligible"])
    assert eligible == ["gfx90a-block-tuple", "gfx90a-e4m3fn"]
    assert rows["cuda"]["rocm_queries"] == {}, "off ROCm the predicate must not ask vllm.platforms.rocm anything"
    assert rows["gfx90a-e4m3fn"]["rocm_queries"] == {"on_gfx9": 1, "on_mi3xx": 1}


@pytest.mark.slow
def test_a_wrong_rescale_is_caught(catalog, tmp_path):
    """The kernel checks can fail: rescaling by 2**8 (one operand's worth) instead of 2**16 must be detected."""
    patched = patched_fp8_utils(catalog, "0.23.0", tmp_path,
                                mutate=lambda text: text.replace("accumulator * 65536.0", "accumulator * 256.0", 1))
    report = run_patched("interpret", patched, tmp_path)
    for case in report["matmul"]:
        assert not case["fast_equals_stock_bitwise"], case["name"]
        assert case["max_error_over_bound"] > 1.0, case["name"]


@pytest.mark.slow
def test_fast_kernel_compiles_for_gfx90a_without_the_fp8_decode(catalog, tmp_path):
    report = run_patched("compile", patched_fp8_utils(catalog, "0.26.0", tmp_path), tmp_path)
    stock, fast = report["kernels"][STOCK], report["kernels"][FAST]
    print(json.dumps(report, indent=1))  # the measurement, for the log (-s)
    # Both run the same fp16 MFMA: e4m3fn is widened to fp16 either way; only how it is widened differs.
    assert fast["mfma"] == stock["mfma"] and set(fast["mfma"]) == {"v_mfma_f32_32x32x8f16"}, (stock, fast)
    assert stock["v_cmp_ne_u16"] > 1000, f"the stock kernel should open-code the FP8 decode on gfx90a: {stock}"
    assert fast["v_cmp_ne_u16"] == 0, fast
    assert fast["v_cndmask_b32"] * 5 < stock["v_cndmask_b32"], (stock, fast)
    assert fast["instructions"] < stock["instructions"], (stock, fast)

"""AITER's conv2d kernels (v0.1.20 on) on gfx90a: the seven config files classified on the real v0.1.20.post1 tree,
and the configs the set ships compiled for gfx90a with that release's kernels once (one worker call, one path each;
the whole-tree proof compiles every path)."""

from __future__ import annotations

import json

import pytest

from cdna2.patches.catalog import PACKAGE_DIR
from cdna2.triton import proof, recipes
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.toolchain import triton_python
from releases import coverage

SHIPPED = PACKAGE_DIR / "data" / "triton-configs" / "0.1.17-main" / proof.CONFIGS / "conv"
LIMIT = 65536
# config file -> recipe; the Winograd transforms are element-wise (no dot, so no MFMA)
FILES = {"CONV-1X1": "conv_1x1", "CONV-3X3-NHWC": "conv_3x3_nhwc", "CONV-3X3-CBLOCKED": "conv_3x3_cblocked",
         "CONV-GENERAL": "conv_general", "CONV-WINO-F4X3-GEMM": "conv_winograd_gemm",
         "CONV-WINO-F4X3-INPUT": "conv_winograd_input", "CONV-WINO-F4X3-OUTPUT": "conv_winograd_output"}
NO_DOT = {"CONV-WINO-F4X3-INPUT", "CONV-WINO-F4X3-OUTPUT"}


@pytest.fixture(scope="module")
def tree(aiter_git_dir):
    return coverage.aiter_triton_tree(aiter_git_dir, "v0.1.20.post1")


@pytest.mark.slow
def test_every_conv_file_has_its_recipe(tree):
    by_file = {entry.file: entry for entry in proof.classify(tree / proof.CONFIGS, proof.load_rules())}
    for name, recipe in FILES.items():
        entry = by_file[f"conv/gfx942-{name}.json"]
        assert entry.status == "pending" and entry.target == f"conv/gfx90a-{name}.json", entry
        assert next(op for op in proof.load_rules()["ops"] if op["name"] == entry.op)["recipe"] == recipe


@pytest.fixture(scope="module")
def shipped_compiled(tree):
    requests = []
    for name, recipe in FILES.items():
        config = json.loads((SHIPPED / f"gfx90a-{name}.json").read_text())["any"]
        path, request = recipes.RECIPES[recipe](config, "any", None)[0]
        requests.append({**request, "id": f"{name} {path}"})
    return proof._run_worker(triton_python(DEFAULT_TRITON), tree, requests, "gfx90a", lambda line: None)


@pytest.mark.slow
def test_shipped_conv_configs_compile_for_gfx90a_within_lds_without_spills(shipped_compiled):
    assert len(shipped_compiled) == len(FILES)
    for identifier, result in shipped_compiled.items():
        assert result["ok"], (identifier, result)
        assert result["lds_bytes"] <= LIMIT and result["vgpr_spills"] == 0, (identifier, result)
        dots = identifier.split()[0] not in NO_DOT
        assert bool(result["mfma"]) == dots, (identifier, result["mfma"])

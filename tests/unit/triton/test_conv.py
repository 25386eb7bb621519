"""AITER's conv2d kernels (v0.1.20 on) on gfx90a: the seven config files classified on the real v0.1.20.post1 tree,
and what the committed v0.1.20.post1 proof found compiling every path of their configs for gfx90a."""

from __future__ import annotations

import pytest

from cdna2.triton import proof
from releases import coverage
from tests.unit.triton.conftest import committed_entries

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


def test_every_conv_path_the_v0_1_20_post1_proof_compiled_fits_and_dots_where_the_kernel_does():
    entries = committed_entries("0.1.20.post1", set(FILES.values()))
    assert len(entries) == len(FILES)
    for name, op in FILES.items():
        for config in entries[op]["configs"]:
            for path, result in config["paths"].items():
                where = (name, config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT and result["vgpr_spills"] == 0, where
                assert bool(result["mfma"]) == (name not in NO_DOT), where

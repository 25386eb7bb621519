"""AITER's conv2d kernels (v0.1.18 on) on gfx90a: the seven config files classified on the real v0.1.19.post2 and
v0.1.20.post1 trees, and what their committed proofs found compiling every path of their configs for gfx90a."""

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


RELEASES = ("0.1.19.post2", "0.1.20.post1")  # committed proofs; v0.1.19.post2 stands for 0.1.18 to 0.1.19.post2


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
def test_every_conv_file_has_its_recipe(release, aiter_git_dir):
    tree = coverage.aiter_triton_tree(aiter_git_dir, f"v{release}")
    by_file = {entry.file: entry for entry in proof.classify(tree / proof.CONFIGS, proof.load_rules())}
    for name, recipe in FILES.items():
        entry = by_file[f"conv/gfx942-{name}.json"]
        assert entry.status == "pending" and entry.target == f"conv/gfx90a-{name}.json", entry
        assert next(op for op in proof.load_rules()["ops"] if op["name"] == entry.op)["recipe"] == recipe


@pytest.mark.parametrize("release", RELEASES)
def test_every_conv_path_the_committed_proofs_compiled_fits_and_dots_where_the_kernel_does(release):
    entries = committed_entries(release, set(FILES.values()))
    assert len(entries) == len(FILES)
    for name, op in FILES.items():
        for config in entries[op]["configs"]:
            for path, result in config["paths"].items():
                where = (release, name, config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= LIMIT and result["vgpr_spills"] == 0, where
                assert bool(result["mfma"]) == (name not in NO_DOT), where

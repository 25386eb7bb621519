"""vllm-aiter-triton-gemm's one site on every vLLM release discovered from the floor on (0.23.0 through 0.34.0
today, from their PyPI wheels): found once unpatched, patched cleanly, undone to the wheel's
bytes. The whole cycle with the required sets, and the gate it opens, are the coverage and gates tables'."""

from __future__ import annotations

import pytest

from cdna2.patches import load_catalog, matching
from cdna2.patches.planner import PATCHED, PRISTINE, site_state
from releases import coverage, discovery

SET = "vllm-aiter-triton-gemm"
RELEASES = discovery.vllm_releases(load_catalog()).releases


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_the_triton_gemm_site_matches_and_patches(version):
    catalog = load_catalog()
    (variant,) = catalog.by_name(SET).variants
    assert version in variant.versions
    (site,) = variant.sites
    tree = coverage.wheel_tree(f"vllm=={version}", catalog.target_files("vllm"))
    text = (tree / site.file).read_text()
    assert site_state(text, site, SET, variant.id).state == PRISTINE
    patched = matching.splice(text, site.anchor, site.replacement, site.file, site.match)
    assert site_state(patched, site, SET, variant.id).state == PATCHED
    assert site.marker in patched and "@if_aiter_supported\n    def is_triton_gemm_enabled" not in patched
    assert matching.splice(patched, site.replacement, site.anchor, site.file, site.match) == text


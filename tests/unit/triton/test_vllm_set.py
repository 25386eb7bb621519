"""vllm-aiter-triton-ops' sites on every vLLM release discovered from the floor on (0.23.0 through 0.34.0 today, from
their PyPI wheels): each found once unpatched, patched cleanly, undone to the wheel's bytes. The whole cycle with the
required sets, and the gates they open, are the coverage and gates tables'."""

from __future__ import annotations

import pytest

from cdna2.patches import load_catalog, matching
from cdna2.patches.planner import PATCHED, PRISTINE, site_state
from releases import coverage, discovery

SET = "vllm-aiter-triton-ops"
RELEASES = discovery.vllm_releases(load_catalog()).releases
# What each site leaves gated by the master gate no more, and the stock line that must be gone once patched.
STOCK_GATE = {"triton-gemm-gate": "@if_aiter_supported\n    def is_triton_gemm_enabled",
              "triton-rope-gate": "@if_aiter_supported\n    def is_triton_rotary_embed_enabled",
              "unified-attention-candidate": "    if is_aiter_found_and_supported():\n        backends.append("
                                             "AttentionBackendEnum.ROCM_AITER_UNIFIED_ATTN)",
              "unified-attention-sliding-window-guard": None}


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_every_site_matches_and_patches(version):
    catalog = load_catalog()
    (variant,) = catalog.by_name(SET).variants
    assert version in variant.versions
    assert {site.id for site in variant.sites} == set(STOCK_GATE)
    tree = coverage.wheel_tree(f"vllm=={version}", catalog.target_files("vllm"))
    for site in variant.sites:
        text = (tree / site.file).read_text()
        assert site_state(text, site, SET, variant.id).state == PRISTINE, site.id
        patched = matching.splice(text, site.anchor, site.replacement, site.file, site.match)
        assert site_state(patched, site, SET, variant.id).state == PATCHED, site.id
        assert site.marker in patched and site.marker not in text, site.id
        if STOCK_GATE[site.id]:
            assert STOCK_GATE[site.id] not in patched, site.id
        compile(patched, site.file, "exec")  # the spliced file is still Python
        assert matching.splice(patched, site.replacement, site.anchor, site.file, site.match) == text

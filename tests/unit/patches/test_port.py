"""``python -m cdna2 patch port``: a draft variant for a release no variant matches, placed by surrounding code."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import yaml

from cdna2.__main__ import main
from cdna2.patches import plan_package
from cdna2.patches.catalog import PatchSet, _patch_set
from cdna2.patches.cli import probe
from cdna2.patches.port import carry_change
from tests.unit.patches.test_real_trees import snapshot

SET = "vllm-attention-gate"


def vllm_tree(version):
    from cdna2.patches import load_catalog
    from releases import coverage

    return coverage.wheel_tree(f"vllm=={version}", load_catalog().target_files("vllm"))


def without_variant(catalog, variant_id):
    return replace(catalog, sets=tuple(
        patch_set if patch_set.name != SET else
        replace(patch_set, variants=tuple(v for v in patch_set.variants if v.id != variant_id))
        for patch_set in catalog.sets))


def port(capsys, root, monkeypatch, catalog):
    monkeypatch.setattr("cdna2.patches.cli.load_catalog", lambda: catalog)
    code = main(["patch", "port", "--set", SET, "--site-packages", str(root)])
    out = capsys.readouterr().out
    return code, out


def with_draft(catalog, out):
    draft = yaml.safe_load(out)[0]
    patch_set = catalog.by_name(SET)
    document = {"name": SET, "package": "vllm", "role": "required", "summary": patch_set.summary,
                "variants": [draft]}
    drafted: PatchSet = _patch_set(document, patch_set.source)
    return replace(catalog, sets=tuple(drafted if s.name == SET else s for s in catalog.sets))


def test_carry_change_keeps_new_context_and_flags_rewritten_lines():
    old = "    @classmethod\n    @if_aiter_supported\n    def f(cls) -> bool:\n"
    new_replacement = "    @classmethod\n    @if_aiter_attention_supported  # x\n    def f(cls) -> bool:\n"
    assert carry_change(old, new_replacement, old.replace("f(cls)", "f(cls, x=None)")) == (
        new_replacement.replace("f(cls)", "f(cls, x=None)"), True)
    assert carry_change(old, new_replacement, old.replace("@if_aiter_supported", "@if_supported"))[1] is False


@pytest.mark.slow
def test_draft_for_027_without_its_variant_takes_every_gate_and_patches_like_the_real_one(
        catalog, tmp_path, capsys, monkeypatch):
    root = tmp_path / "site-packages"
    shutil.copytree(vllm_tree("0.27.0"), root)
    before = snapshot(root)
    code, out = port(capsys, root, monkeypatch, without_variant(catalog, "0.27-0.28"))
    assert code == 0, out
    assert snapshot(root) == before, "port writes nothing into the package"
    assert "# review: torch-fp8-scaled-mm-narrowing: taken from variant 0.23-0.26: its gate is still here" in out
    drafted = plan_package(with_draft(catalog, out), "vllm", *probe(root, catalog, "vllm"), [])
    real = plan_package(catalog, "vllm", *probe(root, catalog, "vllm"), [])
    assert drafted.status == real.status == "apply", drafted.reasons
    assert {c.path: c.new_bytes for c in drafted.changes} == {c.path: c.new_bytes for c in real.changes}


@pytest.mark.slow
def test_a_site_whose_context_changed_is_placed_by_surrounding_code(catalog, tmp_path, capsys, monkeypatch):
    root = tmp_path / "site-packages"
    shutil.copytree(vllm_tree("0.26.0"), root)
    ops = root / "vllm/_aiter_ops.py"
    text = ops.read_text()
    old = "    @if_aiter_supported\n    def is_mha_enabled(cls) -> bool:\n"
    assert text.count(old) == 1
    ops.write_text(text.replace(old, "    @if_aiter_supported\n    def is_mha_enabled(cls, layer=None) -> bool:\n"))
    code, out = port(capsys, root, monkeypatch, catalog)
    assert code == 0, out
    assert "# review: is_mha_enabled-gate: placed at vllm/_aiter_ops.py line" in out
    site = next(s for s in yaml.safe_load(out)[0]["sites"] if s["id"] == "is_mha_enabled-gate")
    assert site["replacement"] == ("    @classmethod\n    @if_aiter_attention_supported  # gfx90a-asm-enable\n"
                                   "    def is_mha_enabled(cls, layer=None) -> bool:\n")


@pytest.mark.slow
def test_a_site_whose_helper_was_renamed_upstream_is_placed_and_flagged_for_rewriting(catalog, tmp_path, capsys,
                                                                                       monkeypatch):
    """vLLM 0.34.0 renamed is_aiter_found_and_supported_on_rdna4() to ..._on_rdna() inside vllm-ck-int8-gemm's
    register-ops anchor. Without the variant written for 0.34.0, port places the site there (the renamed name counts
    half) and says its change must be rewritten by hand; a name merely alike elsewhere does not win over it."""
    ck_set = "vllm-ck-int8-gemm"
    without_034 = replace(catalog, sets=tuple(
        patch_set if patch_set.name != ck_set else
        replace(patch_set, variants=tuple(v for v in patch_set.variants if v.id != "0.34"))
        for patch_set in catalog.sets))
    root = tmp_path / "site-packages"
    shutil.copytree(vllm_tree("0.34.0"), root)
    monkeypatch.setattr("cdna2.patches.cli.load_catalog", lambda: without_034)
    code = main(["patch", "port", "--set", ck_set, "--site-packages", str(root)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "# review: register-ops: placed at vllm/_aiter_ops.py line" in out
    assert "the lines its change rewrites differ upstream: rewrite the replacement by hand" in out
    site = next(s for s in yaml.safe_load(out)[0]["sites"] if s["id"] == "register-ops")
    assert "is_aiter_found_and_supported() or is_aiter_found_and_supported_on_rdna()\n" in site["anchor"]
    real = next(site for variant in catalog.by_name(ck_set).variants if variant.id == "0.34"
                for site in variant.sites if site.id == "register-ops")
    assert site["anchor"] == real.anchor

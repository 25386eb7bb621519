"""A host patched before the sliding-window guard existed gets it from the next deploy, and rollback still restores
stock vLLM (issue 29): the planner sees the earlier sites patched and the guard's site pristine, applies the guard
alone, and the transaction keeps the first (pristine) originals. Real vLLM 0.23.0 and 0.33.0 files."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import yaml

from cdna2.host import txn
from cdna2.patches.catalog import DEFAULT_PATCHSET_DIR, load_catalog
from cdna2.patches.cli import apply_in_place, probe
from cdna2.patches.planner import plan_package
from lab import wheelhouse

GUARDED_FILE = "vllm/v1/attention/backends/rocm_aiter_fa.py"


def _catalog_without_guard(directory):
    shutil.copytree(DEFAULT_PATCHSET_DIR, directory)
    path = directory / "vllm-attention-gate.yaml"
    data = yaml.safe_load(path.read_text())
    for variant in data["variants"]:
        variant["sites"] = [site for site in variant["sites"] if site["id"] != "sliding-window-guard"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_catalog(directory)


def _plan(catalog, root):
    version, files, record = probe(root, catalog, "vllm")
    return plan_package(catalog, "vllm", version, files, record, [])


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.23.0", "0.33.0"])
def test_a_host_patched_without_the_guard_gets_it_and_rolls_back_to_stock(tmp_path, version):
    catalog = load_catalog()
    tree = wheelhouse.installed_tree(f"vllm=={version}")
    root = wheelhouse.copy_subset(tree, catalog.target_files("vllm"), tmp_path / "site-packages")
    stock = {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in catalog.target_files("vllm")
             if (root / path).exists()}
    backups = tmp_path / "backups"

    old = _plan(_catalog_without_guard(tmp_path / "old-patchsets"), root)
    assert old.status == "apply"
    assert apply_in_place(root, old, backups)["ok"]
    assert "gfx90a_sliding_window_refusal" not in (root / GUARDED_FILE).read_text()

    upgrade = _plan(catalog, root)
    assert upgrade.status == "apply", upgrade.reasons
    assert [change.path for change in upgrade.changes] == [GUARDED_FILE]
    states = {(site.site, site.state) for site in upgrade.sites if site.set_name == "vllm-attention-gate"}
    assert ("sliding-window-guard", "pristine") in states
    assert all(state == "patched" for site, state in states if site != "sliding-window-guard")
    assert apply_in_place(root, upgrade, backups)["ok"]
    assert "def gfx90a_sliding_window_refusal(" in (root / GUARDED_FILE).read_text()
    assert _plan(catalog, root).status == "patched"

    reverted = txn.revert(backups, root)
    assert reverted["ok"], reverted
    assert {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in stock} == stock


UNIFIED_FILE = "vllm/v1/attention/backends/rocm_aiter_unified_attn.py"


@pytest.mark.slow
def test_a_guard_an_earlier_release_wrote_is_rewritten_and_rolls_back_to_stock(tmp_path):
    """vllm-aiter-triton-ops' sliding-window guard as the release before the smoke record wrote it (its text is the
    site's ``earlier_replacements``): the next plan rewrites that site alone, not "edited outside our patch sites",
    lands on the bytes a fresh deploy writes, and rollback still gives stock vLLM 0.34.0."""
    catalog, optional = load_catalog(), ["vllm-aiter-triton-ops"]
    site = next(site for variant in catalog.by_name("vllm-aiter-triton-ops").variants for site in variant.sites
                if site.earlier_replacements)
    tree = wheelhouse.installed_tree("vllm==0.34.0")
    root = wheelhouse.copy_subset(tree, catalog.target_files("vllm"), tmp_path / "site-packages")
    fresh = wheelhouse.copy_subset(tree, catalog.target_files("vllm"), tmp_path / "fresh")
    stock = {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in catalog.target_files("vllm")
             if (root / path).exists()}
    # The earlier release's data: this catalog with the site's earlier text as its replacement.
    earlier_dir = tmp_path / "earlier-patchsets"
    shutil.copytree(DEFAULT_PATCHSET_DIR, earlier_dir)
    path = earlier_dir / "vllm-aiter-triton-ops.yaml"
    data = yaml.safe_load(path.read_text())
    for variant in data["variants"]:
        for raw in variant["sites"]:
            if raw["id"] == site.id:
                raw["replacement"], raw["marker"] = raw.pop("earlier_replacements")[0], site.marker
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    backups = tmp_path / "backups"
    version, files, record = probe(root, load_catalog(earlier_dir), "vllm")
    earlier = plan_package(load_catalog(earlier_dir), "vllm", version, files, record, optional)
    assert earlier.status == "apply", earlier.reasons
    assert apply_in_place(root, earlier, backups)["ok"]
    assert "gfx90a_sliding_window_unproven" not in (root / UNIFIED_FILE).read_text()

    version, files, record = probe(root, catalog, "vllm")
    upgrade = plan_package(catalog, "vllm", version, files, record, optional)
    assert upgrade.status == "apply", upgrade.reasons
    assert [change.path for change in upgrade.changes] == [UNIFIED_FILE]
    assert f"{UNIFIED_FILE}: site {site.id} of set vllm-aiter-triton-ops holds what an earlier version of this tool " \
           "wrote: rewritten with the current replacement" in upgrade.notes
    assert apply_in_place(root, upgrade, backups)["ok"]
    version, files, record = probe(fresh, catalog, "vllm")
    assert apply_in_place(fresh, plan_package(catalog, "vllm", version, files, record, optional),
                          tmp_path / "fresh-backups")["ok"]
    assert (root / UNIFIED_FILE).read_bytes() == (fresh / UNIFIED_FILE).read_bytes()
    version, files, record = probe(root, catalog, "vllm")
    assert plan_package(catalog, "vllm", version, files, record, optional).status == "patched"

    reverted = txn.revert(backups, root)
    assert reverted["ok"], reverted
    assert {path: hashlib.sha256((root / path).read_bytes()).hexdigest() for path in stock} == stock

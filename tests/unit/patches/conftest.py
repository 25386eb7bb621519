"""Fixtures for the patch engine: subsets of the real PyPI trees, copied so tests may change them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdna2.patches import load_catalog
from lab import wheelhouse

REAL_TREES = {  # package, requirement, installed version
    "vllm-0.23.0": ("vllm", "vllm==0.23.0", "0.23.0"),
    "vllm-0.26.0": ("vllm", "vllm==0.26.0", "0.26.0"),
    "vllm-0.33.0": ("vllm", "vllm==0.33.0", "0.33.0"),
    "aiter-0.1.7.post2.dev18": ("amd-aiter", wheelhouse.AITER, "0.1.7.post2.dev18"),
}


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


def copy_real_subset(catalog, requirement: str, package: str, destination: Path) -> Path:
    """Copy the dist-info and every file the catalog targets from the cached installed tree."""
    return wheelhouse.copy_subset(wheelhouse.installed_tree(requirement), catalog.target_files(package), destination)


@pytest.fixture(params=sorted(REAL_TREES))
def real_tree(request, catalog, tmp_path):
    package, requirement, version = REAL_TREES[request.param]
    root = copy_real_subset(catalog, requirement, package, tmp_path / "site-packages")
    return package, version, root, wheelhouse.installed_tree(requirement)

"""Shared fixtures of the Triton compile proof: the real AITER trees (0.1.7 wheel, git tags) and their proofs,
read from the committed proofs (cdna2/data/triton-proofs/) while they are today's, else computed once per machine
(cached under $CDNA2_CACHE/triton-proofs)."""

from __future__ import annotations

import json

import pytest

from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.proof import COMMITTED, prove
from lab import wheelhouse
from releases import coverage


@pytest.fixture(scope="session")
def aiter_017_tree():
    return wheelhouse.installed_tree(wheelhouse.AITER)


@pytest.fixture(scope="session")
def aiter_git_dir():
    try:
        return coverage.aiter_git()
    except coverage.SourceMissing as error:
        pytest.skip(f"no AITER git history here: {error}")


@pytest.fixture(scope="session")
def proof_017(aiter_017_tree):
    """The whole 0.1.7 tree's proof: committed (test_committed.py fails when it is not today's), else minutes cold."""
    return prove(aiter_017_tree, DEFAULT_TRITON)


def committed_entries(release: str, ops: set[str]) -> dict[str, dict]:
    """The committed proof of ``release`` (cdna2/data/triton-proofs/), its entries of ``ops`` by op: what the
    compiles found, read rather than compiled again (test_committed.py recompiles a sample and keeps them today's)."""
    found = json.loads((COMMITTED / f"{release}.json").read_text())
    return {entry["op"]: entry for entry in found["entries"] if entry["op"] in ops}

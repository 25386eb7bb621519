"""The sliding-window record vllm-aiter-triton-ops' guard reads (cdna2/host/window_proof.py), on a site-packages made
here: written through its transaction with the node, triton and AITER unified-attention digests, rewritten by a later
run, removed (backups and all); what the guard does with it is tests/unit/releases/test_vllm_gates.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cdna2.host import txn, window_proof
from cdna2.host.digests import file_sha256

PASSED = {"name": window_proof.CHECK, "kind": "gpu", "status": "passed", "detail": "matches the reference"}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    for path in ("aiter/__init__.py", "aiter/ops/triton/unified_attention.py",
                 "aiter/ops/triton/_triton_kernels/attention/unified_attention.py", "aiter/ops/triton/rope.py"):
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(f"# {path}\n")
    (site / window_proof.RECORD).parent.mkdir(parents=True)
    return site


def test_the_record_is_written_rewritten_and_removed_through_its_transaction(site: Path, tmp_path: Path) -> None:
    state_dir, record = tmp_path / "state", site / window_proof.RECORD
    assert window_proof.write(site, state_dir, PASSED, "2026-12-07T12:00:00Z")["changed"] == [window_proof.RECORD]
    written = json.loads(record.read_text())
    assert written["status"] == "passed" and written["node"] == os.uname().nodename
    assert written["aiter_files"] == {
        name: file_sha256(site / "aiter" / name) for name in
        ("ops/triton/_triton_kernels/attention/unified_attention.py", "ops/triton/unified_attention.py")}
    window_proof.write(site, state_dir, dict(PASSED, status="wrong", detail="WRONG: ..."), "2026-12-07T13:00:00Z")
    assert json.loads(record.read_text())["status"] == "wrong"
    assert window_proof.remove(site, state_dir)["changed"] == [window_proof.RECORD]
    assert not record.exists() and not (state_dir / "backups" / window_proof.PLAN).exists()
    assert window_proof.remove(site, state_dir)["changed"] == []  # nothing left to remove


def test_a_record_edited_by_hand_is_not_removed_and_another_check_is_not_recorded(site: Path,
                                                                                  tmp_path: Path) -> None:
    state_dir, record = tmp_path / "state", site / window_proof.RECORD
    window_proof.write(site, state_dir, PASSED, "2026-12-07T12:00:00Z")
    record.write_text(record.read_text().replace('"status": "passed"', '"status": "passed" '))
    with pytest.raises(txn.TxnError, match="edited after patching"):
        window_proof.remove(site, state_dir)
    with pytest.raises(window_proof.WindowProofError, match=f"the record is of check {window_proof.CHECK}"):
        window_proof.write(site, state_dir, dict(PASSED, name="triton_rope"), "2026-12-07T12:00:00Z")

"""End-to-end on the simulated lab: with aiter-triton-gfx90a enabled, the controller proves the gfx90a hosts' AITER
Triton tree once for the run (the lab's 0.1.7 wheel: its committed proof, nothing compiled or fetched) and plans the
set's files; a tree no proof covers is fetched from its host and checked against the probe's digest; the vLLM set
that requires the AITER set, enabled alone, fails those hosts in preflight."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdna2.host.state import write_file_atomically
from releases.triton_proofs import TREES
from tests.lab.deploy_runner import lab_hosts, run_pyinfra, site_packages

pytestmark = pytest.mark.lab

AITER_SET, VLLM_SET = "aiter-triton-gfx90a", "vllm-aiter-triton-ops"


def test_the_triton_set_is_proven_once_per_tree_and_the_vllm_set_requires_it(lab: dict, tmp_path: Path) -> None:
    both = run_pyinfra("deploy.py", "--dry", "--data", f'optional_patch_sets=["{AITER_SET}", "{VLLM_SET}"]',
                       report_dir=tmp_path)
    assert both.returncode == 0, both.output[-4000:]
    gfx90a = lab_hosts(lab, "gfx90a")
    for lab_host in gfx90a:
        row = both.row(lab_host["name"])
        assert row["details"]["triton proof"]["source"] == f"committed ({TREES[0][0]}.json)", row["details"]
        assert AITER_SET in row["steps"]["patches amd-aiter"]["detail"] and VLLM_SET in row["steps"]["patches vllm"]["detail"]
    proven = [line for line in both.output.splitlines() if "triton proof: AITER Triton tree" in line]
    assert len(proven) == 1, proven  # the gfx90a hosts share one AITER tree: proven once for the run

    alone = run_pyinfra("deploy.py", "--dry", "--data", f'optional_patch_sets=["{VLLM_SET}"]', report_dir=tmp_path)
    assert sorted(alone.report["failed_hosts"]) == sorted(lab_host["name"] for lab_host in gfx90a)
    for lab_host in gfx90a:
        detail = alone.row(lab_host["name"])["steps"]["preflight"]["detail"]
        assert detail.startswith(f"optional_patch_sets: {VLLM_SET} (vllm) requires {AITER_SET} (amd-aiter), which is "
                                 f"not enabled: add it to this host's optional_patch_sets"), detail


def test_a_tree_no_proof_covers_is_fetched_and_checked_against_its_record(lab: dict, tmp_path: Path) -> None:
    """A RECORD that lists other bytes for one Triton source than the host holds: a tree no proof covers, so the
    controller fetches aiter/ops/triton over the run's connection, finds the files unlike the RECORD and refuses the
    set by name, before compiling anything; the host's staging directory is left as it was."""
    victim = lab_hosts(lab, "gfx90a")[0]
    record = next(site_packages(victim).glob("amd_aiter-*.dist-info/RECORD"))
    pristine = record.read_text()
    row = next(line for line in pristine.splitlines() if line.startswith("aiter/ops/triton/") and ".py," in line)
    path, _, size = row.split(",")
    staging = Path(victim["binds"]["/var/lib/cdna2"]) / "staging"
    before = sorted(staging.iterdir()) if staging.is_dir() else None
    # Replaced, never written in place: the host's venv is hard-linked to the machine's template (and other labs).
    write_file_atomically(record, pristine.replace(row, f"{path},sha256={'A' * 43},{size}").encode())
    try:
        dry = run_pyinfra("deploy.py", "--dry", "--limit", victim["name"], "--data",
                          f'optional_patch_sets=["{AITER_SET}"]', report_dir=tmp_path)
    finally:
        write_file_atomically(record, pristine.encode())
    assert dry.report["failed_hosts"] == [victim["name"]], dry.output[-3000:]
    detail = dry.row(victim["name"])["steps"]["preflight"]["detail"]
    assert detail.startswith(f"{AITER_SET}: the host's AITER Triton tree cannot be proven: the Triton sources fetched "
                             f"for tree "), detail
    assert "differs from what its RECORD lists" in detail and "rollback.py" in detail, detail
    assert (sorted(staging.iterdir()) if staging.is_dir() else None) == before

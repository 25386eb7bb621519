"""End-to-end on the simulated lab: with aiter-triton-gfx90a enabled, the controller proves the gfx90a hosts' AITER
Triton tree once for the run (the lab's 0.1.7 wheel: its committed proof, nothing compiled or fetched) and plans the
set's files; the vLLM set that requires it, enabled alone, fails those hosts in preflight."""

from __future__ import annotations

from pathlib import Path

import pytest

from releases.triton_proofs import TREES
from tests.lab.deploy_runner import lab_hosts, run_pyinfra

pytestmark = pytest.mark.lab

AITER_SET, VLLM_SET = "aiter-triton-gfx90a", "vllm-aiter-triton-gemm"


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

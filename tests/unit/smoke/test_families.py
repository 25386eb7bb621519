"""Kernel families on a host (cdna2/host/families.py): the verdicts from GPU check results, and withholding a family
from a provisioned fixture host's hsa/gfx90a in one swap, as the deploy runs it (the agent's command line).

Nothing here stands in for a GPU: the check results are the smoke test's result dicts; the GPU runs themselves are
tests/unit/smoke/test_gpu_doubles.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cdna2.families import host_families
from cdna2.host import digests, kernels, smoke_static, state
from cdna2.host.families import (PROVEN, UNPROVEN, WITHHELD, family_of, installed_families, judge, verdict_line,
                                 withhold_on_host)
from cdna2.plan import installed_kernel_digest
from cdna2.reports.run import RunReport
from operations.smoke import report_families
from tests.unit.smoke.conftest import Host

FAMILIES = host_families()
PA_CHECK = "pa_fwd_asm_bf16_block16_gqa8"
FMHA_CHECKS = next(family["checks"] for family in FAMILIES if family["name"] == "fmha_v3_fwd")


def check(name: str, status: str = "passed") -> dict:
    return {"name": name, "kind": "gpu", "status": status, "detail": f"{name} {status}"}


def test_every_code_object_belongs_to_one_family_and_an_unlisted_one_is_named() -> None:
    assert family_of("fmha_v3_fwd/MI300/fwd_hd128_bf16.co", FAMILIES) == "fmha_v3_fwd"
    assert family_of("layer_norm_qnt.co", FAMILIES) == "layer_norm"
    assert family_of("fmoe_f16.co", FAMILIES) == "fmoe_g1u0"
    assert family_of("fmoe/silu/fmoe_fp16_noquantFp16_g1u0_atm_inlv_silu_1tg_32x512.co", FAMILIES) == "fmoe"
    assert family_of("i8gemm/i8gemm_x.co", FAMILIES) == "unlisted:i8gemm"


def test_verdicts_where_the_gpu_checks_ran(host: Host) -> None:
    installed = installed_families(host.tree, FAMILIES)
    assert sorted(installed) == ["all_reduce", "fmha_v3_fwd", "pa"], installed
    checks = [check(name) for name in FMHA_CHECKS] + [check(PA_CHECK, "wrong")]
    verdicts = judge(installed, checks, FAMILIES, [], None, {})
    assert verdicts["fmha_v3_fwd"]["verdict"] == PROVEN and verdicts["fmha_v3_fwd"]["kernels"] == 1
    assert verdicts["pa"]["verdict"] == WITHHELD and verdicts["pa"]["reason"].startswith(f"{PA_CHECK} wrong")
    assert verdicts["all_reduce"]["verdict"] == WITHHELD
    assert verdicts["all_reduce"]["reason"].startswith("no GPU check proves it (a case needs two or more GPUs")
    assert verdict_line(verdicts) == "families: 1 proven (fmha_v3_fwd); 2 withheld (all_reduce, pa)"


def test_host_data_keeps_a_family_without_a_check_but_never_one_whose_check_failed(host: Host) -> None:
    installed = installed_families(host.tree, FAMILIES)
    checks = [check(name) for name in FMHA_CHECKS] + [check(PA_CHECK, "failed")]
    verdicts = judge(installed, checks, FAMILIES, ["all_reduce", "pa"], None, {})
    assert verdicts["all_reduce"]["verdict"] == UNPROVEN
    assert verdicts["all_reduce"]["reason"].endswith("kept by host data smoke_keep_unproven_families")
    assert verdicts["pa"]["verdict"] == WITHHELD
    # The run report names the kept family from the verdict's flag, not from its wording.
    report = RunReport("deploy", "inventory/sim.py")
    report_families(report, "mi210-a", verdicts)
    assert report.host("mi210-a").notes == [
        "kernel families kept without proof (smoke_keep_unproven_families): all_reduce"]
    report_families(report, "mi210-b", judge(installed, checks, FAMILIES, [], "no GPU", {}))
    assert report.host("mi210-b").notes == []  # unproven because nothing ran, not kept


def test_without_gpu_checks_every_family_is_unproven_with_the_reason(host: Host) -> None:
    installed = installed_families(host.tree, FAMILIES)
    verdicts = judge(installed, [], FAMILIES, [], "GPU checks are off for this host (smoke_gpu_checks)", {})
    assert {entry["verdict"] for entry in verdicts.values()} == {UNPROVEN} and len(verdicts) == 3
    assert all(entry["reason"] == "GPU checks did not run: GPU checks are off for this host (smoke_gpu_checks)"
               for entry in verdicts.values())


def test_no_installed_family_is_no_verdict() -> None:
    assert verdict_line({}) == "families: none installed, nothing proven"


def run_withhold(host: Host, reasons: dict[str, str]) -> dict:
    """The agent's command, as the deploy's smoke operation issues it."""
    result = subprocess.run(
        [sys.executable, "-m", "cdna2.host.families", "withhold", "--site-packages", str(host.site),
         "--hsa-root", str(host.tree.parent), "--state-dir", str(host.state_dir), "--families", json.dumps(FAMILIES),
         "--reasons", json.dumps(reasons)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def tree_files(tree: Path) -> dict[str, str]:
    return {relative: digests.file_sha256(path) for relative, path in digests.regular_files(tree)}


def test_withholding_one_family_removes_its_kernels_and_rows_alone_in_one_swap(host: Host) -> None:
    before = tree_files(host.tree)
    installed_digest = state.read_state(host.state_dir)["kernels"]["digest"]
    (host.site / "aiter/jit/build/module_attention_asm").mkdir(parents=True)  # built from the pa table
    (host.site / "aiter/jit/optCompilerConfig.json").write_text(json.dumps(
        {"module_attention_asm": {"blob_gen_cmd": "f'{get_asm_dir()}/pa/codegen.py --output_dir {{}}'"}}))
    result = run_withhold(host, {"pa": "pa_fwd_asm_bf16_block16_gqa8 wrong"})
    assert result["result"] == "withheld" and result["withheld"] == ["pa"], result
    assert result["kernels_removed"] == 1 and result["manifest_rows_dropped"] == 1
    after = tree_files(host.tree)
    assert "pa/pa_bf16_noquant_gqa8_1tg_4w.co" not in after
    assert (host.tree / "pa/pa_asm.csv").read_text() == "qType,kvType,Gqa,Mtp,Msk,Hp,blkSz,knl_name,knl_file\n"
    unchanged = {path: digest for path, digest in before.items() if not path.startswith("pa/")}
    assert {path: after[path] for path in unchanged} == unchanged, "the other families are untouched"
    assert not (host.site / "aiter/jit/build/module_attention_asm").exists(), "the module with the pa table is gone"
    assert not list(host.tree.parent.glob(".gfx90a.*")), "no staging left beside the tree"
    record = state.read_state(host.state_dir)["kernels"]
    assert record["installed_digest"] == installed_digest and record["digest"] == digests.tree_digest(host.tree)
    assert record["withheld"]["pa"]["reason"] == "pa_fwd_asm_bf16_block16_gqa8 wrong"
    # The smoke test's static checks hold the reduced tree for the one installed: recorded digest, no dangling row.
    for static in (smoke_static.check_gfx90a_tree, smoke_static.check_manifests):
        assert host.run(static)["status"] == "passed", host.run(static)
    # The deploy compares the translation with the tree as installed, so a re-run uploads nothing ...
    probe = {"aiter": {"gfx90a_digest": record["digest"]}, "state": {"kernels": record}}
    assert installed_kernel_digest(probe) == installed_digest
    # ... unless host data now keeps a withheld family: then the whole tree is installed again and judged anew.
    assert installed_kernel_digest(probe, ["pa"]) == record["digest"]
    # A second withholding with the same verdicts changes nothing.
    assert run_withhold(host, {"pa": "pa_fwd_asm_bf16_block16_gqa8 wrong"}) == {"result": "unchanged",
                                                                                 "withheld": []}
    assert tree_files(host.tree) == after
    # Rollback's kernel step takes the tree away and its record with it: AITER's stock tree is what remains.
    kernels.remove(host.tree.parent, host.state_dir)
    assert not host.tree.exists() and "kernels" not in state.read_state(host.state_dir)


def test_withholding_a_family_that_is_not_installed_changes_nothing(host: Host) -> None:
    before = tree_files(host.tree)
    assert withhold_on_host(host.site, host.tree.parent, host.state_dir, FAMILIES,
                            {"mla": "no GPU check"}) == {"result": "unchanged", "withheld": []}
    assert tree_files(host.tree) == before

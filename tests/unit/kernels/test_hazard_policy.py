"""kernel_hazard_policy: validated host data, applied by the translation, recorded, and checked by verify."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from cdna2.drift import find_drift
from cdna2.host import elf
from cdna2.hostdata import problems_for, schema
from cdna2.kernels import Policy, TranslationError, edits, engine, hazard_rules, isa, translate_tree, workers
from cdna2.plan import deployed_record
from cdna2.translated import TranslatedTree
from tests.unit.kernels.conftest import BF16_MFMA

ROOT = Path(__file__).resolve().parents[3]
READ_RESULT = "v_add_f32_e32 v8, v1, v9"  # VALU read of the MFMA's result (BF16_MFMA writes a[0:3]: use the AGPR)
READ_ACC = "v_accvgpr_read_b32 v8, a1"
MANIFEST = ("knl_name,knl_file\n_ZN5aiter5cleanE,clean.co\n_ZN5aiter6branchE,branch.co\n"
            "_ZN5aiter8straightE,straight.co\n")


@pytest.fixture
def verdict_tree(tmp_path, build_code_object) -> Path:
    """Three portable kernels: clean, short only across a branch, short in straight-line code (on gfx90a)."""
    src = tmp_path / "gfx942"
    build_code_object(src / "fam" / "clean.co", BF16_MFMA, "s_nop 7", "s_nop 2", READ_ACC)
    # the branch skips 9 wait states: 1 on the taken path (short), 11 on the fall-through
    build_code_object(src / "fam" / "branch.co", BF16_MFMA, "s_cbranch_scc1 2", "s_nop 7", "s_nop 0", READ_ACC)
    build_code_object(src / "fam" / "straight.co", BF16_MFMA, "s_nop 6", READ_ACC)  # 7 wait states: gfx942's rule
    (src / "fam" / "kernels.csv").write_text(MANIFEST)
    return src


@pytest.mark.parametrize("policy, written, withheld", [
    ("default", ["branch.co", "clean.co"], ["straight.co"]),
    ("strict", ["clean.co"], ["branch.co", "straight.co"]),
    ("permissive", ["branch.co", "clean.co", "straight.co"], []),
])
def test_translation_installs_what_the_policy_admits(verdict_tree, tmp_path, policy, written, withheld):
    dst = tmp_path / "out"
    report = translate_tree(verdict_tree, dst, jobs=1, policy=Policy(hazards=policy, pad_mfma_hazards=False))
    verdicts = {Path(r).name: e["hazards"]["verdict"] for r, e in report["kernels"].items()}
    assert verdicts == {"clean.co": "clean", "branch.co": "short-across-branches",
                        "straight.co": "short-straight-line"}
    assert sorted(p.name for p in dst.rglob("*.co")) == written
    assert [Path(r).name for r in report["hazards"]["withheld"]] == withheld
    rows = (dst / "fam" / "kernels.csv").read_text()
    assert all((name in rows) == (name in written) for name in verdicts), "manifest rows of withheld kernels pruned"
    assert report["hazards"]["policy"] == policy
    for name in withheld:
        reason = report["kernels"][f"fam/{name}"]["reason"]
        assert f"kernel_hazard_policy {policy} does not install it" in reason
    straight = report["kernels"]["fam/straight.co"]["hazards"]["worst"]
    assert (straight["present"], straight["needed"], straight["gfx942_needed"], straight["short_on_gfx942"]) == (
        7, 11, 7, False)
    assert ("Measured on this tree: of 3 portable kernels, 1 are short of gfx90a's MFMA wait states in straight-line "
            "code (by up to 4; 0 of their 1 short straight-line edges pass an s_waitcnt or s_barrier), 1 only on "
            "paths across a branch (by up to 10), 0 could not be audited, 1 are clean.") in report["limitations"]
    says_permissive = any("kernel_hazard_policy permissive" in text for text in report["limitations"])
    assert says_permissive == (policy == "permissive")


def test_unknown_policy_is_refused_before_anything_is_written(verdict_tree, tmp_path):
    with pytest.raises(TranslationError, match="unknown kernel hazard policy 'lenient': use one of default, strict"):
        translate_tree(verdict_tree, tmp_path / "out", policy=Policy(hazards="lenient"))
    assert not (tmp_path / "out").exists()


def test_policy_is_validated_host_data_with_a_documented_default():
    assert schema()["properties"]["kernel_hazard_policy"]["enum"] == list(hazard_rules.POLICIES)
    defaults = runpy.run_path(str(ROOT / "group_data/all.py"))
    assert defaults["kernel_hazard_policy"] == hazard_rules.DEFAULT_POLICY
    assert "`kernel_hazard_policy`" in (ROOT / "docs" / "inventories.md").read_text()
    assert problems_for("mi210-a", {"kernel_hazard_policy": "strict"}) == []
    (problem,) = problems_for("mi210-a", {"kernel_hazard_policy": "lenient"})
    assert "host mi210-a: data key `kernel_hazard_policy`" in str(problem)


def provisioned_probe(deployed: dict) -> dict:
    return {"state": {"deployed": deployed}, "distributions": {}, "aiter": {"gfx90a_digest": deployed["kernels"]},
            "backups": {}, "patch_targets": {}, "record_check": {}}


def test_verify_flags_a_tree_made_under_another_policy_or_audit_version():
    made = Policy().record()
    assert made == {"policy": "default", "audit_version": hazard_rules.AUDIT_VERSION, "pad_mfma_hazards": True,
                    "int8_k32_split": False}
    deployed = deployed_record({"distributions": {}}, [], "d" * 64, {}, made)
    assert deployed["kernel_hazards"] == made
    assert find_drift(provisioned_probe(deployed), {}, made) == []
    (drift,) = find_drift(provisioned_probe(deployed), {}, Policy(hazards="strict").record())
    assert drift == ("kernel_hazard_policy: recorded default, host data strict: run the deploy to install the tree "
                     "these give")
    (drift,) = find_drift(provisioned_probe(deployed), {}, Policy().record(audit_version="0"))
    assert drift == (f"MFMA wait-state audit version: recorded {hazard_rules.AUDIT_VERSION}, this tool 0: run the "
                     "deploy to install the tree these give")
    older = deployed_record({"distributions": {}}, [], "d" * 64, {})
    (drift,) = find_drift(provisioned_probe(older), {}, made)
    assert drift.startswith("kernels made under a deploy without the MFMA wait-state audit")


def test_verify_names_padding_and_the_split_when_the_host_data_changed_since_the_deploy():
    padded = deployed_record({"distributions": {}}, [], "d" * 64, {}, Policy().record())
    (drift,) = find_drift(provisioned_probe(padded), {}, Policy(pad_mfma_hazards=False).record())
    assert drift == "pad_mfma_hazards: recorded on, host data off: run the deploy to install the tree these give"
    (drift,) = find_drift(provisioned_probe(padded), {}, Policy(int8_k32_split=True).record())
    assert drift == "int8_k32_split: recorded off, host data on: run the deploy to install the tree these give"
    split = deployed_record({"distributions": {}}, [], "d" * 64, {},
                            Policy(hazards="strict", pad_mfma_hazards=False, int8_k32_split=True).record())
    assert find_drift(provisioned_probe(split), {}, Policy().record()) == [
        "kernel_hazard_policy: recorded strict, host data default: run the deploy to install the tree these give",
        "pad_mfma_hazards: recorded off, host data on: run the deploy to install the tree these give",
        "int8_k32_split: recorded on, host data off: run the deploy to install the tree these give"]


def test_a_record_written_before_padding_and_the_split_were_recorded_reads_as_their_defaults():
    # What deploys wrote before the record held the whole policy: they ran with padding on and the split off.
    before = deployed_record({"distributions": {}}, [], "d" * 64, {},
                             {"policy": "default", "audit_version": hazard_rules.AUDIT_VERSION})
    assert find_drift(provisioned_probe(before), {}, Policy().record()) == []
    assert find_drift(provisioned_probe(before), {}, Policy(pad_mfma_hazards=False).record()) == [
        "pad_mfma_hazards: recorded on, host data off: run the deploy to install the tree these give"]
    assert find_drift(provisioned_probe(before), {}, Policy(int8_k32_split=True).record()) == [
        "int8_k32_split: recorded off, host data on: run the deploy to install the tree these give"]


def test_the_policy_deploy_and_verify_read_is_the_host_datas():
    class HostData:
        kernel_hazard_policy, pad_mfma_hazards, int8_k32_split = "strict", False, True
    assert Policy.of_host_data(HostData()) == Policy(hazards="strict", pad_mfma_hazards=False, int8_k32_split=True)


def test_deploy_report_text_names_the_verdicts_and_the_policy(tmp_path):
    # The 0.1.7.post2.dev18 tree under the defaults: the 70 short kernels padded, so every one audits clean.
    tree = TranslatedTree(source_digest="s", digest="d", archive=tmp_path / "a.tar.gz", archive_sha256="x",
                          kernels=178, tree_bytes=1, adaptations=(), invalidates=(), hazard_policy="default",
                          hazard_audit_version="1", withheld=0, code_changes={"in place": 108, "padded": 70},
                          hazard_verdicts={"clean": 178, "short-across-branches": 0, "short-straight-line": 0,
                                           "unaudited": 0})
    assert tree.hazard_summary() == ("kernel_hazard_policy default (MFMA wait-state audit 1): 178 clean, "
                                     "0 short-across-branches, 0 short-straight-line, 0 unaudited; 0 withheld; "
                                     "written 108 in place, 70 padded")


@pytest.mark.parametrize("policy", ["default", "strict"])
def test_padding_makes_every_short_kernel_clean_so_every_policy_installs_it(verdict_tree, tmp_path, policy):
    dst = tmp_path / "out"
    report = translate_tree(verdict_tree, dst, jobs=1, policy=Policy(hazards=policy))
    assert sorted(p.name for p in dst.rglob("*.co")) == ["branch.co", "clean.co", "straight.co"]
    entries = {Path(r).name: e for r, e in report["kernels"].items()}
    assert entries["clean.co"]["code"] == "in place"
    # straight.co: 7 of 11 wait states, 4 more before the read; branch.co: 1 of 11 on the taken path, 10 more
    # before the read, which the fall-through path (11 already) runs too.
    assert (entries["straight.co"]["code"], entries["straight.co"]["nops"]) == ("padded", 1)
    assert (entries["branch.co"]["code"], entries["branch.co"]["nops"]) == ("padded", 2)
    for name in ("straight.co", "branch.co"):
        assert entries[name]["hazards"]["verdict"] == "clean", "the written file, audited again"
        assert entries[name]["hazards_before_edits"]["verdict"] != "clean"
    assert report["hazards"]["withheld"] == [] and report["padding"] == {"enabled": True, "kernels": 2, "nops": 3}


def test_padding_started_from_the_engines_audit_plans_what_auditing_the_kernel_again_plans(verdict_tree, llvm_tools):
    kernels = ["fam/branch.co", "fam/clean.co", "fam/straight.co"]
    with workers.pool(1) as pool:
        analysis = engine._analyse(verdict_tree, kernels, llvm_tools, 1, pool, lambda message: None)
    assert set(analysis.shortfalls) == {"fam/branch.co", "fam/straight.co"}, "only short kernels have shortfalls"
    for relpath in analysis.shortfalls:
        data = (verdict_tree / relpath).read_bytes()
        chunks = isa.split_instructions(elf.text_of(data, elf.read_code_object(data)))
        expected, halves = analysis.moves_for([relpath])
        audited, started = (edits._Kernel(chunks, expected, halves) for _ in range(2))
        assert audited.pad_short_edges().short_edges == []
        assert started.pad_short_edges(analysis.shortfalls[relpath]).short_edges == []
        assert started.wait_states == audited.wait_states != {}

"""cdna2/data/kernel-families.yaml: valid, consistent with the smoke test's GPU checks, and complete for the trees
the translation installs on amd-aiter 0.1.7.post2.dev18, v0.1.19 and v0.1.20.post1."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdna2.cache import cache_root
from cdna2.families import NOT_READ, family_rows, keep_refusal, load_families, reach
from cdna2.host import smoke
from cdna2.kernels import translate_tree
from tests.unit.kernels.conftest import aiter_git_tree

FAMILIES = load_families()["families"]
READ = list(load_families()["releases"])


def test_every_check_a_family_names_is_a_gpu_check_and_every_proving_check_proves_one_family() -> None:
    named = [check for family in FAMILIES for check in family["checks"]]
    assert named, "the table names GPU checks"
    assert len(named) == len(set(named)), "a check proves one family"
    gpu_checks = {check.name: check for check in smoke.GPU_CHECKS}
    assert set(named) <= set(gpu_checks), sorted(set(named) - set(gpu_checks))
    proving = {name for name, check in gpu_checks.items() if check.proof is not None}
    assert proving == set(named), f"GPU checks with a load-line proof but no family: {sorted(proving - set(named))}"


def test_a_family_without_a_check_says_why() -> None:
    without = [family for family in FAMILIES if not family["checks"]]
    assert without and all(family["no_check"] for family in without)


def test_host_data_may_keep_only_families_that_exist() -> None:
    assert keep_refusal(["all_reduce", "fmha_v3_bwd"]) is None
    refusal = keep_refusal(["allreduce"])
    assert refusal.startswith("smoke_keep_unproven_families names allreduce, no kernel family of "
                              "cdna2/data/kernel-families.yaml (they are: fmha_v3_fwd, fmha_v3_bwd, pa,")


def test_reach_of_a_release_nobody_read_is_not_read() -> None:
    assert reach("pa", "0.1.18")["path"] == NOT_READ
    assert reach("no_such_family", READ[0]) == {"path": NOT_READ, "api": "unknown",
                                                 "evidence": "not in kernel-families.yaml"}
    assert reach("pa", "0.1.7.post2.dev18")["api"] == "aiter.pa_fwd_asm"


@pytest.fixture(scope="module", params=["0.1.7.post2.dev18", "0.1.19", "0.1.20.post1"])
def installed(request, real_source) -> tuple[str, list[str]]:
    """(release, the code objects the deploy's default policy installs from its gfx942 tree), translated once into
    the cache (about a minute per tree cold on 2 cores)."""
    source = real_source if request.param == READ[0] else aiter_git_tree(f"v{request.param}")
    work = cache_root() / "family-trees" / request.param
    report = translate_tree(source, work / "gfx90a", cache_dir=cache_root() / "family-trees" / "engine")
    return request.param, [relpath for relpath, entry in report["kernels"].items() if entry["status"] == "written"]


@pytest.mark.slow
def test_every_installed_family_has_its_reach_and_a_check_or_why_none(installed) -> None:
    release, kernels = installed
    rows = family_rows(kernels)
    assert kernels and rows, f"{release}: the translation installs kernels"
    for row in rows:
        assert not row["family"].startswith("unlisted:"), f"{release}: {row} is in no family"
        assert row["reach"][release]["path"] != NOT_READ, f"{release}: reach of {row['family']} not read"
        assert row["checks"] or row["no_check"], row
    assert sum(row["kernels"] for row in rows) == len(kernels)

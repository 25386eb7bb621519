"""Which releases qualification takes: vLLM from the package index (its answer kept a day), AITER from its tags, the
floors and the releases refused by name from cdna2/data/releases.yaml; and the test that fails when the index serves
a vLLM newer than the newest qualified one."""

from __future__ import annotations

import json
import os
import time
import warnings

import pytest
from packaging.version import Version

from cdna2.patches.catalog import PatchDataError
from cdna2.patches.releases import Releases, load_releases, refused_release
from lab import wheelhouse
from releases import coverage, discovery

QUALIFY = ("run python -m releases coverage, then qualify it: docs/release-qualification.md (draft the sets whose text "
           "moved with python -m cdna2 patch port, review, add the version to the variants, or refuse it by name in "
           "cdna2/data/releases.yaml)")


def newer_than_qualified(catalog, answer: wheelhouse.IndexAnswer) -> list[str]:
    newest = Version(discovery.newest_qualified(catalog, "vllm"))
    return [version for version in answer.versions
            if not Version(version).is_prerelease and Version(version) > newest]


def test_the_index_has_no_vllm_newer_than_the_newest_qualified(catalog):
    """Asks the index at most once a day (the machine cache keeps its answer); offline, says so and passes."""
    newest = discovery.newest_qualified(catalog, "vllm")
    try:
        answer = wheelhouse.available_versions("vllm")
    except wheelhouse.IndexUnavailable as error:
        warnings.warn(f"could not look for a vLLM newer than {newest}, the newest qualified: {error}")
        return
    if answer.error:
        warnings.warn(f"could not ask the package index now ({answer.error}); its answer of "
                      f"{time.ctime(answer.asked)} is used")
    newer = newer_than_qualified(catalog, answer)
    assert not newer, (f"the package index serves vLLM {', '.join(newer)}, newer than {newest}, the newest release "
                       f"every vLLM patch set names: {QUALIFY}")


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """pip with no configuration file and an index on a loopback port nothing listens on; an empty machine cache."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("CDNA2_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_offline_the_index_cannot_be_asked_and_the_releases_the_sets_name_are_listed(catalog, offline):
    with pytest.raises(wheelhouse.IndexUnavailable, match="pip index versions vllm: "):
        wheelhouse.available_versions("vllm")
    found = discovery.vllm_releases(catalog)
    assert found.offline and found.source.startswith("the package index could not be asked")
    assert found.releases == sorted(discovery.named_versions(catalog, "vllm"), key=Version)
    assert found.releases[0] == "0.23.0"


def test_offline_with_a_kept_answer_that_answer_is_used_and_the_error_said(catalog, offline):
    kept = offline / "index" / "vllm.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"asked": time.time() - 3 * 86400, "versions": ["9.0.0", "0.23.0", "0.22.0"]}))
    answer = wheelhouse.available_versions("vllm")
    assert answer.versions == ["9.0.0", "0.23.0", "0.22.0"] and "No matching distribution" in answer.error
    assert newer_than_qualified(catalog, answer) == ["9.0.0"]  # the newest-release test would fail on it
    found = discovery.vllm_releases(catalog)
    assert found.releases == ["0.23.0", "9.0.0"] and "3 days ago (could not ask it now: " in found.source


def test_the_index_answer_is_kept_for_a_day(monkeypatch, tmp_path):
    monkeypatch.setenv("CDNA2_CACHE", str(tmp_path))
    try:
        first = wheelhouse.available_versions("vllm")
    except wheelhouse.IndexUnavailable as error:
        pytest.skip(f"the package index cannot be asked here: {error}")
    assert "0.23.0" in first.versions and first.error is None
    assert wheelhouse.available_versions("vllm") == first  # kept: not asked again
    kept = json.loads((tmp_path / "index" / "vllm.json").read_text())
    assert kept == {"asked": first.asked, "versions": first.versions}
    again = wheelhouse.available_versions("vllm", max_age=0)  # older than allowed: asked again
    assert again.asked > first.asked and again.versions[:len(first.versions)] == first.versions[:len(again.versions)]


def test_the_floors_and_the_releases_refused_by_name_are_data(tmp_path, catalog):
    data = tmp_path / "releases.yaml"
    data.write_text("schema: releases-1.0.json\nfloors: {vllm: 0.23.0, amd-aiter: 0.1.16}\nrefused:\n"
                    "- {package: vllm, version: 0.25.1, reason: its wheel was yanked}\n")
    releases = load_releases(data)
    assert releases.refusal("vllm", "0.25.1") == \
        "vllm 0.25.1 is refused by name (releases.yaml): its wheel was yanked"
    assert releases.refusal("vllm", "0.25.0") is None
    assert refused_release(releases, {"vllm": {"version": "0.25.1"}, "amd-aiter": None}) == \
        "vllm 0.25.1 is refused by name (releases.yaml): its wheel was yanked; install a release that is not refused"
    assert refused_release(releases, {"vllm": {"version": "0.26.0"}}) is None
    row = coverage.refused_result(catalog, "vllm", "0.25.1", releases.refusal("vllm", "0.25.1"))
    assert row.status == "refused" and set(row.cells) == {s.name for s in catalog.sets_for("vllm")}
    assert coverage.failures([row], catalog) == []
    table = coverage.table([row], catalog)
    assert "  0.25.1   refused  refused" in table and "0.25.1 vllm-attention-gate: vllm 0.25.1 is refused by name" \
        in table.replace("\n    ", " ")


@pytest.mark.parametrize("text, fault", [
    ("schema: releases-1.0.json\nfloors: {vllm: latest, amd-aiter: 0.1.16}\nrefused: []\n",
     "$.floors.vllm: 'latest' does not match"),
    ("schema: releases-1.0.json\nfloors: {vllm: 0.23.0}\nrefused: []\n",
     "$.floors: 'amd-aiter' is a required property"),
    ("schema: releases-1.0.json\nfloors: {vllm: 0.23.0, amd-aiter: 0.1.16}\n", "$: 'refused' is a required property"),
    ("schema: releases-1.0.json\nfloors: {vllm: 0.23.0, amd-aiter: 0.1.16}\nrefused:\n"
     "- {package: vllm, version: 0.24.0, reason: a}\n"
     "- {package: vllm, version: 0.24.0, reason: b}\n", "vllm 0.24.0 is refused twice"),
])
def test_invalid_release_data_names_the_file_and_the_fault(tmp_path, text, fault):
    data = tmp_path / "releases.yaml"
    data.write_text(text)
    with pytest.raises(PatchDataError) as raised:
        load_releases(data)
    assert str(raised.value).startswith(f"{data}: ") and fault in str(raised.value)


def test_aiter_releases_are_the_tags_from_the_floor_then_main():
    try:
        git_dir = coverage.aiter_git()
    except coverage.SourceMissing as error:
        pytest.skip(str(error))
    found = discovery.aiter_releases(git_dir, Releases(floors={"amd-aiter": "0.1.19", "vllm": "0.23.0"}))
    assert found.releases[:4] == ["v0.1.19", "v0.1.19.post1", "v0.1.19.post2", "v0.1.20"]
    assert found.releases[-1] == "main"
    assert not any(release.startswith("v0.1.18") for release in found.releases)

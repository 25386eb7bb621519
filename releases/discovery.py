"""Which releases release qualification takes: discovered, never listed.

- vLLM: every release the package index serves from the floor on (``pip index versions``, through the machine's pip
  configuration; the answer is kept in the machine cache for a day, lab.wheelhouse.available_versions).
- AITER: every tag vX.Y.Z[.postN] of its git history from the floor on, then main.
- The floors and the releases refused by name are data: cdna2/data/releases.yaml (cdna2.patches.releases).

A release is *qualified* when every patch set of its package names it in a variant's ``versions`` (the variant was
written or reviewed for it, or says why the set declines it there); any other discovered release is *new* since the
last qualification, and ``python -m releases coverage`` shows what each set does on it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from cdna2.patches.catalog import Catalog
from cdna2.patches.releases import Releases, load_releases
from lab import wheelhouse
from lab.aiter_git import git

AITER_TAG = re.compile(r"^v(\d+\.\d+\.\d+(?:\.post\d+)?)$")
MAIN = "main"


@dataclass
class Discovered:
    """The releases of one package to qualify, oldest first, and where the list came from."""

    package: str
    releases: list[str]
    source: str  # one line: the index and when it was asked, the git history, or why the index could not be asked
    refused: dict[str, str] = field(default_factory=dict)  # release -> why, for those the data refuses by name
    offline: str | None = None  # why the index could not be asked now, when it could not


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def named_versions(catalog: Catalog, package: str) -> set[str]:
    """Versions some variant of every set of ``package`` names: the releases qualified with every set."""
    named = [{version for variant in patch_set.variants for version in variant.versions}
             for patch_set in catalog.sets_for(package)]
    return set.intersection(*named) if named else set()


def newest_qualified(catalog: Catalog, package: str) -> str | None:
    versions = [(_version(name), name) for name in named_versions(catalog, package)]
    return max((version, name) for version, name in versions if version is not None)[1] if versions else None


def _from_floor(versions, floor: str) -> list[str]:
    kept = [(version, name) for name in versions for version in [_version(name)]
            if version is not None and not version.is_prerelease and version >= Version(floor)]
    return [name for _, name in sorted(kept)]


def _age(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f} h ago" if hours < 48 else f"{hours / 24:.0f} days ago"


def vllm_releases(catalog: Catalog, releases: Releases | None = None) -> Discovered:
    """Every vLLM release from the floor to the newest the index serves. Without the index: the last answer kept,
    else the releases the patch sets name, saying so."""
    releases = releases or load_releases()
    floor = releases.floors["vllm"]
    try:
        answer = wheelhouse.available_versions("vllm")
    except wheelhouse.IndexUnavailable as error:
        named = _from_floor(named_versions(catalog, "vllm"), floor)
        found = Discovered("vllm", named, f"the package index could not be asked ({error}): the releases the patch "
                                          f"sets name", offline=str(error))
    else:
        source = f"the package index, asked {_age(time.time() - answer.asked)}"
        if answer.error:
            source += f" (could not ask it now: {answer.error})"
        found = Discovered("vllm", _from_floor(answer.versions, floor), source, offline=answer.error)
    found.refused = {name: reason for name in found.releases
                     for reason in [releases.refusal("vllm", name)] if reason}
    return found


def aiter_releases(git_dir: Path, releases: Releases | None = None) -> Discovered:
    """Every AITER tag from the floor on, in version order, then main."""
    releases = releases or load_releases()
    tags = {}
    for tag in git(git_dir, "tag").decode().split():
        found = AITER_TAG.match(tag)
        if found:
            tags[found.group(1)] = tag
    ordered = [tags[version] for version in _from_floor(tags, releases.floors["amd-aiter"])] + [MAIN]
    found = Discovered("amd-aiter", ordered, f"the tags of {git_dir} and its {MAIN}")
    found.refused = {tag: reason for tag in ordered
                     for reason in [releases.refusal("amd-aiter", tag.removeprefix("v"))] if reason}
    return found


def qualification_status(catalog: Catalog, package: str, release: str, version: str,
                         refused: dict[str, str]) -> str:
    """"refused" (by name in the data), "qualified" (every set names the version), "main" (AITER's head, judged on
    every run) or "new" (not yet qualified: this run's cells are the verdict)."""
    if release in refused:
        return "refused"
    if release == MAIN:
        return MAIN
    return "qualified" if version in named_versions(catalog, package) else "new"

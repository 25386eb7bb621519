"""The releases of the patched packages: where qualification starts, and releases refused by name.

Data (cdna2/data/releases.yaml, validated against cdna2/schemas/releases-1.0.json), said once: release qualification
(``python -m releases``) discovers every release from each package's floor on, and the deploy refuses a host holding
a release this data refuses, in its preflight, before anything on the host changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cdna2.patches.catalog import PatchDataError
from cdna2.schema import first_violation, load_yaml

PACKAGE_DIR = Path(__file__).resolve().parent.parent
RELEASES_PATH = PACKAGE_DIR / "data" / "releases.yaml"
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "releases-1.0.json"


@dataclass(frozen=True)
class Releases:
    floors: dict[str, str]
    refused: dict[tuple[str, str], str] = field(default_factory=dict)  # (package, version) -> why

    def refusal(self, package: str, version: str) -> str | None:
        reason = self.refused.get((package, version))
        return None if reason is None else f"{package} {version} is refused by name ({RELEASES_PATH.name}): {reason}"


def load_releases(path: Path = RELEASES_PATH) -> Releases:
    """Load and validate the release data; PatchDataError names the file and the JSON path of the first fault."""
    try:
        document = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PatchDataError(f"{path}: cannot read the release data: {error}") from error
    violation = first_violation(document, json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    if violation:
        raise PatchDataError(f"{path}: {violation} (schema {SCHEMA_PATH.name})")
    refused = {}
    for entry in document["refused"]:
        key = (entry["package"], entry["version"])
        if key in refused:
            raise PatchDataError(f"{path}: {entry['package']} {entry['version']} is refused twice: say it once")
        refused[key] = entry["reason"]
    return Releases(floors=dict(document["floors"]), refused=refused)


def refused_release(releases: Releases, distributions: Mapping[str, Mapping | None]) -> str | None:
    """Why a host is refused whose probe found a release refused by name (``distributions``: the probe's package ->
    {"version": ...} or None), or None."""
    reasons = [releases.refusal(package, found["version"]) for package, found in sorted(distributions.items())
               if found and found.get("version")]
    reasons = [reason for reason in reasons if reason]
    return "; ".join(reasons) + "; install a release that is not refused" if reasons else None

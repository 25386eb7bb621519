"""The kernel families of the translated tree (cdna2/data/kernel-families.yaml): which AITER API reaches each on a
patched gfx90a host in each AITER release read, what vLLM calls it, and which GPU check of the smoke test proves it.

The host side (which family a code object is, the verdicts, withholding) is cdna2/host/families.py; this module
loads and checks the data, and turns it into the rows `python -m cdna2 classify` and `python -m releases explain`
print.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Iterable

from cdna2.host.families import family_of
from cdna2.schema import load_packaged

FAMILIES_FILE = "kernel-families.yaml"
NOT_READ = "not read"  # the reach of a family in a release whose source nobody read for this table


class FamiliesError(ValueError):
    """kernel-families.yaml does not load or contradicts itself; the message names the file and the entry."""


@cache
def load_families() -> dict[str, Any]:
    """cdna2/data/kernel-families.yaml, validated against its schema and for consistency at load: family names
    unique, every reach entry's releases among those read, no release twice in one family."""
    document = load_packaged(FAMILIES_FILE, "kernel-families-1.0.json", FamiliesError)
    source = f"cdna2/data/{FAMILIES_FILE}"
    names = [family["name"] for family in document["families"]]
    if len(set(names)) != len(names):
        raise FamiliesError(f"{source}: a family name appears twice: {sorted(n for n in names if names.count(n) > 1)}")
    for family in document["families"]:
        releases = [release for entry in family["reach"] for release in entry["releases"]]
        unknown = sorted(set(releases) - set(document["releases"]))
        if unknown or len(set(releases)) != len(releases):
            raise FamiliesError(f"{source}: family {family['name']}: reach names {unknown or 'a release twice'}; "
                                f"each release read ({', '.join(document['releases'])}) at most once")
    return document


def keep_refusal(names: Iterable[str]) -> str | None:
    """Why host data's ``smoke_keep_unproven_families`` cannot stand (a name that is no family: a misspelling
    would withhold the family it meant), or None."""
    known = [family["name"] for family in load_families()["families"]]
    unknown = sorted(set(names) - set(known))
    return (f"smoke_keep_unproven_families names {', '.join(unknown)}, no kernel family of "
            f"cdna2/data/{FAMILIES_FILE} (they are: {', '.join(known)})") if unknown else None


def host_families() -> list[dict]:
    """What the smoke test on a host needs of each family: name, code objects, checks, why it has none."""
    return [{"name": family["name"], "kernels": family["kernels"], "checks": family["checks"],
             "no_check": family.get("no_check", "")} for family in load_families()["families"]]


def reach(family: str, aiter_version: str) -> dict[str, str]:
    """How ``family`` is reached in AITER ``aiter_version``: {path, api, evidence}; path ``not read`` when nobody
    read that release's source for this table (a family not in the table: ``not read`` too)."""
    entry = next((family_entry for family_entry in load_families()["families"] if family_entry["name"] == family),
                 None)
    found = next((r for r in (entry or {}).get("reach", ()) if aiter_version in r["releases"]), None)
    if found is None:
        read = ", ".join(load_families()["releases"])
        return {"path": NOT_READ, "api": "unknown",
                "evidence": f"reachability was read for {read} only" if entry else "not in kernel-families.yaml"}
    return {key: found[key] for key in ("path", "api", "evidence")}


def family_rows(kernels: Iterable[str]) -> list[dict]:
    """One row per family among ``kernels`` (code objects relative to the tree): its kernel count, its reach in
    every release read, vLLM's caller, its checks or why it has none."""
    counts: dict[str, int] = {}
    families = host_families()
    for relpath in kernels:
        name = family_of(relpath, families)
        counts[name] = counts.get(name, 0) + 1
    data = {family["name"]: family for family in load_families()["families"]}
    return [{"family": name, "kernels": count,
             "reach": {release: reach(name, release) for release in load_families()["releases"]},
             "vllm": data[name]["vllm"] if name in data else "unknown",
             "checks": data[name]["checks"] if name in data else [],
             "no_check": data[name].get("no_check") if name in data else "not in kernel-families.yaml"}
            for name, count in sorted(counts.items())]


def reach_table(rows: list[dict]) -> list[str]:
    """The rows as text: family, kernels, the path per release read, then the checks (or why none) and vLLM."""
    releases = list(load_families()["releases"])
    header = f"{'family':<14} {'kernels':>7}  " + "  ".join(f"{release:<17}" for release in releases) + "  proven by"
    lines = [header, "-" * len(header)]
    for row in rows:
        paths = "  ".join(f"{row['reach'][release]['path']:<17}" for release in releases)
        proof = ", ".join(row["checks"]) or f"no check: {row['no_check']}"
        lines.append(f"{row['family']:<14} {row['kernels']:>7}  {paths}  {proof}")
    return lines

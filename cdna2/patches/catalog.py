"""The patch-set catalog: YAML data under cdna2/data/patchsets, validated against cdna2/schemas/patchset-1.0.json."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

from cdna2.patches import matching
from cdna2.schema import first_violation, load_yaml

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_PATCHSET_DIR = PACKAGE_DIR / "data" / "patchsets"
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "patchset-1.0.json"


class PatchDataError(ValueError):
    """A patch-set file is invalid; the message names the file, the JSON path and the reason."""


@dataclass(frozen=True)
class Site:
    id: str
    file: str
    anchor: str
    count: int
    replacement: str
    marker: str
    why: str
    invalidates: tuple[str, ...]
    match: str = matching.CODE
    triton_op: str | None = None  # the in-code AITER Triton op it opens in vLLM, whose failed proof refuses the set
    # What released versions of this tool wrote here before: found instead of the replacement, it is read as the
    # anchor, so the next deploy rewrites the site (the first, pristine original stays the one kept for rollback).
    earlier_replacements: tuple[str, ...] = ()


@dataclass(frozen=True)
class Condition:
    file: str
    code: str


@dataclass(frozen=True)
class Add:
    """A file the package does not ship that a variant writes, with its bytes (read from cdna2/data at load)."""
    file: str
    data: bytes
    why: str


@dataclass(frozen=True)
class Variant:
    id: str
    versions: tuple[str, ...]
    derived_from: str
    sites: tuple[Site, ...]
    present: tuple[Condition, ...] = ()
    absent: tuple[Condition, ...] = ()
    refusal: str = ""
    leaves: tuple[tuple[str, str], ...] = ()  # (site id of another variant, why it is left as it is)
    adds: tuple[Add, ...] = ()

    def files(self) -> list[str]:
        return sorted({site.file for site in self.sites} | {c.file for c in self.present + self.absent}
                      | {add.file for add in self.adds})


@dataclass(frozen=True)
class PatchSet:
    name: str
    package: str
    role: str
    summary: str
    requires: tuple[str, ...]
    variants: tuple[Variant, ...]
    source: Path

    @property
    def optional(self) -> bool:
        return self.role == "optional"

    def variant(self, variant_id: str) -> Variant:
        """The variant of this set named ``variant_id`` (a plan's ``variants[set name]``)."""
        return next(variant for variant in self.variants if variant.id == variant_id)


@dataclass(frozen=True)
class Catalog:
    sets: tuple[PatchSet, ...]
    digest: str = ""  # of the schema and YAML bytes it was loaded from ("": built in code), for cdna2.patches.plan_memo

    def set_names(self) -> list[str]:
        return [patch_set.name for patch_set in self.sets]

    def optional_sets(self) -> list[str]:
        return [patch_set.name for patch_set in self.sets if patch_set.optional]

    def by_name(self, name: str) -> PatchSet:
        for patch_set in self.sets:
            if patch_set.name == name:
                return patch_set
        raise KeyError(f"no patch set named {name!r}; known sets: {', '.join(self.set_names())}")

    def sets_for(self, package: str) -> list[PatchSet]:
        return [patch_set for patch_set in self.sets if patch_set.package == package]

    def packages(self) -> list[str]:
        return sorted({patch_set.package for patch_set in self.sets})

    def unmet_requirements(self, enabled: Collection[str]) -> list[str]:
        """What each enabled optional set requires of another package's sets that ``enabled`` (a host's
        optional_patch_sets) leaves out, one line each. The planner checks a set's requirements within its package;
        these cross packages, so the deploy checks them per host."""
        return [f"{name} ({patch_set.package}) requires {required} ({self.by_name(required).package}), which is not "
                f"enabled" for name in enabled if name in self.set_names() for patch_set in [self.by_name(name)]
                for required in patch_set.requires
                if self.by_name(required).package != patch_set.package and required not in enabled]

    def target_files(self, package: str) -> list[str]:
        """Every file (relative to site-packages) that any variant of any set of ``package`` reads or edits."""
        return sorted({file for patch_set in self.sets_for(package) for variant in patch_set.variants
                       for file in variant.files()})


def _check_site_text(site: dict, where: str) -> None:
    """Text rules a schema cannot state; each one keeps "pristine" and "patched" from being confused."""
    anchor, replacement, marker = site["anchor"], site["replacement"], site["marker"]
    if replacement in anchor:
        raise PatchDataError(f"{where}.replacement: is contained in the anchor, so pristine text would read as patched")
    if marker not in replacement:
        raise PatchDataError(f"{where}.marker: {marker!r} does not occur in the replacement")
    if marker in anchor:
        raise PatchDataError(f"{where}.marker: {marker!r} already occurs in the anchor")
    mode = site.get("match", matching.CODE)
    lang = matching.language(site["file"])
    if mode == matching.CODE and lang != "text":
        anchor_code = matching.code_lines(anchor, lang, True)
        if not anchor_code:
            raise PatchDataError(f"{where}.anchor: holds no code line to match; use match: text")
        if [line.key for line in anchor_code] == [line.key for line in matching.code_lines(replacement, lang, True)]:
            raise PatchDataError(f"{where}.replacement: differs from the anchor only in comments or blank lines, so "
                                 f"pristine code would read as patched")
    for index, earlier in enumerate(site.get("earlier_replacements", ())):
        if any(matching.count_in_fragment(text, earlier, site["file"], mode) for text in (replacement, anchor)):
            raise PatchDataError(f"{where}.earlier_replacements[{index}]: occurs in the replacement or the anchor, so "
                                 "patched or pristine text would read as an earlier version's")


def _site(raw: dict) -> Site:
    return Site(id=raw["id"], file=raw["file"], anchor=raw["anchor"], count=raw["count"],
                replacement=raw["replacement"], marker=raw["marker"], why=raw["why"],
                invalidates=tuple(raw.get("invalidates", ())), match=raw.get("match", matching.CODE),
                triton_op=raw.get("triton_op"), earlier_replacements=tuple(raw.get("earlier_replacements", ())))


def _conditions(raw_variant: dict, key: str) -> tuple[Condition, ...]:
    return tuple(Condition(file=raw["file"], code=raw["code"]) for raw in raw_variant.get(key, ()))


def _adds(raw_variant: dict, where: str) -> tuple[Add, ...]:
    adds = []
    for index, raw in enumerate(raw_variant.get("adds", ())):
        path = PACKAGE_DIR / "data" / raw["source"]
        if not path.is_file():
            raise PatchDataError(f"{where}.adds[{index}].source: cdna2/data/{raw['source']} does not exist")
        adds.append(Add(file=raw["file"], data=path.read_bytes(), why=raw["why"]))
    return tuple(adds)


def _patch_set(document: dict, source: Path) -> PatchSet:
    variant_ids: set[str] = set()
    variants = []
    for v_index, raw_variant in enumerate(document["variants"]):
        where = f"{source}: $.variants[{v_index}]"
        if raw_variant["id"] in variant_ids:
            raise PatchDataError(f"{where}.id: duplicate variant id {raw_variant['id']!r}")
        variant_ids.add(raw_variant["id"])
        site_ids: set[str] = set()
        for s_index, raw_site in enumerate(raw_variant["sites"]):
            if raw_site["id"] in site_ids:
                raise PatchDataError(f"{where}.sites[{s_index}].id: duplicate site id {raw_site['id']!r}")
            site_ids.add(raw_site["id"])
            _check_site_text(raw_site, f"{where}.sites[{s_index}]")
        refusal = raw_variant.get("refusal", "")
        if bool(refusal) == bool(raw_variant["sites"] or raw_variant.get("adds")):
            raise PatchDataError(f"{where}: a variant has either sites (or adds) or a refusal (with present/absent conditions "
                                 f"saying where the feature is gone), not both and not neither")
        if refusal and not (raw_variant.get("present") or raw_variant.get("absent")):
            raise PatchDataError(f"{where}.refusal: needs present or absent conditions saying where it applies")
        variants.append(Variant(id=raw_variant["id"], versions=tuple(raw_variant["versions"]),
                                derived_from=raw_variant["derived_from"],
                                sites=tuple(_site(raw) for raw in raw_variant["sites"]),
                                present=_conditions(raw_variant, "present"), absent=_conditions(raw_variant, "absent"),
                                refusal=refusal, adds=_adds(raw_variant, where),
                                leaves=tuple((raw["site"], raw["why"]) for raw in raw_variant.get("leaves", ()))))
    return PatchSet(name=document["name"], package=document["package"], role=document["role"],
                    summary=document["summary"], requires=tuple(document.get("requires", ())),
                    variants=tuple(variants), source=source)


def _check_references(sets: list[PatchSet]) -> None:
    by_name: dict[str, PatchSet] = {}
    for patch_set in sets:
        if patch_set.name in by_name:
            raise PatchDataError(f"{patch_set.source}: $.name: set {patch_set.name!r} is also defined in "
                                 f"{by_name[patch_set.name].source}")
        by_name[patch_set.name] = patch_set
    for patch_set in sets:
        for index, required in enumerate(patch_set.requires):
            target = by_name.get(required)
            if target is None:
                raise PatchDataError(f"{patch_set.source}: $.requires[{index}]: no set named {required!r} "
                                     f"(known: {', '.join(sorted(by_name))})")
            if target.package != patch_set.package and not (patch_set.optional and target.optional):
                raise PatchDataError(f"{patch_set.source}: $.requires[{index}]: {required!r} patches "
                                     f"{target.package}, not {patch_set.package}: only an optional set may require "
                                     f"an optional set of another package (host data enables both)")


def load_catalog(directory: Path | None = None) -> Catalog:
    """Load and validate every ``*.yaml`` patch set in ``directory`` (default: cdna2/data/patchsets)."""
    directory = DEFAULT_PATCHSET_DIR if directory is None else Path(directory)
    schema_bytes = SCHEMA_PATH.read_bytes()
    schema = load_yaml(schema_bytes.decode("utf-8"))
    sources = sorted(directory.glob("*.yaml"))
    if not sources:
        raise PatchDataError(f"{directory}: no *.yaml patch sets found")
    sets = []
    digest = hashlib.sha256(schema_bytes)
    for source in sources:
        data = source.read_bytes()
        digest.update(b"\0" + source.name.encode("utf-8") + b"\0" + data)
        try:
            document = load_yaml(data.decode("utf-8"))
        except yaml.YAMLError as error:
            raise PatchDataError(f"{source}: $: not valid YAML: {error}") from error
        violation = first_violation(document, schema)
        if violation:
            raise PatchDataError(f"{source}: {violation}")
        sets.append(_patch_set(document, source))
        for add in (add for variant in sets[-1].variants for add in variant.adds):
            digest.update(b"\0" + add.file.encode("utf-8") + b"\0" + add.data)
    _check_references(sets)
    return Catalog(sets=tuple(sets), digest=digest.hexdigest())

"""Plan the patch of one package on one host from the text actually installed there. Pure: no I/O.

The deploy's probe supplies each target file's bytes and its RECORD hash; this module decides which variant of each
selected set matches that text, proves every file it would touch is the package's own (pristine, or pristine plus
exactly our sites), and returns the new contents with a unified diff. A package is planned all or nothing: one
mismatching site refuses every set of that package on that host.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from cdna2.host.checkouts import checkout_path
from cdna2.host.digests import hash_like
from cdna2.host.txn import STAGED_SUFFIX, staging_place
from cdna2.patches import matching
from cdna2.patches.audit import audit
from cdna2.patches.catalog import Catalog, Condition, PatchSet, Site, Variant

PRISTINE, PATCHED, MISMATCH, ABSENT = "pristine", "patched", "mismatch", "absent"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class SiteState:
    set_name: str
    variant: str
    site: str
    file: str
    state: str
    unpatched_found: int
    patched_found: int
    expected: int

    def describe(self) -> str:
        if self.state == ABSENT:
            return f"{self.file}: site {self.site}: file is absent"
        return (f"{self.file}: site {self.site}: expected the anchor {self.expected}x, found {self.unpatched_found} "
                f"unpatched and {self.patched_found} patched")

    def to_json(self) -> dict:
        return {"set": self.set_name, "variant": self.variant, "site": self.site, "file": self.file,
                "state": self.state, "unpatched_found": self.unpatched_found, "patched_found": self.patched_found,
                "expected": self.expected}


@dataclass(frozen=True)
class FileChange:
    path: str
    old_sha256: str | None  # None: a file the plan adds
    new_bytes: bytes
    new_sha256: str
    diff: str

    def to_json(self) -> dict:
        return {"path": self.path, "old_sha256": self.old_sha256, "new_sha256": self.new_sha256,
                "new_size": len(self.new_bytes), "diff": self.diff}


@dataclass
class PackagePlan:
    package: str
    installed_version: str
    status: str  # "apply" | "patched" | "refused" | "no-set"
    sets: list[str] = field(default_factory=list)
    variants: dict[str, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    changes: list[FileChange] = field(default_factory=list)
    jit_invalidations: list[str] = field(default_factory=list)
    sites: list[SiteState] = field(default_factory=list)
    declined: dict[str, str] = field(default_factory=dict)  # optional set -> why upstream no longer has its feature
    notes: list[str] = field(default_factory=list)  # e.g. a version no variant was written for
    audit: list[str] = field(default_factory=list)  # arch gates that still matter for gfx90a after this plan
    # A develop AITER's git checkout: its files sit at their repository paths there, and git HEAD is the pristine
    # oracle (None: an installed wheel, RECORD the oracle).
    checkout: str | None = None
    # The directories (host paths, shallowest first) the added files need that the host's tree does not have.
    new_directories: list[str] = field(default_factory=list)

    def host_path(self, path: str) -> str:
        """Where the file the catalog names ``path`` (wheel layout) is on the host, relative to the root."""
        return checkout_path(path) if self.checkout else path

    def staged_paths(self, root: str, tag: str = "") -> dict[str, str]:
        """Where each changed path's new bytes wait on the host (``tag``: the run's, in a shared environment):
        beside the target, or above the directories the transaction creates (same filesystem: the rename is
        atomic)."""
        return {change.path: f"{root}/{staging_place(self.host_path(change.path), self.new_directories)}"
                             f"{STAGED_SUFFIX}{tag}" for change in self.changes}

    def transaction(self, root: str, backup_dir: str, staged: Mapping[str, str]) -> dict:
        """The change manifest ``cdna2.host.txn apply`` runs; ``staged``: where each changed path's new bytes wait.

        It names the package version the plan was made for, so the host can tell backups of an earlier
        installation (reinstalled or upgraded since it was patched) from this one's.
        """
        # No version (""): files that belong to no package version (vLLM's tuned configs, cdna2.fp8_configs). Nor
        # for a develop checkout: its version is no installation that a reinstall could replace.
        return {"root": root, "package": self.package,
                "version": None if self.checkout else self.installed_version or None, "backup_dir": backup_dir,
                "changes": [{"path": self.host_path(change.path), "expected_sha256": change.old_sha256,
                             "staged": staged[change.path],
                             "new_sha256": change.new_sha256} for change in self.changes],
                "directories": self.new_directories, "jit_invalidations": self.jit_invalidations}

    def to_json(self) -> dict:
        return {"package": self.package, "installed_version": self.installed_version, "status": self.status,
                "sets": self.sets, "variants": self.variants, "reasons": self.reasons,
                "changes": [change.to_json() for change in self.changes],
                "jit_invalidations": self.jit_invalidations, "sites": [site.to_json() for site in self.sites],
                "declined": self.declined, "notes": self.notes, "audit": self.audit, "checkout": self.checkout,
                "new_directories": self.new_directories}


class _Refusal(Exception):
    """Internal: planning of this package stops; the message is one human line for PackagePlan.reasons."""


def site_state(text: str | None, site: Site, set_name: str, variant: str) -> SiteState:
    """Classify one site in one file's text: pristine (anchor found as expected), patched, absent or mismatch."""
    if text is None:
        return SiteState(set_name, variant, site.id, site.file, ABSENT, 0, 0, site.count)
    patched = matching.count(text, site.replacement, site.file, site.match)
    # An appending replacement contains its own anchor; those occurrences are not unpatched text.
    unpatched = (matching.count(text, site.anchor, site.file, site.match)
                 - patched * matching.count_in_fragment(site.replacement, site.anchor, site.file, site.match))
    if patched == 0 and unpatched == site.count:
        state = PRISTINE
    elif patched == site.count and unpatched == 0:
        state = PATCHED
    else:
        state = MISMATCH
    return SiteState(set_name, variant, site.id, site.file, state, unpatched, patched, site.count)


def _decode(files: Mapping[str, bytes | None], path: str) -> str | None:
    if path not in files:
        raise KeyError(f"the probe did not report {path}; pass every path of Catalog.target_files()")
    data = files[path]
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _Refusal(f"{path}: not UTF-8 text ({error}); cannot match anchors") from error


def _selected_sets(catalog: Catalog, package: str, enabled_optional: Collection[str]) -> list[PatchSet]:
    unknown = sorted(set(enabled_optional) - set(catalog.optional_sets()))
    if unknown:
        raise ValueError(f"enabled optional patch sets {unknown} are not optional sets of the catalog; "
                         f"optional sets: {', '.join(catalog.optional_sets())}")
    return [patch_set for patch_set in catalog.sets_for(package)
            if not patch_set.optional or patch_set.name in enabled_optional]


def _check_dependencies(catalog: Catalog, selected: list[PatchSet]) -> None:
    """Requirements within the package (one of another package is checked per host: Catalog.unmet_requirements)."""
    names = {patch_set.name for patch_set in selected}
    for patch_set in selected:
        for required in patch_set.requires:
            if required not in names and catalog.by_name(required).package == patch_set.package:
                raise _Refusal(f"set {patch_set.name} requires set {required}, which is not enabled: enable "
                               f"{required} in group data or disable {patch_set.name}")


def _variant_states(patch_set: PatchSet, variant: Variant, texts: dict[str, str | None]) -> list[SiteState]:
    return [site_state(texts[site.file], site, patch_set.name, variant.id) for site in variant.sites]


def _condition_failures(variant: Variant, texts: dict[str, str | None]) -> list[str]:
    def found(condition: Condition) -> bool:
        text = texts[condition.file]
        return text is not None and matching.count(text, condition.code, condition.file, matching.CODE) > 0

    def first_line(condition: Condition) -> str:
        return condition.code.strip().splitlines()[0]

    return ([f"{c.file}: required code is missing: {first_line(c)!r}" for c in variant.present if not found(c)]
            + [f"{c.file}: holds code this variant does not handle: {first_line(c)!r}" for c in variant.absent
               if found(c)])


def _unaccounted_gates(patch_set: PatchSet, variant: Variant, texts: dict[str, str | None]) -> list[str]:
    """Gates another variant of the set patches, found here in either form, that this variant has no site for."""
    def code(site: Site, text: str) -> tuple:
        return site.file, matching.code_key(text, site.file, site.match)

    own = {code(site, site.anchor) for site in variant.sites} | {code(site, site.replacement) for site in variant.sites}
    left, known = [], {site_id for site_id, _ in variant.leaves}
    for other in patch_set.variants:
        for site in other.sites:
            if (site.id in known or code(site, site.anchor) in own or code(site, site.replacement) in own
                    or texts[site.file] is None):
                continue
            state = site_state(texts[site.file], site, patch_set.name, other.id)
            if state.unpatched_found or state.patched_found:
                own.add(code(site, site.anchor))
                left.append(f"{site.file}: leaves gate {site.id} (patched by variant {other.id}) "
                            f"{'unpatched' if state.unpatched_found else 'unaccounted for'}")
    return left


def _add_problems(variant: Variant, texts: dict[str, str | None]) -> list[str]:
    """Files the variant adds that exist holding something else: not ours to overwrite."""
    return [f"{add.file}: exists and is not the file this set adds (sha256 "
            f"{sha256_hex(texts[add.file].encode('utf-8'))}): remove it, or leave the set disabled"
            for add in variant.adds if texts[add.file] is not None and texts[add.file].encode("utf-8") != add.data]


def _candidates(patch_set: PatchSet, texts: dict[str, str | None], version: str,
                package: str) -> list[tuple[Variant, list[SiteState]]]:
    """The variants whose sites all match, whose conditions hold and that leave no gate of the set unpatched."""
    evaluated = []
    for variant in patch_set.variants:
        states = _variant_states(patch_set, variant, texts)
        problems = [state.describe() for state in states if state.state not in (PRISTINE, PATCHED)]
        if not problems:
            problems = (_condition_failures(variant, texts) + _unaccounted_gates(patch_set, variant, texts)
                        + _add_problems(variant, texts))
        evaluated.append((variant, states, problems))
    matching_variants = [(variant, states) for variant, states, problems in evaluated if not problems]
    if matching_variants:
        return matching_variants
    lines = [f"{package} {version}: set {patch_set.name}: no variant matches the installed text"]
    for variant, _, problems in evaluated:
        lines.append(f"  variant {variant.id} (written for {', '.join(variant.versions)}):")
        lines.extend(f"    {problem}" for problem in problems)
    raise _Refusal("\n".join(lines))


def _anything_found(patch_sets: list[PatchSet], texts: dict[str, str | None]) -> bool:
    """True when any site of any variant is present in either form: the text is ours to judge, not foreign."""
    for patch_set in patch_sets:
        for variant in patch_set.variants:
            for state in _variant_states(patch_set, variant, texts):
                if state.unpatched_found or state.patched_found:
                    return True
    return False


def _undo(path: str, text: str, sites: list[tuple[Site, SiteState]]) -> str:
    """``text`` with every patched site of ``sites`` spliced back to its anchor."""
    original = text
    for site, state in sites:
        if state.state == PATCHED:
            original = matching.splice(original, site.replacement, site.anchor, path, site.match)
    return original


def _proven_original(path: str, text: str, sites: list[tuple[Site, SiteState]], record: Mapping[str, str],
                     checkout: str | None) -> None:
    """Refuse unless the file with our patched sites undone hashes to its RECORD entry, or in a develop
    ``checkout`` to its blob in git HEAD (nothing else was edited)."""
    expected = record.get(path)
    where = f"{checkout}/{checkout_path(path)}" if checkout else path
    if not expected:
        raise _Refusal(f"{where}: not in the checkout's git HEAD, so it cannot be proven pristine: commit it"
                       if checkout else f"{path}: no RECORD hash, so the file cannot be proven pristine; "
                                        f"reinstall the package")
    try:
        original = _undo(path, text, sites)
    except matching.SpliceError as error:
        raise _Refusal(f"{where}: a patched site cannot be undone ({error}); "
                       + ("restore it from git" if checkout else "reinstall the package")) from error
    if hash_like(expected, original.encode("utf-8")) != expected:
        raise _Refusal(f"{where}: uncommitted changes outside our patch sites (with our sites undone it is not git "
                       f"HEAD's {expected}); refusing to overwrite them: commit or stash them in {checkout}"
                       if checkout else
                       f"{path}: edited outside our patch sites (with our sites undone it does not match its RECORD "
                       f"hash {expected}); refusing to overwrite it: reinstall the package or restore the file")


def _patched_text(path: str, text: str, sites: list[tuple[Site, SiteState]]) -> str:
    new_text = text
    for site, state in sites:
        if state.state == PRISTINE:
            try:
                new_text = matching.splice(new_text, site.anchor, site.replacement, path, site.match)
            except matching.SpliceError as error:
                raise _Refusal(f"{path}: site {site.id} of set {state.set_name}: {error}; write a variant for "
                               f"this release") from error
    after_states = []
    for site, state in sites:
        after = site_state(new_text, site, state.set_name, state.variant)
        if after.state != PATCHED:
            raise _Refusal(f"{path}: site {site.id} of set {state.set_name} is not cleanly patched after applying "
                           f"every site ({after.describe()}); the sites of this file interfere: fix the data")
        after_states.append((site, after))
    # Revert must give back these bytes: prove it before anything is written.
    try:
        undoes = _undo(path, new_text, after_states) == _undo(path, text, sites)
    except matching.SpliceError:
        undoes = False
    if not undoes:
        raise _Refusal(f"{path}: the patched file would not undo to the installed bytes (the installed text at a site "
                       f"is spelled differently from the anchor where the change rewrites it); write a variant for "
                       f"this release")
    return new_text


def _undoes_to_record(combination: list[tuple[PatchSet, Variant, list[SiteState]]], texts: dict[str, str | None],
                      record: Mapping[str, str]) -> bool:
    """True when undoing every patched site of these variants gives each file its RECORD bytes."""
    by_file: dict[str, list[tuple[Site, SiteState]]] = {}
    for _, variant, states in combination:
        for site, state in zip(variant.sites, states):
            by_file.setdefault(site.file, []).append((site, state))
    for path, sites in by_file.items():
        if texts[path] is None or not any(state.state == PATCHED for _, state in sites):
            continue
        try:
            original = _undo(path, texts[path], sites)
        except matching.SpliceError:
            return False
        if hash_like(record.get(path) or "", original.encode("utf-8")) != record.get(path):
            return False
    return True


def _choose(candidates: list[tuple[PatchSet, list[tuple[Variant, list[SiteState]]]]], texts: dict[str, str | None],
            record: Mapping[str, str], label: str) -> list[tuple[PatchSet, Variant, list[SiteState]]]:
    """One variant per set. Variants that write the same code match the same patched text; the one whose undo
    gives the RECORD bytes is the one that was applied."""
    combinations = [[(patch_set, variant, states) for patch_set, (variant, states) in zip(
        [patch_set for patch_set, _ in candidates], choice)]
        for choice in itertools.product(*[options for _, options in candidates])]
    if len(combinations) > 1:
        combinations = [combination for combination in combinations if _undoes_to_record(combination, texts, record)]
    if len(combinations) == 1:
        return combinations[0]
    ambiguous = [f"set {patch_set.name}: variants {', '.join(variant.id for variant, _ in options)}"
                 for patch_set, options in candidates if len(options) > 1]
    raise _Refusal(f"{label}: {'; '.join(ambiguous)} all match; the data is ambiguous")


def _unified_diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))


def _earlier_undone(patch_sets: list[PatchSet], texts: dict[str, str | None]) -> tuple[dict[str, str | None],
                                                                                      list[str]]:
    """``texts`` with each site an earlier released version of this tool wrote (a site's ``earlier_replacements``,
    found in full where the replacement is not) read back as its anchor, so the plan rewrites it; and a note each."""
    texts, notes = dict(texts), []
    for patch_set in patch_sets:
        for variant in patch_set.variants:
            for site in variant.sites:
                text = texts[site.file]
                if text is None or matching.count(text, site.replacement, site.file, site.match):
                    continue
                for earlier in site.earlier_replacements:
                    if matching.count(text, earlier, site.file, site.match) == site.count:
                        try:
                            texts[site.file] = matching.splice(text, earlier, site.anchor, site.file, site.match)
                        except matching.SpliceError:
                            continue  # not cleanly ours: judged as the installed text stands
                        notes.append(f"{site.file}: site {site.id} of set {patch_set.name} holds what an earlier "
                                     "version of this tool wrote: rewritten with the current replacement")
                        break
    return texts, notes


def _plan_files(chosen: list[tuple[PatchSet, Variant, list[SiteState]]], texts: dict[str, str | None],
                installed: dict[str, str | None], record: Mapping[str, str],
                checkout: str | None) -> tuple[list[FileChange], list[str]]:
    """The file changes of ``chosen``; ``texts`` are the files with earlier versions' sites read as anchors,
    ``installed`` the files as they are (what the transaction verifies and replaces)."""
    by_file: dict[str, list[tuple[Site, SiteState]]] = {}
    for _, variant, states in chosen:
        for site, state in zip(variant.sites, states):
            by_file.setdefault(site.file, []).append((site, state))
    changes, invalidations = [], set()
    for add in sorted((add for _, variant, _ in chosen for add in variant.adds), key=lambda add: add.file):
        if texts[add.file] is None:
            changes.append(FileChange(add.file, None, add.data, sha256_hex(add.data),
                                      _unified_diff(add.file, "", add.data.decode("utf-8"))))
    for path in sorted(by_file):
        text = texts[path]
        if text is None:  # unreachable: a chosen variant matched every site, so each of its files is present
            raise _Refusal(f"{path}: absent, yet a variant with a site in it was chosen")
        _proven_original(path, text, by_file[path], record, checkout)
        new_text = _patched_text(path, text, by_file[path])
        if new_text != installed[path]:
            old_bytes, new_bytes = installed[path].encode("utf-8"), new_text.encode("utf-8")
            changes.append(FileChange(path, sha256_hex(old_bytes), new_bytes, sha256_hex(new_bytes),
                                      _unified_diff(path, installed[path], new_text)))
            invalidations.update(pattern for site, _ in by_file[path] for pattern in site.invalidates)
    return sorted(changes, key=lambda change: change.path), sorted(invalidations)


def plan_package(catalog: Catalog, package: str, installed_version: str, files: Mapping[str, bytes | None],
                 record: Mapping[str, str], enabled_optional: Collection[str],
                 checkout: str | None = None, absent_dirs: Collection[str] = ()) -> PackagePlan:
    """Plan ``package`` on one host: which sets apply, the new file contents, and what the JIT must forget.

    ``files`` maps every path of ``catalog.target_files(package)`` to its bytes (None if absent); ``record`` maps
    paths to their RECORD hash field (or, for a develop ``checkout``, their ``git-blob=`` id in HEAD).
    ``enabled_optional`` names the optional sets group data turns on. ``absent_dirs``: the directories (host paths)
    adding the absent files would create (``cdna2.host.distributions.absent_directories``).
    """
    plan = PackagePlan(package=package, installed_version=installed_version, status="refused", checkout=checkout)
    if not catalog.sets_for(package):
        plan.status = "no-set"
        plan.reasons.append(f"{package} {installed_version}: the catalog has no patch set for this package")
        return plan
    selected = _selected_sets(catalog, package, enabled_optional)
    try:
        _check_dependencies(catalog, selected)
        installed = {path: _decode(files, path) for path in catalog.target_files(package)}
        texts, upgrades = _earlier_undone(selected, installed)
        candidates, failures = [], []
        for patch_set in selected:
            try:
                candidates.append((patch_set, _candidates(patch_set, texts, installed_version, package)))
            except _Refusal as refusal:
                failures.append(str(refusal))
        chosen = []
        for patch_set, variant, states in (_choose(candidates, texts, record, f"{package} {installed_version}")
                                           if not failures else []):
            if variant.refusal:
                reason = f"{package} {installed_version}: set {patch_set.name}: {variant.refusal}"
                if not patch_set.optional:
                    failures.append(reason)
                else:
                    plan.declined[patch_set.name] = reason
                continue
            chosen.append((patch_set, variant, states))
            plan.sites.extend(states)
        if failures:
            plan.reasons.extend(failures)
            if not _anything_found(selected, texts):
                plan.status = "no-set"
                plan.reasons.insert(0, f"{package} {installed_version}: no site of any patch set is present in "
                                       f"either form; no set was written for this text")
            return plan
        plan.changes, plan.jit_invalidations = _plan_files(chosen, texts, installed, record, checkout)
        plan.notes.extend(upgrades)
    except _Refusal as refusal:
        plan.reasons.append(str(refusal))
        return plan
    plan.sets = [patch_set.name for patch_set, _, _ in chosen]
    plan.variants = {patch_set.name: variant.id for patch_set, variant, _ in chosen}
    plan.status = "apply" if plan.changes else "patched"
    added = [plan.host_path(change.path) for change in plan.changes if change.old_sha256 is None]
    plan.new_directories = [directory for directory in absent_dirs
                            if any(path.startswith(directory + "/") for path in added)]
    for patch_set, variant, _ in chosen:
        plan.reasons.append(f"{package} {installed_version}: set {patch_set.name} variant {variant.id} matches the "
                            f"installed text (written for {', '.join(variant.versions)})")
        plan.notes.extend(f"set {patch_set.name} variant {variant.id} leaves gate {site_id} as it is: {why}"
                          for site_id, why in variant.leaves)
        if installed_version not in variant.versions:
            plan.notes.append(f"set {patch_set.name}: matched by text; no variant written for {installed_version}")
    plan.reasons.extend(f"{reason} (declined; the other sets apply)" for reason in plan.declined.values())
    plan.audit = audit({**texts, **{change.path: change.new_bytes.decode("utf-8") for change in plan.changes}})
    return plan

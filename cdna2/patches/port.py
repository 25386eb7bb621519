"""Draft a variant of one patch set for a release no variant matches: ``python -m cdna2 patch port``.

The closest variant (most sites matching as they are) is the model. A site that still matches is copied. Any other
is placed by the code around it: the window of code lines in the new file most like the site's anchor (difflib
ratio over the lines' tokens, weighted by the names they share) becomes the new anchor, verbatim from the installed
file, and the site's change (the lines its replacement adds, drops or rewrites) is carried onto it. What cannot be
placed, or where the lines the change rewrites differ upstream, is listed for review. Nothing is written into any
package: the draft is YAML text a person reviews and adds to the set's file.
"""

from __future__ import annotations

import difflib
import keyword
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from cdna2.patches import matching
from cdna2.patches.catalog import PatchSet, Site, Variant
from cdna2.patches.planner import PATCHED, PRISTINE, site_state

PLACE_THRESHOLD = 0.6  # below this the best window is not the site, only something like it
RENAMED_RATIO = 0.9  # two names this alike (difflib ratio) are taken for one renamed upstream


@dataclass
class Draft:
    model: Variant
    sites: list[dict] = field(default_factory=list)
    review: list[str] = field(default_factory=list)  # one line per site a person must look at
    unplaced: list[str] = field(default_factory=list)


def _tokens(lines) -> list[str]:
    return [str(part) for line in lines for part in line.key if not isinstance(part, int)]


def _names(tokens: list[str]) -> set[str]:
    return {token for token in tokens if token.isidentifier() and not keyword.iskeyword(token)}


def _shared_names(wanted: set[str], found: set[str]) -> float:
    """The share of ``wanted`` names ``found`` uses: a name found as it is counts 1, one found only renamed (a name
    of ``found`` spelled almost alike, as is_aiter_found_and_supported_on_rdna4 became ..._on_rdna) counts half."""
    if not wanted:
        return 1.0
    exact = wanted & found
    renamed = [name for name in wanted - found if any(
        difflib.SequenceMatcher(None, name, other).ratio() >= RENAMED_RATIO for other in found - wanted)]
    return (len(exact) + len(renamed) / 2) / len(wanted)


def _best_window(text: str, site: Site) -> tuple[float, int, int] | None:
    """(score, first row, last row) of the file's code-line window most like the anchor's code lines.

    The score is the token-sequence ratio times the square of the share of the anchor's names the window uses:
    a site is known by the names around it (is_mha_enabled is not is_mla_enabled, however alike they look: a name
    found only renamed counts half, so the site's own window, where it still exists, wins).
    """
    lang = matching.language(site.file)
    anchor = matching.code_lines(site.anchor, lang, True)
    lines = matching.code_lines(text, lang, False)
    if not anchor or len(lines) < len(anchor):
        return None
    wanted = _tokens(anchor)
    wanted_names = _names(wanted)
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)
    best = None
    for start in range(len(lines) - len(anchor) + 1):
        window = lines[start:start + len(anchor)]
        tokens = _tokens(window)
        matcher.set_seq1(tokens)
        if best and matcher.real_quick_ratio() <= best[0]:
            continue
        shared = _shared_names(wanted_names, _names(tokens))
        score = matcher.ratio() * shared ** 2
        if best is None or score > best[0]:
            best = (score, window[0].first_row, window[-1].last_row)
    return best


def _boundary(blocks: list, index: int) -> int:
    """Where old-anchor line boundary ``index`` falls in the new anchor, by the lines both share."""
    for a, b, size in blocks:
        if a <= index <= a + size:
            return b + (index - a)
    before = [(a, b, size) for a, b, size in blocks if a + size <= index]
    return before[-1][1] + before[-1][2] if before else 0


def carry_change(old_anchor: str, old_replacement: str, new_anchor: str) -> tuple[str, bool]:
    """``new_anchor`` with the lines ``old_replacement`` adds or rewrites in ``old_anchor`` carried over.

    Returns (draft replacement, clean): not clean when a line the change rewrites or drops differs upstream.
    """
    old = old_anchor.splitlines(keepends=True)
    changed = old_replacement.splitlines(keepends=True)
    new = new_anchor.splitlines(keepends=True)
    blocks = difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks()
    out, clean = [], True
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, changed, autojunk=False).get_opcodes():
        start, end = _boundary(blocks, i1), _boundary(blocks, i2)
        if tag == "equal":
            out.extend(new[start:end])
        else:
            if new[start:end] != old[i1:i2]:
                clean = False
            out.extend(changed[j1:j2])
    return "".join(out), clean


def _site_document(site: Site, anchor: str, replacement: str, count: int) -> dict:
    document = {"id": site.id, "file": site.file}
    if site.match != matching.CODE:
        document["match"] = site.match
    document.update({"anchor": anchor, "count": count, "replacement": replacement, "marker": site.marker,
                     "why": site.why})
    if site.invalidates:
        document["invalidates"] = list(site.invalidates)
    return document


def draft_variant(patch_set: PatchSet, texts: Mapping[str, str | None]) -> Draft:
    """Place every site of the closest variant of ``patch_set`` in ``texts`` (path -> installed text or None)."""
    def matched(variant: Variant) -> int:
        return sum(texts.get(site.file) is not None
                   and site_state(texts[site.file], site, patch_set.name, variant.id).state in (PRISTINE, PATCHED)
                   for site in variant.sites)

    model = max((variant for variant in patch_set.variants if variant.sites), key=matched)
    draft = Draft(model=model)
    for site in model.sites:
        text = texts.get(site.file)
        if text is None:
            draft.unplaced.append(f"{site.id}: {site.file} is absent")
            continue
        if site_state(text, site, patch_set.name, model.id).state in (PRISTINE, PATCHED):
            draft.sites.append(_site_document(site, site.anchor, site.replacement, site.count))
            continue
        best = _best_window(text, site)
        if best is None or best[0] < PLACE_THRESHOLD:
            draft.unplaced.append(f"{site.id}: no code in {site.file} is like its anchor"
                                  + (f" (best {best[0]:.2f} at line {best[1] + 1})" if best else ""))
            continue
        ratio, first, last = best
        rows = text.splitlines(keepends=True)
        anchor = "".join(rows[first:last + 1])
        replacement, clean = carry_change(site.anchor, site.replacement, anchor)
        count = matching.count(text, anchor, site.file, site.match)
        draft.sites.append(_site_document(site, anchor, replacement, count))
        draft.review.append(f"{site.id}: placed at {site.file} line {first + 1} (similarity {ratio:.2f})"
                            + ("" if clean else "; the lines its change rewrites differ upstream: rewrite the "
                                                "replacement by hand")
                            + ("" if count == site.count else f"; the new anchor occurs {count}x, not {site.count}x"))
    # A gate another variant patches that is still here belongs in the draft too, or it would be a silent subset.
    placed = {(document["file"], matching.code_key(document["anchor"], document["file"],
                                                   document.get("match", matching.CODE)))
              for document in draft.sites}
    for other in patch_set.variants:
        for site in other.sites:
            key = (site.file, matching.code_key(site.anchor, site.file, site.match))
            text = texts.get(site.file)
            if key in placed or text is None:
                continue
            if site_state(text, site, patch_set.name, other.id).state in (PRISTINE, PATCHED):
                placed.add(key)
                draft.sites.append(_site_document(site, site.anchor, site.replacement, site.count))
                draft.review.append(f"{site.id}: taken from variant {other.id}: its gate is still here")
    return draft


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as the set files hold them."""


def _string(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)


def draft_yaml(draft: Draft, version: str, derived_from: str) -> str:
    """The draft as a YAML list item for the set's ``variants``, headed by what needs review."""
    document = [{"id": f"draft-{version}", "versions": [version], "derived_from": derived_from,
                 "sites": draft.sites}]
    header = [f"# Draft variant for {version}, modelled on variant {draft.model.id}. Review before adding it."]
    header += [f"# review: {line}" for line in draft.review]
    header += [f"# not placed: {line}" for line in draft.unplaced]
    return "\n".join(header) + "\n" + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=116,
                                               allow_unicode=True)

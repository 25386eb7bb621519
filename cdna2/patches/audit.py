"""After planning: read the would-be-patched files and list the arch gates that still matter for gfx90a.

Two kinds, on every code line (comments skipped) that tests an arch (a "gfx942" literal, on_mi3xx(), on_gfx942(),
get_cdna_version() > 2: the translated kernels are gfx942's) without naming gfx90a or on_gfx9():

- a positive test (==, in, on_mi3xx(), > 2) on an attention path (fmha/mha/pa/attention, whose translated kernels
  the tool installs) and not on an FP8/FP4 path: it still refuses gfx90a there;
- a negated test (!=, not in) on an FP8/FP4 path: everything but the named arch passes, gfx90a included; so does
  a compute-capability floor of 89 or 90 (gfx90a reports 90) not followed by an MI3xx or gfx90a test.

FP8/FP4 path and attention path are read from the line, the three lines around it and the enclosing Python def's
name. It is a reading aid, not a proof: it sees only the files the patch sets target.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from cdna2.patches import matching

# The translated kernels are gfx942's, so a gate is about gfx90a when it names gfx942 (or MI3xx / CDNA3+).
ARCH_TEST = re.compile(r"""["']gfx942["']|\bon_mi3xx\(\)|\bon_gfx942\(\)|\bget_cdna_version\(\)\s*>\s*2""")
# gfx90a reports CUDA-style capability 90: a capability floor alone admits it.
CAPABILITY_FLOOR = re.compile(r"\bcompute_capability\s*<\s*(8\d|90)\b")
HANDLED = re.compile(r"gfx90a|\bon_gfx9\(\)")
NEGATED = re.compile(r"""!=\s*["']gfx942|\bnot\s+in\s*[(\[]""")
FP8_FP4 = re.compile(r"fp8|fp4|\bf4|float4|e4m3|e5m2|mxfp|scaled_mm|_f8|\bF8\b|fp4x2", re.I)
ATTENTION = re.compile(r"fmha|\bmha|attn|attention|paged|\bpa_|_pa\b|flash", re.I)
PY_DEF = re.compile(r"^(\s*)def\s+(\w+)")
REFUSES, ADMITS = "still refuses gfx90a on an attention path whose kernels are installed", \
    "admits gfx90a to an FP8/FP4 path"


def _enclosing_def(rows: list[str], index: int) -> str:
    indent = len(rows[index]) - len(rows[index].lstrip())
    for row in reversed(rows[:index]):
        found = PY_DEF.match(row)
        if found and len(found.group(1)) < indent:
            return found.group(2)
    return ""


def audit_file(path: str, text: str) -> list[str]:
    lang = matching.language(path)
    if lang == "text":
        return []
    rows = text.splitlines()
    findings, seen = [], set()
    for line in matching.code_lines(text, lang, False):
        row = line.first_row
        if row in seen:  # C/C++ code lines are tokens: one look per physical line
            continue
        seen.add(row)
        source = rows[row]
        if CAPABILITY_FLOOR.search(source):
            following = "\n".join(rows[row:row + 12])
            if FP8_FP4.search("\n".join(rows[max(0, row - 12):row + 4])) and not (
                    HANDLED.search(following) or re.search(r"\bon_mi3xx\(\)|on_gfx942\(\)", following)):
                findings.append(f"{path}:{row + 1}: {source.strip()[:100]}: {ADMITS} (capability 90 passes)")
            continue
        if not ARCH_TEST.search(source) or HANDLED.search(source):
            continue
        context = "\n".join(rows[max(0, row - 3):row + 4])
        if lang == "python":
            context += "\n" + _enclosing_def(rows, row)
        on_fp = bool(FP8_FP4.search(context))
        if NEGATED.search(source):
            kind = ADMITS if on_fp else None
        else:
            kind = REFUSES if (not on_fp and ATTENTION.search(context)) else None
        if kind:
            findings.append(f"{path}:{row + 1}: {source.strip()[:100]}: {kind}")
    return findings


def audit(texts: Mapping[str, str | None]) -> list[str]:
    """Findings for every file of ``texts`` (path -> the text the plan would leave there), in path order."""
    return [finding for path in sorted(texts) if texts[path] is not None for finding in audit_file(path, texts[path])]

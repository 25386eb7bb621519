"""Find a patch site by what its code does, not how it is spelled, and splice the change into the installed text.

A site's anchor is compared with the installed file as *code*: Python line by line through ``tokenize`` without
comments, blank lines, NL/NEWLINE tokens and trailing whitespace (indentation of each line still counts, and so
does where a code line breaks); C/C++ token by token without comments and whitespace, line breaks included. Blank
and comment-only lines are not code, so they may differ or be added or removed; a changed token, or in Python a
changed indentation or line break, is a mismatch. ``match: text`` sites (anchors that start or end inside a string
literal) compare bytes.

Splicing keeps the installed text around each site: the lines the anchor and the replacement share at their start
and end stay as installed, and only the lines in between are rewritten. Undoing a patched site is the same splice
the other way; the planner checks that it gives back the installed bytes before anything is written.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache

PYTHON_SUFFIXES = (".py",)
C_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".hip", ".inc")
CODE, TEXT = "code", "text"

_C_TOKEN = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|[A-Za-z0-9_.]+|\S""", re.S)
_SKIPPED_PY = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENDMARKER}


class SpliceError(ValueError):
    """The code matched, but the blank/comment lines at a site's edge differ, so the splice point is not known."""


@dataclass(frozen=True)
class CodeLine:
    first_row: int  # 0-based physical line where the code line (a C/C++ token) starts
    last_row: int  # and where its last token ends (a multi-line string spans several)
    key: tuple


def language(path: str) -> str:
    if path.endswith(PYTHON_SUFFIXES):
        return "python"
    if path.endswith(C_SUFFIXES):
        return "c"
    return "text"


def _python_lines(text: str, fragment: bool) -> tuple[CodeLine, ...]:
    # A fragment is tokenized inside one bracket pair, so its indentation is reported (as columns) but never checked
    # against an enclosing block, and an unclosed bracket of its own ends the stream instead of failing it.
    source = f"(\n{text}\n)\n" if fragment else text
    offset = 2 if fragment else 1
    rows: dict[int, list] = {}
    last_rows: dict[int, int] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in _SKIPPED_PY or token.type == tokenize.ERRORTOKEN and not token.string.strip():
                continue
            row = token.start[0] - offset
            if fragment and (row < 0 or row >= text.count("\n") + 1):
                continue
            if row not in rows:
                rows[row] = [token.start[1]]
            rows[row].append(token.string)
            last_rows[row] = token.end[0] - offset
    except (tokenize.TokenError, IndentationError, SyntaxError):
        if not fragment:
            raise
    return tuple(CodeLine(row, last_rows[row], tuple(rows[row])) for row in sorted(rows))


def _c_lines(text: str) -> tuple[CodeLine, ...]:
    # Each C/C++ token is a unit of its own, so line breaks are whitespace too: "else {" matches "else\n{".
    units = []
    row, position = 0, 0
    for match in _C_TOKEN.finditer(text):
        row += text.count("\n", position, match.start())
        position = match.start()
        token = match.group()
        if not token.startswith(("//", "/*")):
            units.append(CodeLine(row, row + token.count("\n"), (token,)))
    return tuple(units)


@lru_cache(maxsize=256)  # keyed by whole file texts, so bounded: a plan reads each file and fragment once
def code_lines(text: str, lang: str, fragment: bool) -> tuple[CodeLine, ...]:
    """The code lines of ``text``; ``fragment``: an anchor or replacement, not a whole file."""
    if lang == "python":
        try:
            return _python_lines(text, fragment)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            return ()  # an installed .py file that does not tokenize has no code we recognise: every site mismatches
    return _c_lines(text)


def code_key(fragment: str, path: str, mode: str) -> tuple:
    """What two fragments must share to be the same code (the text itself for ``match: text``)."""
    lang = language(path)
    if mode == TEXT or lang == "text":
        return (fragment,)
    return tuple(line.key for line in code_lines(fragment, lang, True))


def _occurrences(haystack: tuple[CodeLine, ...], needle: tuple[CodeLine, ...]) -> list[int]:
    """Start indices of the non-overlapping occurrences of ``needle``'s keys in ``haystack``'s."""
    keys = [line.key for line in needle]
    found, index, size = [], 0, len(keys)
    if not size:
        return found
    while index <= len(haystack) - size:
        if haystack[index].key == keys[0] and all(haystack[index + k].key == keys[k] for k in range(1, size)):
            found.append(index)
            index += size
        else:
            index += 1
    return found


def count(text: str, pattern: str, path: str, mode: str) -> int:
    """How many times ``pattern`` occurs in ``text`` (a whole file, or a fragment for anchor-in-replacement)."""
    lang = language(path)
    if mode == TEXT or lang == "text":
        return text.count(pattern)
    return len(_occurrences(code_lines(text, lang, False), code_lines(pattern, lang, True)))


def count_in_fragment(fragment: str, pattern: str, path: str, mode: str) -> int:
    lang = language(path)
    if mode == TEXT or lang == "text":
        return fragment.count(pattern)
    return len(_occurrences(code_lines(fragment, lang, True), code_lines(pattern, lang, True)))


def shared_edges(old: str, new: str) -> tuple[int, int]:
    """Lines that ``old`` and ``new`` share at their start and at their end (not overlapping in either)."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = 0
    while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while (tail < min(len(old_lines), len(new_lines)) - head
           and old_lines[-1 - tail] == new_lines[-1 - tail]):
        tail += 1
    return head, tail


def _boundary_row(pattern_rows: list[str], pattern_code: tuple[CodeLine, ...], file_code: tuple[CodeLine, ...],
                  start: int, boundary: int, file_rows: list[str]) -> int | None:
    """The file row where pattern row ``boundary`` falls, for the occurrence at file code line ``start``.

    Walk from the nearest code line after the boundary backwards, or from the nearest one before it forwards, over
    blank/comment rows that must then equal the installed rows exactly; None if neither walk holds.
    """
    after = next((j for j, line in enumerate(pattern_code) if line.first_row >= boundary), None)
    # A row boundary of the pattern must be one in the file too: no code of the other side on the same row.
    if after is not None and (start + after == 0
                              or file_code[start + after - 1].last_row < file_code[start + after].first_row):
        gap = pattern_code[after].first_row - boundary
        row = file_code[start + after].first_row - gap
        if row >= 0 and all(file_rows[row + k].rstrip() == pattern_rows[boundary + k].rstrip() for k in range(gap)):
            return row
    before = next((j for j in range(len(pattern_code) - 1, -1, -1) if pattern_code[j].last_row < boundary), None)
    if before is not None and (start + before + 1 >= len(file_code)
                               or file_code[start + before].last_row < file_code[start + before + 1].first_row):
        first_gap_row = pattern_code[before].last_row + 1
        gap = boundary - first_gap_row
        row = file_code[start + before].last_row + 1
        if row + gap <= len(file_rows) and all(file_rows[row + k].rstrip() == pattern_rows[first_gap_row + k].rstrip()
                                               for k in range(gap)):
            return row + gap
    return None


def splice(text: str, old: str, new: str, path: str, mode: str) -> str:
    """Replace every occurrence of ``old`` in ``text`` by ``new``, keeping the installed lines they share.

    Raises SpliceError when the blank/comment lines next to the rewritten lines differ from ``old``'s.
    """
    lang = language(path)
    if mode == TEXT or lang == "text":
        return text.replace(old, new)
    head, tail = shared_edges(old, new)
    old_rows, new_rows = old.splitlines(keepends=True), new.splitlines(keepends=True)
    old_code, new_code = code_lines(old, lang, True), code_lines(new, lang, True)
    # Move the edges off any code line that straddles them (a multi-line string), in either text.
    for code, rows in ((old_code, old_rows), (new_code, new_rows)):
        for line in code:
            if line.first_row < head <= line.last_row:
                head = line.first_row
            if line.first_row < len(rows) - tail <= line.last_row:
                tail = len(rows) - line.last_row - 1
    middle = "".join(new_rows[head:len(new_rows) - tail])
    file_rows = text.splitlines(keepends=True)
    file_code = code_lines(text, lang, False)
    starts = _occurrences(file_code, old_code)
    row_offsets = [0]
    for row in file_rows:
        row_offsets.append(row_offsets[-1] + len(row))
    pieces, cursor = [], 0
    for start in starts:
        first = _boundary_row(old_rows, old_code, file_code, start, head, file_rows)
        last = _boundary_row(old_rows, old_code, file_code, start, len(old_rows) - tail, file_rows)
        if first is None or last is None or last < first:
            raise SpliceError(f"the code matches near line {file_code[start].first_row + 1}, but the blank or comment "
                              f"lines next to the lines it rewrites differ from the anchor's")
        pieces.append(text[cursor:row_offsets[first]])
        pieces.append(middle)
        cursor = row_offsets[last]
    pieces.append(text[cursor:])
    return "".join(pieces)

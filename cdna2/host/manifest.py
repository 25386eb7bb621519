"""AITER kernel manifests (CSV): find the kernel column, keep only rows whose kernel exists, check the result.

Two schemas occur in real trees: newer AITER names the column ``co_name``; amd-aiter 0.1.7.post2.dev18 uses
``knl_file`` in most of its CSVs and ``co_name`` in others. Names are relative to the CSV's folder, and the fmha
dispatcher may insert ``MI300/`` or ``MI308/`` at load time, so a row stands for every one of those that exists.
Standard library only: the translator prunes manifests with it and the smoke test checks them on the host.
"""

from __future__ import annotations

import csv
import posixpath
from dataclasses import dataclass
from pathlib import Path

KERNEL_COLUMNS = ("co_name", "knl_file")
PRODUCT_SUBDIRS = ("", "MI300/", "MI308/")


class ManifestError(ValueError):
    """A manifest row that cannot be honoured (a path outside the tree, an unreadable row)."""


@dataclass
class PrunedManifest:
    text: str
    column: str | None
    kept: int
    dropped: int


def _fields(line: str, where: str) -> list[str]:
    rows = list(csv.reader([line]))
    if len(rows) != 1:
        raise ManifestError(f"{where}: not a single CSV record (multi-line fields are not supported)")
    return rows[0]


def kernel_column(header: list[str]) -> int | None:
    for index, name in enumerate(header):
        if any(column in name.strip() for column in KERNEL_COLUMNS):
            return index
    return None


def row_candidates(manifest_relpath: str, name: str, where: str) -> list[str]:
    """Tree-relative paths the row's kernel may be loaded from; refuses names leaving the tree."""
    folder = posixpath.dirname(manifest_relpath)
    candidates = []
    for subdir in PRODUCT_SUBDIRS:
        path = posixpath.normpath(posixpath.join(folder, subdir + name))
        if name.startswith("/") or path == ".." or path.startswith("../"):
            raise ManifestError(f"{where}: kernel {name!r} lies outside the kernel tree; fix or remove the row")
        candidates.append(path)
    return candidates


def _rows(manifest_relpath: str, text: str):
    lines = text.splitlines(keepends=True)
    if not lines:
        return None, None, []
    header = _fields(lines[0], f"{manifest_relpath}:1")
    column = kernel_column(header)
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        where = f"{manifest_relpath}:{number}"
        fields = _fields(line, where)
        if column is not None and column >= len(fields):
            raise ManifestError(f"{where}: row has {len(fields)} fields, the kernel column is field {column + 1}")
        rows.append((line, row_candidates(manifest_relpath, fields[column].strip(), where) if column is not None
                     else []))
    return lines[0], (header[column].strip() if column is not None else None), rows


def prune(manifest_relpath: str, text: str, source_kernels: set[str], written: set[str]) -> PrunedManifest:
    """Keep a row only when every variant of its kernel present in the source was written (at least one was)."""
    header, column, rows = _rows(manifest_relpath, text)
    if column is None:
        return PrunedManifest(text=text, column=None, kept=0, dropped=0)
    kept_lines, dropped = [header], 0
    for line, candidates in rows:
        present = [c for c in candidates if c in source_kernels]
        if present and all(c in written for c in present):
            kept_lines.append(line if line.endswith("\n") else line + "\n")
        else:
            dropped += 1
    return PrunedManifest(text="".join(kept_lines), column=column, kept=len(kept_lines) - 1, dropped=dropped)


def dangling_rows(root: Path, manifest_relpath: str) -> list[str]:
    """Rows of a manifest under `root` whose kernel file exists in none of its load locations."""
    _, column, rows = _rows(manifest_relpath, (root / manifest_relpath).read_text(encoding="utf-8"))
    if column is None:
        return []
    return [line.strip() for line, candidates in rows if not any((root / c).is_file() for c in candidates)]

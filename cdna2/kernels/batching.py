"""How the translation engine cuts a tree's files into worker tasks: batches of about equal total size, dealt
largest first (``balanced``) or cut as runs of neighbours (``runs``, for the scan), and the size of a judge task.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from itertools import accumulate
from pathlib import Path

# Distinct instructions per judge task: 4 or 5 tasks for the 0.1.7 tree's 96,000, enough to keep both cores busy
# to the end; each task starts llvm-mc three times (about 20 ms each).
JUDGE_BATCH = 24_000


def _sizes(root: Path, relpaths: list[str]) -> list[int]:
    return [os.stat(os.path.join(root, relpath)).st_size for relpath in relpaths]


def balanced(root: Path, relpaths: list[str], count: int) -> list[list[str]]:
    """Deal files into `count` batches of about equal total size, largest first (each batch sorted)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(count, len(relpaths))))]
    loads = [0] * len(groups)
    for size, relpath in sorted(zip(_sizes(root, relpaths), relpaths), key=lambda pair: -pair[0]):
        lightest = loads.index(min(loads))
        groups[lightest].append(relpath)
        loads[lightest] += size
    return [sorted(group) for group in groups if group]


def runs(root: Path, relpaths: list[str], count: int) -> list[list[str]]:
    """Cut files, in the order given, into `count` runs of about equal total size: neighbours stay together (the
    scan meets a .text it has already cut mostly in the same directory)."""
    ends = list(accumulate(_sizes(root, relpaths)))
    total = ends[-1] if ends else 0
    cuts = [0] + [min(bisect_left(ends, total * k / count) + 1, len(relpaths)) for k in range(1, count)]
    cuts.append(len(relpaths))
    return [relpaths[start:end] for start, end in zip(cuts, cuts[1:]) if end > start]

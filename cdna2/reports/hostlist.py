"""Many host names written briefly, the way Slurm writes a node list: ``nid[001-004,007],login1``.

Names are split at their last run of digits into prefix, number and suffix; names that share prefix, suffix and
zero padding are written once with their numbers as ranges. A name without digits is written as it is. Reading
such lists back is Slurm's job (``scontrol show hostnames``, see cdna2/slurm.py); this module only writes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress(names: Iterable[str]) -> str:
    """``nid001, nid002, nid003, nid007, login1`` as ``login1,nid[001-003,007]``: families in name order, each
    number once."""
    families: dict[tuple[str, str], list[str]] = {}
    plain: set[str] = set()
    for name in set(names):
        match = NUMBERED.match(name)
        if match:
            prefix, digits, suffix = match.groups()
            families.setdefault((prefix, suffix), []).append(digits)
        else:
            plain.add(name)
    parts = [(name, name) for name in plain]
    for (prefix, suffix), numbers in families.items():
        # Zero-padded numbers keep their width (nid[001-100]); numbers without a leading zero of another width are
        # written bare (nid[1-12]), as Slurm reads them back.
        padded = {len(digits) for digits in numbers if len(digits) > 1 and digits.startswith("0")}
        by_width: dict[int, set[int]] = {}
        for digits in numbers:
            by_width.setdefault(len(digits) if len(digits) in padded else 0, set()).add(int(digits))
        for width, values in by_width.items():
            ranges = _ranges(sorted(values), width)
            text = f"{prefix}{ranges[0]}{suffix}" if len(values) == 1 else f"{prefix}[{','.join(ranges)}]{suffix}"
            parts.append((f"{prefix}{str(min(values)).zfill(width)}{suffix}", text))
    return ",".join(text for _, text in sorted(parts))


def _ranges(values: list[int], width: int) -> list[str]:
    """Sorted numbers as ``1-3``, ``7``: consecutive runs joined, each number padded to ``width``."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return [str(low).zfill(width) if low == high else f"{str(low).zfill(width)}-{str(high).zfill(width)}"
            for low, high in runs]

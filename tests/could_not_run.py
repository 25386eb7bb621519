"""bin/test's last line: how many tests could not run and why, read from pytest's JUnit XML reports.

A skip is shown only in pytest's ``-ra`` summary, far above the end of a long run; this line says it last.
Usage: python -m tests.could_not_run REPORT.xml ...
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter


def skip_reasons(paths: list[str]) -> Counter:
    """Skipped tests per reason (pytest's message, without its "file:line: " prefix where it has one)."""
    reasons: Counter = Counter()
    for path in paths:
        for skipped in ElementTree.parse(path).iter("skipped"):
            if skipped.get("type") == "pytest.xfail":
                continue  # an expected failure ran
            reasons[(skipped.get("message") or "no reason given").strip()] += 1
    return reasons


def summary(reasons: Counter) -> str:
    total = sum(reasons.values())
    if not total:
        return "test: every collected test ran (none skipped)"
    why = "; ".join(f"{count} {reason}" for reason, count in reasons.most_common())
    return f"test: {total} test{'s' * (total != 1)} could not run: {why}"


if __name__ == "__main__":
    print(summary(skip_reasons(sys.argv[1:])))

"""bin/test's last line: how many tests could not run and why, read from pytest's JUnit XML reports.

A skip is shown only in pytest's ``-ra`` summary, far above the end of a long run; this line says it last.
Usage: python -m tests.could_not_run REPORT.xml ...
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter


def skip_reasons(paths: list[str]) -> tuple[Counter, list[str]]:
    """Skipped tests per reason (pytest's message), and the reports that could not be read (a pytest that died)."""
    reasons: Counter = Counter()
    unread = []
    for path in paths:
        try:
            tree = ElementTree.parse(path)
        except (OSError, ElementTree.ParseError):
            unread.append(path)
            continue
        for skipped in tree.iter("skipped"):
            if skipped.get("type") == "pytest.xfail":
                continue  # an expected failure ran
            reasons[(skipped.get("message") or "no reason given").strip()] += 1
    return reasons, unread


def summary(reasons: Counter, unread: list[str]) -> str:
    total = sum(reasons.values())
    line = (f"test: {total} test{'s' * (total != 1)} could not run: "
            + "; ".join(f"{count} {reason}" for reason, count in reasons.most_common())
            if total else "test: every collected test ran (none skipped)")
    return line + (f" (no report from {', '.join(unread)}: that pytest did not finish)" if unread else "")


if __name__ == "__main__":
    print(summary(*skip_reasons(sys.argv[1:])))

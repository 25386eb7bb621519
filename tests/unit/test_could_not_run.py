"""bin/test's last line, from real pytest JUnit reports: skips counted by reason, expected failures not."""

from __future__ import annotations

import subprocess
import sys

from tests.could_not_run import skip_reasons, summary

SAMPLE = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no AITER git history: CDNA2_AITER_GIT is not set")
@pytest.mark.parametrize("tag", ["v0.1.19", "main"])
def test_needs_history(tag):
    pass

def test_skips_itself():
    pytest.skip("no GPU here")

@pytest.mark.xfail(reason="known gap", strict=True)
def test_known_gap():
    assert False
'''


def test_skips_are_counted_by_reason_and_a_missing_report_is_said(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sample.py"),
                    f"--junitxml={report}"], cwd=tmp_path, capture_output=True, check=True)
    reasons, unread = skip_reasons([str(report), str(tmp_path / "absent.xml")])
    assert reasons == {"no AITER git history: CDNA2_AITER_GIT is not set": 2, "no GPU here": 1}
    assert summary(reasons, unread) == (
        "test: 3 tests could not run: 2 no AITER git history: CDNA2_AITER_GIT is not set; 1 no GPU here "
        f"(no report from {tmp_path / 'absent.xml'}: that pytest did not finish)")
    assert summary(*skip_reasons([])) == "test: every collected test ran (none skipped)"

"""The bench report: per host figures, the cluster summary, the outlier rule, and the picture for 16 hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from cdna2.bench import load_cases
from cdna2.reports.bench import BenchReport

CASES = load_cases()["cases"]


def ok(case: dict, asm_ms: float, fallback_ms: float, figure: float) -> dict:
    timing = {"median_ms": asm_ms, "min_ms": asm_ms, "max_ms": asm_ms, "runs": 20, "spread_pct": 0.0}
    return {"case": case["name"], "kind": case["kind"], "status": "ok", "detail": "", "speedup": fallback_ms / asm_ms,
            "figure": figure, "unit": "GB/s" if case["kind"] == "decode" else "TFLOP/s", "asm": timing,
            "fallback": dict(timing, median_ms=fallback_ms), "loaded": ["/s/aiter_meta/hsa/gfx90a/x.co"]}


def fleet(hosts: int = 16) -> BenchReport:
    """``hosts`` MI210s within 3% of each other, but mi210-07 20% slow on decode_128x1024 and mi210-11 with a
    wrong prefill_4x1024; one gfx942 host skipped."""
    report = BenchReport(inventory="inventory/cluster.py", budget_seconds=120, cases=CASES)
    for index in range(hosts):
        name = f"mi210-{index:02d}"
        results = []
        for case in CASES:
            spread = 1 + 0.01 * (index % 4)
            factor = 0.8 if (name, case["name"]) == ("mi210-07", "decode_128x1024") else 1.0
            results.append(ok(case, 1.0 * spread / factor, 1.7, 100.0 * factor / spread))
        if name == "mi210-11":
            results[0] = {"case": CASES[0]["name"], "kind": "prefill", "status": "wrong",
                          "detail": "WRONG: prefill differs from the reference"}
        report.add(name, {"cases": results, "device": {"name": "AMD Instinct MI210"}, "elapsed_s": 95.0})
    report.skip("mi300x-a", "not a gfx90a host (the probe saw gfx942)")
    return report


def test_the_summary_gives_median_and_worst_host_per_case() -> None:
    summary = {row["case"]: row for row in fleet().summary()}
    decode = summary["decode_128x1024"]
    assert decode["hosts"] == 16 and decode["worst_host"] == "mi210-07"
    assert decode["worst_speedup"] == pytest.approx(1.7 * 0.8 / 1.03)  # index 7: 3% spread too
    assert summary["prefill_4x1024"]["hosts"] == 15, "a WRONG result is not a figure"
    assert summary["prefill_4x1024"]["statuses"] == {"ok": 15, "wrong": 1, "skipped": 1}


def test_a_host_more_than_15_percent_below_the_fleet_median_is_named_with_the_case() -> None:
    outliers = fleet().outliers()
    assert [(entry["host"], entry["case"]) for entry in outliers] == [("mi210-07", "decode_128x1024")]
    assert outliers[0]["below_pct"] == pytest.approx(21, abs=1.5)  # 0.8 / 1.03 of 100 against a median near 98.5
    markdown = fleet().to_markdown(None)
    assert f"- mi210-07: decode_128x1024 77.7 GB/s, {outliers[0]['below_pct']:.0f}% below the median " in markdown


def test_a_host_14_percent_below_is_not_named() -> None:
    report = BenchReport(inventory="i", budget_seconds=120, cases=CASES[:1])
    for index, figure in enumerate([100, 100, 100, 86]):
        report.add(f"h{index}", {"cases": [ok(CASES[0], 1, 2, figure)], "device": None, "elapsed_s": 1})
    assert report.outliers() == []


def test_wrong_results_and_skips_are_named_per_host() -> None:
    markdown = fleet().to_markdown(None)
    assert "- mi210-11 prefill_4x1024: wrong: WRONG: prefill differs from the reference" in markdown
    assert "| prefill_4x1024 | WRONG | - | - | - | - |" in fleet().to_markdown(None, per_host=True)
    assert "| prefill_4x1024 | WRONG |" not in markdown, "hosts' own tables are in the per-host file"
    assert ("Skipped: " + ", ".join(case["name"] for case in CASES) +
            ": not a gfx90a host (the probe saw gfx942)") in markdown
    assert "**17 hosts: 15 benchmarked, 1 skipped, 1 failed**" in markdown
    assert "| 1006 GB/s, 1.70x |" in markdown and "| 4.36x |" in markdown, "the MI210 reference beside each case"


def test_the_picture_for_16_hosts_is_written_linked_and_of_the_size_it_says(tmp_path: Path) -> None:
    json_path, markdown_path = fleet().write(tmp_path)
    written = json.loads(json_path.read_text())
    picture = written["picture"]
    assert picture["path"].endswith("-speedup.png")
    assert f"![per-case speedup over the hosts]({picture['path']})" in markdown_path.read_text()
    with Image.open(tmp_path / picture["path"]) as image:
        image.load()
        assert image.format == "PNG"
        assert image.size == (picture["width"], picture["height"])
    # 2 panels across of 6 in at 100 dpi; a row of panels 2.6 in high per 2 cases, whatever the number of hosts
    assert (picture["width"], picture["height"]) == (1200, round(len(CASES) // 2 * 2.6 * 100))
    assert (tmp_path / "bench-latest.md").read_text() == markdown_path.read_text()
    per_host = (tmp_path / "bench-latest-hosts.md").read_text()
    assert f"Every host's figures, one table each: {json_path.stem}-hosts.md" in markdown_path.read_text()
    assert per_host.count("\n### mi210-") == 16 and "| decode_128x1024 | ok | 1.287 ms (spread 0%) | 1.700 ms (spread 0%) | 1.32x |" in per_host
    assert written["outliers"][0]["host"] == "mi210-07"


def test_no_picture_when_no_host_has_a_figure(tmp_path: Path) -> None:
    report = BenchReport(inventory="i", budget_seconds=120, cases=CASES)
    report.skip("a", "the probe found no GPU")
    json_path, markdown_path = report.write(tmp_path)
    assert json.loads(json_path.read_text())["picture"] is None
    assert "No picture: no host has a figure for any case." in markdown_path.read_text()
    assert not list(tmp_path.glob("*.png"))


def test_a_host_over_the_budget_is_named() -> None:
    report = BenchReport(inventory="i", budget_seconds=120, cases=CASES[:1])
    report.add("slow-host", {"cases": [ok(CASES[0], 1, 2, 100)], "device": None, "elapsed_s": 180.0})
    assert report.over_budget() == ["slow-host"]
    assert "- slow-host: 180 s" in report.to_markdown(None)

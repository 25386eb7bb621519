"""The bench report of a generated 1,000-node fleet (seeded): as long as 10 nodes' when they agree, every slow,
wrong, broken or skipped node named, the counts per case adding up to 1,000, the JSON with every node, and a
picture of the same size for 10 and 1,000 nodes with the outliers named in it."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from PIL import Image

from cdna2.bench import load_cases
from cdna2.reports.bench import BenchReport
from tests.unit.reports.test_run_report_at_scale import expand

CASES = load_cases()["cases"]


def result(case: dict, figure: float) -> dict:
    """A measured case: ``figure`` in the case's unit, the fallback at 60 of it."""
    asm_ms, fallback_ms = 100.0 / figure, 100.0 / 60.0
    timing = {"median_ms": asm_ms, "min_ms": asm_ms, "max_ms": asm_ms, "runs": 20, "spread_pct": 1.0}
    return {"case": case["name"], "kind": case["kind"], "status": "ok", "detail": "", "speedup": fallback_ms / asm_ms,
            "figure": figure, "unit": "GB/s" if case["kind"] == "decode" else "TFLOP/s", "asm": timing,
            "fallback": dict(timing, median_ms=fallback_ms), "loaded": ["/s/aiter_meta/hsa/gfx90a/x.co"]}


def fleet(nodes: int, differing: bool, seed: int = 36) -> tuple[BenchReport, dict]:
    """``nodes`` MI210 nodes within about 1% of each other; with ``differing``, seeded picks of nodes 20-40% slow
    on one case, WRONG on one, on the fallback for one, over budget, that failed before benchmarking, or gfx942."""
    rng = random.Random(seed)
    names = [f"nid{index:04d}" for index in range(1, nodes + 1)]
    picked = rng.sample(names, 40) if differing else []
    slow = {host: rng.choice(CASES)["name"] for host in picked[:10]}
    kinds = {"slow": slow, "wrong": set(picked[10:14]), "fallback": set(picked[14:16]), "over": set(picked[16:19]),
             "failed": set(picked[19:21]), "skipped": set(picked[21:40])}
    report = BenchReport(inventory="inventory/slurm.py", budget_seconds=120, cases=CASES)
    for name in names:
        if name in kinds["failed"]:
            report.fail(name, "srun: error: Unable to create step for job 4242: Node down")
            continue
        if name in kinds["skipped"]:
            report.skip(name, "not a gfx90a host (the probe saw gfx942)")
            continue
        results = [result(case, 100.0 * (1 + rng.gauss(0, 0.01)) *
                          (1 - rng.uniform(0.2, 0.4) if slow.get(name) == case["name"] else 1)) for case in CASES]
        if name in kinds["wrong"]:
            results[0] = {"case": CASES[0]["name"], "kind": CASES[0]["kind"], "status": "wrong",
                          "detail": "WRONG: prefill differs from the reference"}
        if name in kinds["fallback"]:
            results[3] = dict(results[3], status="fallback", measured=results[3]["asm"],
                              detail="the ASM kernel was not loaded: Triton ran it")
        report.add(name, {"cases": results, "device": {"name": "AMD Instinct MI210"},
                          "elapsed_s": 180.0 if name in kinds["over"] else 95.0})
    return report, kinds


def named_hosts(markdown: str) -> set[str]:
    return {name for hostlist in re.findall(r"nid[\[\]0-9,-]*", markdown) for name in expand(hostlist)}


def test_agreeing_nodes_read_as_briefly_at_1000_as_at_10() -> None:
    texts = {nodes: fleet(nodes, differing=False)[0].to_markdown(None, hosts_file="x-hosts.md") for nodes in (10, 1000)}
    assert len(texts[10].splitlines()) == len(texts[1000].splitlines()), texts[1000]
    assert abs(len(texts[1000]) - len(texts[10])) < 400, texts[1000]  # hosts measured and worst hosts' names
    assert "## Hosts more than 15% below the fleet median\n\nNone." in texts[1000]


def test_every_node_that_differs_is_named_and_the_counts_add_up() -> None:
    report, kinds = fleet(1000, differing=True)
    markdown = report.to_markdown(None, hosts_file="x-hosts.md")
    assert len(markdown.splitlines()) < 90 and len(markdown) < 12000, markdown
    below = markdown.partition("## Hosts more than 15% below the fleet median")[2].partition("\n## ")[0]
    outliers = {(entry["host"], entry["case"]) for entry in report.outliers()}
    assert outliers == set(kinds["slow"].items()), "every slowed node and case, and nothing else"
    for host, case in outliers:
        assert f"- {host}: {case} " in below
    problems = markdown.partition("## Wrong, fallback, crashed, hung or failed")[2].partition("\n## ")[0]
    assert named_hosts(problems) == kinds["wrong"] | kinds["fallback"]
    assert named_hosts(markdown.partition("s budget")[2].partition("\n## ")[0]) == kinds["over"]
    not_run = markdown.partition("## Hosts not benchmarked")[2]
    assert named_hosts(not_run) == kinds["failed"] | kinds["skipped"]
    assert re.search(r"### nid\S+ \(19\): skipped\n\nSkipped: .*: not a gfx90a host", not_run)
    # Counts: per case the statuses add up to the 1,000 nodes; so do the hosts in the headline.
    for row in report.summary():
        assert sum(row["statuses"].values()) == 1000, row
    assert report.headline() == "1000 hosts: 975 benchmarked, 19 skipped, 6 failed", "a WRONG case fails its host"
    assert next(row for row in report.summary() if row["case"] == CASES[0]["name"])["statuses"] == \
        {"ok": 975, "wrong": 4, "skipped": 19, "failed": 2}


def test_the_json_keeps_every_node_and_the_picture_names_the_outliers(tmp_path: Path) -> None:
    report, kinds = fleet(1000, differing=True)
    json_path, markdown_path = report.write(tmp_path)
    written = json.loads(json_path.read_text())
    assert [entry["host"] for entry in written["hosts"]] == [f"nid{index:04d}" for index in range(1, 1001)]
    assert all(len(entry["cases"]) == len(CASES) for entry in written["hosts"])
    assert {(entry["host"], entry["case"]) for entry in written["outliers"]} == set(kinds["slow"].items())
    per_host = (tmp_path / "bench-latest-hosts.md").read_text()
    assert per_host.count("\n### nid") == 1000
    # The picture: the same size as 10 nodes' (a box and dots per case, not a bar per node), every outlier named.
    small = fleet(10, differing=False)[0].picture()
    with Image.open(tmp_path / written["picture"]["path"]) as image:
        image.load()
        assert image.format == "PNG" and image.size == (written["picture"]["width"], written["picture"]["height"])
        assert image.size == small[1:], "the picture's size does not grow with the nodes"
    figure = report.figure()
    for ax in figure.axes:
        case = ax.get_title().partition(":")[0]
        labels = {text.get_text() for text in ax.texts}
        assert labels == {host for host, slow_case in kinds["slow"].items() if slow_case == case}, case
    titles = {ax.get_title().partition(":")[0]: ax.get_title() for ax in figure.axes}
    assert titles[CASES[0]["name"]] == f"{CASES[0]['name']}: 975 hosts; 2 failed, 19 skipped, 4 WRONG"


def test_the_bench_report_and_the_run_report_of_the_same_run_keep_their_own_files(tmp_path: Path) -> None:
    from cdna2.reports.run import RunReport

    bench, _ = fleet(3, differing=False)
    run = RunReport(mode="bench", inventory="inventory/slurm.py", started=bench.started)
    for host in bench.hosts:
        run.step(host, "bench", "ok")
    bench_paths, run_paths = bench.write(tmp_path), run.write(tmp_path)
    assert not set(bench_paths) & set(run_paths)
    assert bench_paths[1].read_text().startswith("# bench report") and "## Cluster summary" in bench_paths[1].read_text()
    assert run_paths[1].read_text().startswith("# bench report") and "| bench |" in run_paths[1].read_text()
    assert json.loads(bench_paths[0].read_text())["picture"]["path"].startswith("bench-figures-")

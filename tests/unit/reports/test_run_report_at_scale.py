"""The run report of a generated 1,000-node allocation (seeded): as short as 10 nodes' when they agree, every node
that differs named, the counts adding up to 1,000, the JSON with every node; and the host list form it names them
in, read back by the test's own reading of Slurm's syntax."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from cdna2.reports.groups import hosts_label
from cdna2.reports.hostlist import compress
from cdna2.reports.run import CHANGED, FAILED, SKIPPED, UNCHANGED, RunReport
from cdna2.slurm.steps import steps_summary

STEPS = ("wheels", "kernels", "patches amd-aiter", "smoke")
PACKAGES = {"amd-aiter": "0.1.7.post2.dev18", "torch": "2.9.1+rocm6.4", "triton": "3.7.0 -> 3.7.1", "vllm": None}
SHARED = {"identity": "f00d" * 16, "prefix": "/scratch/project/venv", "writer": "nid0001"}
# A host list as Slurm reads it: name[1-3,7]suffix, parts joined by commas (zero padding kept).
HOSTLIST_PART = re.compile(r"([A-Za-z0-9-]*)\[([0-9,-]+)\]([A-Za-z0-9-]*)|([A-Za-z0-9-]+)")


def expand(hostlist: str) -> list[str]:
    """The test's own reading of a Slurm host list (independent of cdna2/reports/hostlist.py, which only writes)."""
    names = []
    for prefix, ranges, suffix, plain in HOSTLIST_PART.findall(hostlist):
        if plain:
            names.append(plain)
            continue
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            names += [f"{prefix}{str(value).zfill(len(low))}{suffix}" for value in range(int(low), int(high or low) + 1)]
    return names


def allocation(mode: str, nodes: int, differing: bool, seed: int = 36) -> tuple[RunReport, dict[str, set[str]]]:
    """``nodes`` gfx90a nodes nid0001.. all provisioned, in one shared environment written by nid0001 (verify: as
    deployed, the report has no roles); with ``differing``, seeded picks of nodes that did not connect, are gfx942 (left alone), run
    another ROCm, (deploy) failed their smoke test or (verify) drifted, each kind returned by name."""
    rng = random.Random(seed)
    names = [f"nid{index:04d}" for index in range(1, nodes + 1)]
    picked = rng.sample(names[1:], 26) if differing else []
    kinds = {"unreachable": set(picked[:3]), "gfx942": set(picked[3:8]), "rocm": set(picked[8:14]),
             "smoke": set(picked[14:20]) if mode == "deploy" else set(),
             "drift": set(picked[20:26]) if mode == "verify" else set()}
    report = RunReport(mode=mode, inventory="inventory/slurm.py")
    for name in names:
        row = report.host(name)
        if name in kinds["unreachable"]:
            row.connected = False
            row.errors.append("could not connect: srun: error: Unable to create step for job 4242: Node down")
            continue
        row.arch = "gfx942" if name in kinds["gfx942"] else "gfx90a"
        row.rocm = "6.2.4" if name in kinds["rocm"] else "6.4.3"
        row.packages = dict(PACKAGES)
        if mode == "verify":
            drifted = name in kinds["drift"]
            report.step(name, "verify", FAILED if drifted else "ok",
                        f"triton 3.7.0 replaced 3.7.1 (drift on {name}'s node-local cache)" if drifted else
                        "as deployed")
        elif name in kinds["gfx942"]:
            row.left_alone = "GPU arch gfx942: AITER has native kernels for it"
            for step in STEPS:
                report.step(name, step, SKIPPED, row.left_alone)
        else:
            row.details["shared_environment"] = dict(SHARED, role="writer" if name == "nid0001" else "checker")
            for step in STEPS[:-1]:
                report.step(name, step, CHANGED if name == "nid0001" else "by writer", "")
            report.step(name, "smoke", FAILED if name in kinds["smoke"] else "ok",
                        "GPU check: rocm_smi saw no gfx90a agent" if name in kinds["smoke"] else "")
    return report, kinds


@pytest.mark.parametrize("mode", ["deploy", "verify"])
def test_agreeing_nodes_read_as_briefly_at_1000_as_at_10(mode: str) -> None:
    texts = {nodes: allocation(mode, nodes, differing=False)[0].to_markdown(hosts_file="x-hosts.md")
             for nodes in (10, 100, 1000)}
    lines = {nodes: text.splitlines() for nodes, text in texts.items()}
    assert len(lines[10]) == len(lines[100]) == len(lines[1000]), texts[1000]
    # Only the counts and the host lists' numbers grow: nid[0001-0010] against nid[0001-1000], 10 against 1000.
    assert len(texts[1000]) - len(texts[10]) < 60, texts[1000]
    assert "nid[0001-1000] (1000)" in texts[1000] or "nid[0002-1000] (999)" in texts[1000]
    assert max(len(line) for line in lines[1000]) <= 120, max(lines[1000], key=len)


@pytest.mark.parametrize("mode", ["deploy", "verify"])
def test_every_node_that_differs_is_named_and_the_counts_add_up(mode: str) -> None:
    report, kinds = allocation(mode, 1000, differing=True)
    markdown = report.to_markdown()
    lines = markdown.splitlines()
    assert len(lines) < 80 and len(markdown) < 8000, markdown
    table = [line.split(" | ") for line in lines if line.startswith("| ") and not line.startswith("| hosts")]
    groups = [(expand(cells[0].lstrip("| ").removeprefix("all but ").partition(" (")[0]), cells) for cells in table]
    # The majority row first, named by the nodes it leaves out: those are exactly every node in another row.
    majority_names, majority = groups[0]
    others = {name for names, _ in groups[1:] for name in names}
    assert majority[0].startswith("| all but ") and set(majority_names) == others
    majority_size = int(re.search(r"\((\d+)\)$", majority[0]).group(1))
    assert majority_size + len(others) == 1000 and len(others) == sum(len(names) for names, _ in groups[1:])
    # In a deploy, the writer also differs: it changed what the others only checked.
    differing = set().union(*kinds.values()) | ({"nid0001"} if mode == "deploy" else set())
    assert others == differing, sorted(others ^ differing)
    for kind, expected in kinds.items():
        for name in expected:
            assert name in others, (kind, name)
    # The failures' details name their nodes, grouped by what they say.
    details = markdown.partition("## Hosts where something happened or failed")[2]
    named_in_details = {name for heading in re.findall(r"^### (.*): ", details, re.MULTILINE)
                        for name in expand(heading.removeprefix("all but ").partition(" (")[0])}
    failed = kinds["unreachable"] | kinds["smoke"] | kinds["drift"]
    assert failed <= named_in_details and f"### {compress(kinds['unreachable'])} (3): failed\n" in details
    # Counts: by status, by role, per step, each adds up to the 1,000 nodes.
    summary = report.summary()
    assert sum(summary["statuses"].values()) == 1000 and summary["statuses"][FAILED] == len(failed)
    assert summary["roles"] == ({"checker": 991, "writer": 1, "own environment": 8} if mode == "deploy" else
                                {"own environment": 1000})
    for step, counts in summary["steps"].items():
        assert sum(counts.values()) == 1000, (step, counts)
    assert f"- status: {1000 - len(failed)} ok, {len(failed)} failed" in lines
    # The shared environment names the nodes of it that did not verify it (their smoke test failed).
    if mode == "deploy":
        assert f"verified on 986 of its 992 hosts (not: {compress(kinds['smoke'])} (6))" in markdown


def test_the_json_keeps_every_node_and_the_hosts_file_one_row_each(tmp_path: Path) -> None:
    report, kinds = allocation("deploy", 1000, differing=True)
    json_path, markdown_path = report.write(tmp_path)
    written = json.loads(json_path.read_text())
    assert [row["host"] for row in written["hosts"]] == [f"nid{index:04d}" for index in range(1, 1001)]
    assert sorted(written["failed_hosts"]) == sorted(kinds["unreachable"] | kinds["smoke"])
    by_name = {row["host"]: row for row in written["hosts"]}
    assert all(by_name[name]["rocm"] == "6.2.4" for name in kinds["rocm"])
    assert all(by_name[name]["outcome"] == "left alone" for name in kinds["gfx942"])
    assert written["summary"]["hosts"] == 1000 and written["summary"]["transport"] is None
    per_host = [line for line in (tmp_path / "latest-hosts.md").read_text().splitlines() if line.startswith("| nid")]
    assert len(per_host) == 1000 and per_host[0].startswith("| nid0001 | ok | gfx90a | 6.4.3 |")


def test_the_transport_line_is_in_the_summary_when_the_transport_sets_it() -> None:
    report, _ = allocation("verify", 4, differing=False)
    report.transport = steps_summary({"steps": 2, "fanout_steps": 1, "fanout_nodes": 4, "node_steps": 1,
                                      "latencies_s": [0.08, 0.3]})
    line = "Slurm job steps: 2 (1 across nodes, for 4 node runs; 1 on one node); median step 300 ms"
    assert f"\n- transport: {line}\n" in report.to_markdown()
    assert report.to_json()["summary"]["transport"] == line
    assert report.to_json()["transport"]["steps"] == 2


def test_host_lists_are_written_as_slurm_reads_them() -> None:
    assert compress(["nid001", "nid002", "nid003", "nid007", "login1"]) == "login1,nid[001-003,007]"
    assert compress(["nid001007", "nid001011", "nid001012"]) == "nid[001007,001011-001012]"
    assert compress([f"nid{index}" for index in range(1, 13)]) == "nid[1-12]"
    assert compress([f"nid{index:03d}" for index in range(1, 101)]) == "nid[001-100]"
    assert compress(["mi210-a", "mi210-b", "gpu1-ib", "gpu2-ib"]) == "gpu[1-2]-ib,mi210-a,mi210-b"
    rng = random.Random(36)
    for _ in range(200):
        names = rng.sample([f"x{index:02d}" for index in range(100)] + [f"y{index}" for index in range(1, 30)] +
                           ["login", "a7b", "a8b"], rng.randint(1, 60))
        assert sorted(expand(compress(names))) == sorted(names), compress(names)


def test_a_long_majority_is_named_by_the_nodes_it_leaves_out() -> None:
    everyone = [f"nid{index:04d}" for index in range(1, 1001)]
    rest = sorted(random.Random(36).sample(everyone, 40))
    majority = sorted(set(everyone) - set(rest))
    assert hosts_label(majority, everyone) == f"all but {compress(rest)} (960)"
    assert hosts_label(everyone[:600], everyone) == "nid[0001-0600] (600)", "short enough to be written out"
    assert hosts_label(["nid0007"], everyone) == "nid0007"

"""The bench report: a cluster summary per case, the hosts that differ named (slow, wrong, broken, not run), a
picture, and per host the figures and speedups.

Written as ``bench-figures-<time>.md``, ``-hosts.md`` (every host's table), ``.json`` and ``-speedup.png`` (plus
``bench-latest.md``, ``-hosts.md`` and ``.json``) under the report directory, each atomically: not
``bench-<time>``, which is the run report of the same bench.py run (cdna2/reports/run.py), written in the same
second. The picture is drawn by matplotlib (pinned in requirements.txt): per case, the distribution of the
hosts' speedups over the fallback, the outliers named, the fleet median and the MI210 reference.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import struct
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cdna2.host.bench import FALLBACK, OK, PROBLEMS, SKIPPED
from cdna2.host.state import write_file_atomically
from cdna2.reports.groups import group_hosts, hosts_label

REPORT_FORMAT = 1
# A host whose ASM figure for a case is more than this fraction below the fleet median for it is named.
OUTLIER_FRACTION = 0.15
PICTURE_DPI = 100
# A panel per case, two across, of a size that does not depend on the number of hosts; at most this many outliers
# are named in a panel (the report names them all).
PANEL_WIDTH_IN, PANEL_HEIGHT_IN, NAMED_PER_CASE = 6.0, 2.6, 8


class BenchReport:
    """Bench results of one run, by host; hosts sorted by name in everything written."""

    def __init__(self, inventory: str, budget_seconds: float, cases: list[dict], started: datetime | None = None):
        self.inventory = inventory
        self.budget_seconds = budget_seconds
        self.cases = cases
        self.started = started or datetime.now(timezone.utc)
        self.hosts: dict[str, dict[str, Any]] = {}

    # --- filling --------------------------------------------------------------------------------------------------

    def skip(self, host: str, reason: str, runtime: dict | None = None) -> None:
        """Every case of ``host`` skipped, with why; ``runtime``: the image's runtime that ran its smoke test."""
        self.hosts[host] = {"status": SKIPPED, "reason": reason, "device": None, "elapsed_s": None, "runtime": runtime,
                            "cases": [{"case": case["name"], "kind": case["kind"], "status": SKIPPED,
                                       "detail": f"skipped: {reason}"} for case in self.cases]}

    def fail(self, host: str, reason: str, runtime: dict | None = None) -> None:
        """``host`` could not be benchmarked at all (no report from it)."""
        self.hosts[host] = {"status": "failed", "reason": reason, "device": None, "elapsed_s": None, "runtime": runtime,
                            "cases": [{"case": case["name"], "kind": case["kind"], "status": "failed",
                                       "detail": reason} for case in self.cases]}

    def add(self, host: str, result: dict, runtime: dict | None = None) -> None:
        """The on-host runner's report for ``host`` (``cdna2.host.bench.run_bench``); ``runtime``: the image's
        Singularity/Apptainer that ran it (``cdna2.images.runtime.Launch.report``), None on the host itself."""
        statuses = {case["status"] for case in result["cases"]}
        status = "failed" if statuses & set(PROBLEMS) else (SKIPPED if statuses == {SKIPPED} else "benchmarked")
        self.hosts[host] = {"status": status, "reason": None, "device": result.get("device"),
                            "elapsed_s": result.get("elapsed_s"), "runtime": runtime, "cases": result["cases"]}

    # --- reading --------------------------------------------------------------------------------------------------

    def sorted_hosts(self) -> list[tuple[str, dict]]:
        return sorted(self.hosts.items())

    def results(self, case: str) -> dict[str, dict]:
        """Each host's result for ``case``, by host."""
        return {host: result for host, entry in self.sorted_hosts() for result in entry["cases"]
                if result["case"] == case}

    def summary(self) -> list[dict]:
        """Per case: hosts with figures, the median figure and speedup, the worst host, and the count per status."""
        rows = []
        for case in self.cases:
            results = self.results(case["name"])
            measured = {host: result for host, result in results.items() if result["status"] == OK}
            row: dict[str, Any] = {"case": case["name"], "hosts": len(measured), "mi210": case.get("mi210"),
                                   "statuses": dict(Counter(result["status"] for result in results.values()))}
            if measured:
                worst = min(measured, key=lambda host: (measured[host]["speedup"], host))
                row.update(unit=next(iter(measured.values()))["unit"],
                           median_figure=statistics.median(result["figure"] for result in measured.values()),
                           median_speedup=statistics.median(result["speedup"] for result in measured.values()),
                           worst_host=worst, worst_speedup=measured[worst]["speedup"],
                           worst_figure=measured[worst]["figure"],
                           min_speedup=min(result["speedup"] for result in measured.values()),
                           max_speedup=max(result["speedup"] for result in measured.values()))
            rows.append(row)
        return rows

    def outliers(self) -> list[dict]:
        """Hosts whose ASM figure for a case is more than OUTLIER_FRACTION below the fleet median for it."""
        found = []
        for row in self.summary():
            if not row["hosts"]:
                continue
            for host, result in self.results(row["case"]).items():
                if result["status"] == OK and result["figure"] < (1 - OUTLIER_FRACTION) * row["median_figure"]:
                    found.append({"host": host, "case": row["case"], "figure": result["figure"], "unit": row["unit"],
                                  "median_figure": row["median_figure"],
                                  "below_pct": (1 - result["figure"] / row["median_figure"]) * 100.0})
        return sorted(found, key=lambda entry: (entry["host"], entry["case"]))

    def problems(self) -> list[dict]:
        """Cases that are wrong, crashed, hung or failed, or computed by a fallback, by host."""
        return [{"host": host, **result} for host, entry in self.sorted_hosts() for result in entry["cases"]
                if result["status"] in (*PROBLEMS, FALLBACK)]

    def over_budget(self) -> list[str]:
        return [host for host, entry in self.sorted_hosts()
                if entry["elapsed_s"] is not None and entry["elapsed_s"] > self.budget_seconds]

    def headline(self) -> str:
        counts = Counter(entry["status"] for entry in self.hosts.values())
        parts = [f"{counts.get(status, 0)} {status}" for status in ("benchmarked", SKIPPED, "failed")]
        return f"{len(self.hosts)} host{'' if len(self.hosts) == 1 else 's'}: {', '.join(parts)}"

    # --- writing --------------------------------------------------------------------------------------------------

    def to_json(self, picture: dict | None) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, "inventory": self.inventory,
                "started": self.started.isoformat(timespec="seconds"), "headline": self.headline(),
                "budget_seconds": self.budget_seconds, "outlier_fraction": OUTLIER_FRACTION,
                "cases": [{key: case.get(key) for key in ("name", "kind", "what", "fallback", "mi210")}
                          for case in self.cases],
                "hosts": [{"host": host, **entry} for host, entry in self.sorted_hosts()],
                "summary": self.summary(), "outliers": self.outliers(),
                "problems": [{key: problem[key] for key in ("host", "case", "status", "detail")}
                             for problem in self.problems()],
                "over_budget": self.over_budget(), "picture": picture}

    def to_markdown(self, picture: dict | None, per_host: bool = False, hosts_file: str | None = None) -> str:
        """The fleet at any size: the headline, the picture, per case the median and the worst host, then only the
        hosts that differ (below the fleet median, wrong or broken cases, over budget, not benchmarked), each
        group of hosts named once. ``per_host``: every host's figures, one table each; ``hosts_file``: the file
        that has them."""
        everyone = [host for host, _ in self.sorted_hosts()]
        lines = [f"# bench report: {self.inventory}, {self.started.isoformat(timespec='seconds')}", "",
                 f"**{self.headline()}**", ""]
        if hosts_file:
            lines += [f"Every host's figures, one table each: {hosts_file}", ""]
        if picture:
            lines += [f"![per-case speedup over the hosts]({picture['path']})", "",
                      f"Per case, the hosts' speedups over the fallback as a box and one dot per host, the hosts "
                      f"more than {OUTLIER_FRACTION:.0%} below the fleet median in red and named "
                      f"([{picture['path']}]({picture['path']}), {picture['width']}x{picture['height']} px).", ""]
        else:
            lines += ["No picture: no host has a figure for any case.", ""]
        lines += ["## Cluster summary", "",
                  "| case | hosts measured | median ASM | median speedup | speedups | worst host (speedup) | "
                  "MI210 reference |", "|---|---|---|---|---|---|---|"]
        for row in self.summary():
            reference = _reference(row["mi210"])
            if row["hosts"]:
                cells = [row["case"], str(row["hosts"]), f"{row['median_figure']:.1f} {row['unit']}",
                         f"{row['median_speedup']:.2f}x", f"{row['min_speedup']:.2f}-{row['max_speedup']:.2f}x",
                         f"{row['worst_host']} ({row['worst_speedup']:.2f}x)", reference]
            else:
                statuses = ", ".join(f"{count} {status}" for status, count in sorted(row["statuses"].items()))
                cells = [row["case"], "0", "-", "-", "-", statuses or "-", reference]
            lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
        outliers = self.outliers()
        lines += ["", f"## Hosts more than {OUTLIER_FRACTION:.0%} below the fleet median", ""]
        lines += [f"- {entry['host']}: {entry['case']} {entry['figure']:.1f} {entry['unit']}, "
                  f"{entry['below_pct']:.0f}% below the median {entry['median_figure']:.1f}"
                  for entry in outliers] or ["None."]
        # The same case failing the same way on many hosts is one line, with its hosts; a host that failed as a whole
        # is named once, under the hosts not benchmarked.
        problems = group_hosts((problem["host"], (problem["case"], problem["status"], problem["detail"]))
                               for problem in self.problems() if not self.hosts[problem["host"]]["reason"])
        if problems:
            lines += ["", "## Wrong, fallback, crashed, hung or failed", ""]
            lines += [f"- {hosts_label(hosts, everyone)} {case}: {status}: {detail}"
                      for (case, status, detail), hosts in problems]
        if over := self.over_budget():
            took = sorted(self.hosts[host]["elapsed_s"] for host in over)
            lines += ["", f"## Over the {self.budget_seconds:g} s budget", "",
                      f"- {hosts_label(over, everyone)}: " +
                      (f"{took[0]:.0f} s" if took[0] == took[-1] else f"{took[0]:.0f}-{took[-1]:.0f} s")]
        inside = group_hosts((host, tuple(sorted(entry["runtime"].items()))) for host, entry in self.sorted_hosts()
                             if entry.get("runtime"))
        if inside:
            lines += ["", "## Run inside an image's runtime", ""]
            lines += [f"- {hosts_label(hosts, everyone)}: {runtime['version']} ({runtime['runtime']}), "
                      f"{runtime['image']} (SHA-256 {runtime['image_sha256']}) with {runtime['layer']} (SHA-256 "
                      f"{runtime['layer_sha256']})" for runtime, hosts in ((dict(key), hosts) for key, hosts in inside)]
        # Hosts not benchmarked, grouped by why; per host, every host's own table.
        keyed = [(host, (entry["status"], entry["reason"])) for host, entry in self.sorted_hosts()
                 if entry["reason"] or per_host]
        sections = [(key, [host]) for host, key in keyed] if per_host else group_hosts(keyed)
        if sections:
            lines += ["", "## Per host" if per_host else "## Hosts not benchmarked"]
        names = ", ".join(case["name"] for case in self.cases)
        for (status, reason), hosts in sections:
            if reason:
                lines += ["", f"### {hosts_label(hosts, everyone)}: {status}", "", f"{status.capitalize()}: {names}: "
                                                                                   f"{reason}"]
                continue
            entry = self.hosts[hosts[0]]
            device = entry["device"] or {}
            took = f", {entry['elapsed_s']:.0f} s" if entry["elapsed_s"] is not None else ""
            lines += ["", f"### {hosts[0]}: {entry['status']} ({device.get('name') or 'no device'}{took})", "",
                      "| case | status | ASM | fallback | speedup | figure | detail |", "|---|---|---|---|---|---|---|"]
            for result in entry["cases"]:
                lines.append("| " + " | ".join(_escape(cell) for cell in _host_cells(result)) + " |")
        return "\n".join(lines) + "\n"

    def figure(self):
        """The picture as a matplotlib Figure, of a size that does not depend on the number of hosts: per case a
        box of the hosts' speedups over the fallback, one dot per host, the fleet median, the MI210 reference, the
        outliers in red with their names, and what the hosts without a figure were. None when no host has one."""
        cases = [row for row in self.summary() if row["hosts"]]
        if not cases:
            return None
        import matplotlib
        matplotlib.use("Agg")  # no display: files only
        from matplotlib.figure import Figure

        columns = min(2, len(cases))
        rows = math.ceil(len(cases) / columns)
        figure = Figure(figsize=(PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * rows), dpi=PICTURE_DPI,
                        layout="constrained")
        axes = figure.subplots(rows, columns, squeeze=False)
        outliers: dict[str, list[str]] = {}
        for entry in self.outliers():
            outliers.setdefault(entry["case"], []).append(entry["host"])
        for index, row in enumerate(cases):
            ax = axes[index // columns][index % columns]
            results = self.results(row["case"])
            measured = {host: result["speedup"] for host, result in results.items() if result["status"] == OK}
            named = sorted(outliers.get(row["case"], []), key=lambda host: measured[host])
            ax.boxplot(list(measured.values()), orientation="horizontal", positions=[0], widths=0.5,
                       showfliers=False, medianprops={"color": "tab:green"})
            # One dot per host, spread across the box's height by the golden ratio (the same picture every run).
            heights = [((position * 0.618034) % 1 - 0.5) * 0.6 for position in range(len(measured))]
            height_of = dict(zip(measured, heights))
            ax.scatter(list(measured.values()), heights, s=8, alpha=0.5, linewidths=0, color="tab:blue")
            ax.scatter([measured[host] for host in named], [height_of[host] for host in named], s=20,
                       color="tab:red", zorder=3)
            for rank, host in enumerate(named[:NAMED_PER_CASE]):
                ax.annotate(host, xy=(measured[host], height_of[host]),
                            xytext=(measured[host], 0.55 + 0.22 * rank), fontsize=6, color="tab:red",
                            arrowprops={"arrowstyle": "-", "color": "tab:red", "linewidth": 0.5})
            if len(named) > NAMED_PER_CASE:
                ax.text(0.99, 0.97, f"+{len(named) - NAMED_PER_CASE} more below the median: see the report",
                        transform=ax.transAxes, ha="right", va="top", fontsize=6, color="tab:red")
            ax.set_ylim(-0.5, 0.75 + 0.22 * min(len(named), NAMED_PER_CASE))
            ax.set_yticks([])
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.axvline(row["median_speedup"], color="tab:green", linestyle="--", linewidth=1,
                       label=f"fleet median {row['median_speedup']:.2f}x")
            reference = (row["mi210"] or {}).get("speedup")
            if reference:
                ax.axvline(reference, color="tab:orange", linestyle=":", linewidth=1.2,
                           label=f"MI210 reference {reference:.2f}x")
            others = ", ".join(f"{count} {'WRONG' if status == 'wrong' else status}"
                               for status, count in sorted(row["statuses"].items()) if status != OK)
            ax.set_title(f"{row['case']}: {len(measured)} hosts" + (f"; {others}" if others else ""), fontsize=8,
                         color="tab:red" if set(row["statuses"]) & {*PROBLEMS, FALLBACK} else "black")
            ax.set_xlabel(f"speedup over the fallback (red: ASM figure >{OUTLIER_FRACTION:.0%} below the fleet "
                          f"median)", fontsize=7)
            ax.legend(fontsize=6, loc="upper left")
        for index in range(len(cases), rows * columns):
            axes[index // columns][index % columns].set_visible(False)
        return figure

    def picture(self) -> tuple[bytes, int, int] | None:
        """The picture as PNG bytes and its size in pixels; None when no host has a figure."""
        figure = self.figure()
        if figure is None:
            return None
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PICTURE_DPI)
        data = buffer.getvalue()
        width, height = struct.unpack(">II", data[16:24])  # the PNG's IHDR: what any viewer will show
        return data, width, height

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``bench-figures-<time>.json``, ``.md``, ``-hosts.md`` (every host's figures), ``-speedup.png`` and
        ``bench-latest.json``/``.md``/``-hosts.md``, each atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"bench-figures-{self.started.strftime('%Y%m%dT%H%M%SZ')}"
        drawn = self.picture()
        picture = None
        if drawn:
            data, width, height = drawn
            picture = {"path": f"{stem}-speedup.png", "width": width, "height": height}
            write_file_atomically(directory / picture["path"], data)
        json_text = json.dumps(self.to_json(picture), indent=2, sort_keys=True) + "\n"
        markdown = self.to_markdown(picture, hosts_file=f"{stem}-hosts.md")
        per_host = self.to_markdown(picture, per_host=True)
        for name, text in ((f"{stem}.json", json_text), (f"{stem}.md", markdown), (f"{stem}-hosts.md", per_host),
                           ("bench-latest.json", json_text), ("bench-latest.md", markdown),
                           ("bench-latest-hosts.md", per_host)):
            write_file_atomically(directory / name, text.encode("utf-8"))
        return directory / f"{stem}.json", directory / f"{stem}.md"



def _reference(mi210: dict | None) -> str:
    if not mi210:
        return "-"
    parts = [f"{mi210['figure']:g} {mi210['unit']}"] if "figure" in mi210 else []
    parts += [f"{mi210['speedup']:.2f}x"] if "speedup" in mi210 else []
    return ", ".join(parts)


def _host_cells(result: dict) -> list[str]:
    if result["status"] == OK:
        return [result["case"], OK, _timing(result["asm"]), _timing(result["fallback"]), f"{result['speedup']:.2f}x",
                f"{result['figure']:.1f} {result['unit']}", ", ".join(result.get("loaded", []))]
    if result["status"] == FALLBACK:  # timed, but not the ASM kernel: no speedup is claimed for it
        return [result["case"], FALLBACK, f"(not ASM) {_timing(result['measured'])}", _timing(result["fallback"]),
                "-", "-", result["detail"]]
    return [result["case"], result["status"].upper() if result["status"] == "wrong" else result["status"],
            "-", "-", "-", "-", result["detail"]]


def _timing(timing: dict) -> str:
    spread = f" (spread {timing['spread_pct']:.0f}%)" if timing.get("spread_pct") is not None else ""
    return f"{timing['median_ms']:.3f} ms{spread}"


def _escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")

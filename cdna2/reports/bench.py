"""The bench report: per host the figures and speedups, a cluster summary, the slow hosts named, and a picture.

Written as ``bench-<time>.md``, ``bench-<time>.json`` and ``bench-<time>-speedup.png`` (plus ``bench-latest.md`` and
``bench-latest.json``) under the report directory, each atomically. The picture is drawn by matplotlib (pinned in
requirements.txt): per case, each host's speedup over the fallback, the fleet median and the MI210 reference.
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

REPORT_FORMAT = 1
# A host whose ASM figure for a case is more than this fraction below the fleet median for it is named.
OUTLIER_FRACTION = 0.15
PICTURE_DPI = 100
PANEL_WIDTH_IN, HOST_ROW_IN, PANEL_MARGIN_IN = 6.0, 0.24, 1.3


class BenchReport:
    """Bench results of one run, by host; hosts sorted by name in everything written."""

    def __init__(self, inventory: str, budget_seconds: float, cases: list[dict], started: datetime | None = None):
        self.inventory = inventory
        self.budget_seconds = budget_seconds
        self.cases = cases
        self.started = started or datetime.now(timezone.utc)
        self.hosts: dict[str, dict[str, Any]] = {}

    # --- filling --------------------------------------------------------------------------------------------------

    def skip(self, host: str, reason: str) -> None:
        """Every case of ``host`` skipped, with why."""
        self.hosts[host] = {"status": SKIPPED, "reason": reason, "device": None, "elapsed_s": None,
                            "cases": [{"case": case["name"], "kind": case["kind"], "status": SKIPPED,
                                       "detail": f"skipped: {reason}"} for case in self.cases]}

    def fail(self, host: str, reason: str) -> None:
        """``host`` could not be benchmarked at all (no report from it)."""
        self.hosts[host] = {"status": "failed", "reason": reason, "device": None, "elapsed_s": None,
                            "cases": [{"case": case["name"], "kind": case["kind"], "status": "failed",
                                       "detail": reason} for case in self.cases]}

    def add(self, host: str, result: dict) -> None:
        """The on-host runner's report for ``host`` (``cdna2.host.bench.run_bench``)."""
        statuses = {case["status"] for case in result["cases"]}
        status = "failed" if statuses & set(PROBLEMS) else (SKIPPED if statuses == {SKIPPED} else "benchmarked")
        self.hosts[host] = {"status": status, "reason": None, "device": result.get("device"),
                            "elapsed_s": result.get("elapsed_s"), "cases": result["cases"]}

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
                           worst_figure=measured[worst]["figure"])
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

    def to_markdown(self, picture: dict | None) -> str:
        lines = [f"# bench report: {self.inventory}, {self.started.isoformat(timespec='seconds')}", "",
                 f"**{self.headline()}**", ""]
        if picture:
            lines += [f"![per-case speedup by host]({picture['path']})", "",
                      f"Per case, each host's speedup over the fallback ([{picture['path']}]({picture['path']}), "
                      f"{picture['width']}x{picture['height']} px).", ""]
        else:
            lines += ["No picture: no host has a figure for any case.", ""]
        lines += ["## Cluster summary", "",
                  "| case | hosts measured | median ASM | median speedup | worst host (speedup) | MI210 reference |",
                  "|---|---|---|---|---|---|"]
        for row in self.summary():
            reference = _reference(row["mi210"])
            if row["hosts"]:
                cells = [row["case"], str(row["hosts"]), f"{row['median_figure']:.1f} {row['unit']}",
                         f"{row['median_speedup']:.2f}x", f"{row['worst_host']} ({row['worst_speedup']:.2f}x)",
                         reference]
            else:
                statuses = ", ".join(f"{count} {status}" for status, count in sorted(row["statuses"].items()))
                cells = [row["case"], "0", "-", "-", statuses or "-", reference]
            lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
        outliers = self.outliers()
        lines += ["", f"## Hosts more than {OUTLIER_FRACTION:.0%} below the fleet median", ""]
        lines += [f"- {entry['host']}: {entry['case']} {entry['figure']:.1f} {entry['unit']}, "
                  f"{entry['below_pct']:.0f}% below the median {entry['median_figure']:.1f}"
                  for entry in outliers] or ["None."]
        problems = self.problems()
        if problems:
            lines += ["", "## Wrong, fallback, crashed, hung or failed", ""]
            lines += [f"- {problem['host']} {problem['case']}: {problem['status']}: {problem['detail']}"
                      for problem in problems]
        if self.over_budget():
            lines += ["", f"## Over the {self.budget_seconds:g} s budget", ""]
            lines += [f"- {host}: {self.hosts[host]['elapsed_s']:.0f} s" for host in self.over_budget()]
        lines += ["", "## Per host"]
        for host, entry in self.sorted_hosts():
            if entry["reason"]:
                names = ", ".join(result["case"] for result in entry["cases"])
                lines += ["", f"### {host}: {entry['status']}", "",
                          f"{entry['status'].capitalize()}: {names}: {entry['reason']}"]
                continue
            device = entry["device"] or {}
            took = f", {entry['elapsed_s']:.0f} s" if entry["elapsed_s"] is not None else ""
            lines += ["", f"### {host}: {entry['status']} ({device.get('name') or 'no device'}{took})", "",
                      "| case | status | ASM | fallback | speedup | figure | detail |", "|---|---|---|---|---|---|---|"]
            for result in entry["cases"]:
                lines.append("| " + " | ".join(_escape(cell) for cell in _host_cells(result)) + " |")
        return "\n".join(lines) + "\n"

    def picture(self) -> tuple[bytes, int, int] | None:
        """The per-case speedup picture as PNG bytes and its size in pixels; None when no host has a figure."""
        cases = [row for row in self.summary() if row["hosts"]]
        if not cases:
            return None
        import matplotlib
        matplotlib.use("Agg")  # no display: files only
        from matplotlib.figure import Figure

        hosts = [host for host, _ in self.sorted_hosts()]
        columns = min(2, len(cases))
        rows = math.ceil(len(cases) / columns)
        panel_height = PANEL_MARGIN_IN + HOST_ROW_IN * len(hosts)
        figure = Figure(figsize=(PANEL_WIDTH_IN * columns, panel_height * rows), dpi=PICTURE_DPI,
                        layout="constrained")
        axes = figure.subplots(rows, columns, squeeze=False)
        outliers = {(entry["host"], entry["case"]) for entry in self.outliers()}
        for index, row in enumerate(cases):
            ax = axes[index // columns][index % columns]
            results = self.results(row["case"])
            speedups = [results[host]["speedup"] if host in results and results[host]["status"] == OK else 0.0
                        for host in hosts]
            colours = ["tab:red" if (host, row["case"]) in outliers else "tab:blue" for host in hosts]
            ax.barh(range(len(hosts)), speedups, color=colours)
            for position, host in enumerate(hosts):  # no bar: say why (WRONG, fallback, skipped, ...)
                status = results.get(host, {}).get("status", "no result")
                if status != OK:
                    ax.text(0.02, position, "WRONG" if status == "wrong" else status, va="center", fontsize=6,
                            color="tab:red" if status in (*PROBLEMS, FALLBACK) else "dimgrey")
            ax.set_yticks(range(len(hosts)), labels=hosts, fontsize=7)
            ax.invert_yaxis()
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.axvline(row["median_speedup"], color="tab:green", linestyle="--", linewidth=1,
                       label=f"fleet median {row['median_speedup']:.2f}x")
            reference = (row["mi210"] or {}).get("speedup")
            if reference:
                ax.axvline(reference, color="tab:orange", linestyle=":", linewidth=1.2,
                           label=f"MI210 reference {reference:.2f}x")
            ax.set_title(row["case"], fontsize=9)
            ax.set_xlabel(f"speedup over the fallback (red bar: ASM figure >{OUTLIER_FRACTION:.0%} below the fleet "
                          f"median)", fontsize=7)
            ax.legend(fontsize=6, loc="lower right")
        for index in range(len(cases), rows * columns):
            axes[index // columns][index % columns].set_visible(False)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PICTURE_DPI)
        data = buffer.getvalue()
        width, height = struct.unpack(">II", data[16:24])  # the PNG's IHDR: what any viewer will show
        return data, width, height

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``bench-<time>.json``, ``.md``, ``-speedup.png`` and ``bench-latest.json``/``.md``, each atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"bench-{self.started.strftime('%Y%m%dT%H%M%SZ')}"
        drawn = self.picture()
        picture = None
        if drawn:
            data, width, height = drawn
            picture = {"path": f"{stem}-speedup.png", "width": width, "height": height}
            write_file_atomically(directory / picture["path"], data)
        json_text = json.dumps(self.to_json(picture), indent=2, sort_keys=True) + "\n"
        markdown = self.to_markdown(picture)
        for name, text in ((f"{stem}.json", json_text), (f"{stem}.md", markdown),
                           ("bench-latest.json", json_text), ("bench-latest.md", markdown)):
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

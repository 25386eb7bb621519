"""The cluster report: one row per host, written as JSON and as a Markdown table at the end of every run.

The deploy fills it from each host's probe and from what each step decided or did; this module only collects and
renders, so the same report comes out of a deploy, a dry run, a verify or a rollback.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from cdna2.host.state import write_file_atomically
from cdna2.plan import RECORDED_PACKAGES, installed_versions

REPORT_FORMAT = 1

# Step statuses, in the order a reader cares about them.
FAILED, CHANGED, PLANNED, UNCHANGED, SKIPPED = "failed", "changed", "planned", "unchanged", "skipped"


@dataclass
class StepResult:
    status: str
    detail: str = ""

    def cell(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else self.status


@dataclass
class HostRow:
    host: str
    hostname: str | None = None
    rocm: str | None = None
    rocm_source: str | None = None
    arch: str | None = None
    gpus: list[str] = field(default_factory=list)
    python: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    steps: dict[str, StepResult] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # per step, machine-readable (patch plans with diffs)
    connected: bool = True

    def package_changes(self, requirements: Iterable[str]) -> None:
        """Show planned ``name==version`` installs as ``found -> planned`` in the package columns."""
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            if name in self.packages and version:
                self.packages[name] = f"{self.packages[name] or '-'} -> {version}"

    @property
    def status(self) -> str:
        if not self.connected or self.errors or any(s.status == FAILED for s in self.steps.values()):
            return FAILED
        return "ok"


def summarise_probe(row: HostRow, probe: dict[str, Any]) -> None:
    """Copy the facts a reader wants in the report from a host probe into its row."""
    row.hostname = probe["os"]["hostname"]
    row.rocm, row.rocm_source = probe["rocm"]["version"], probe["rocm"]["source"]
    row.arch = probe["gpu"]["arch"] or ("mixed: " + ",".join(probe["gpu"]["arches"]) if probe["gpu"]["arches"]
                                        else None)
    row.gpus = [f"{agent['marketing_name'] or agent['arch']} ({agent['compute_units']} CU, {agent['chip_id']})"
                for agent in probe["gpu"]["agents"]]
    row.python = f"{probe['python']['path']} ({probe['python']['version']})"
    row.packages = installed_versions(probe)
    # Without its target environment a host cannot be provisioned; other probe remarks are worth reading only.
    (row.notes if probe["python"]["is_target"] else row.errors).extend(f"probe: {e}" for e in probe["errors"])


class RunReport:
    """Rows of one run, keyed by inventory name; written sorted by name."""

    def __init__(self, mode: str, inventory: str, started: datetime | None = None):
        self.mode = mode
        self.executed = True  # False for a dry run: decisions only, nothing was carried out
        self.inventory = inventory
        self.started = started or datetime.now(timezone.utc)
        self.rows: dict[str, HostRow] = {}

    def host(self, name: str) -> HostRow:
        return self.rows.setdefault(name, HostRow(host=name))

    def step(self, host: str, step: str, status: str, detail: str = "") -> None:
        self.host(host).steps[step] = StepResult(status, detail)

    def sorted_rows(self) -> list[HostRow]:
        """Rows by host name: hosts are probed in parallel, so the order they were first seen in varies."""
        return sorted(self.rows.values(), key=lambda row: row.host)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "mode": self.mode,
            "executed": self.executed,
            "inventory": self.inventory,
            "started": self.started.isoformat(timespec="seconds"),
            "hosts": [dict(asdict(row), status=row.status) for row in self.sorted_rows()],
            "failed_hosts": [row.host for row in self.sorted_rows() if row.status == FAILED],
        }

    def to_markdown(self) -> str:
        step_names = sorted({step for row in self.rows.values() for step in row.steps},
                            key=lambda name: STEP_ORDER.index(name) if name in STEP_ORDER else len(STEP_ORDER))
        header = ["host", "status", "ROCm", "arch", *RECORDED_PACKAGES, *step_names, "changes this run"]
        lines = [
            f"# {self.mode} report{'' if self.executed else ' (dry run: nothing executed)'}: {self.inventory}, "
            f"{self.started.isoformat(timespec='seconds')}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        notes = {row.host: list(row.notes) for row in self.sorted_rows()}
        for row in self.sorted_rows():
            # A reason shared by several steps (a gfx942 host left alone) is written once, under Notes.
            details = [step.detail for step in row.steps.values() if step.detail]
            shared = {detail for detail in details if details.count(detail) > 1}
            notes[row.host].extend(sorted(shared))
            cells = [row.host, row.status, row.rocm or "?", row.arch or "?",
                     *(row.packages.get(name) or "-" for name in RECORDED_PACKAGES),
                     *((f"{row.steps[name].status} (see notes)" if row.steps[name].detail in shared
                        else row.steps[name].cell()) if name in row.steps else "-" for name in step_names),
                     ", ".join(row.changes) or "none"]
            lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
        for title, source in (("Errors", {row.host: row.errors for row in self.rows.values()}), ("Notes", notes)):
            entries = [(host, text) for host, texts in sorted(source.items()) for text in texts]
            if entries:
                lines += ["", f"## {title}", ""] + [f"- {host}: {text}" for host, text in entries]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``<mode>-<time>.json`` and ``.md`` plus ``latest.json``/``latest.md``, each atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"{self.mode}{'' if self.executed else '-dry'}-{self.started.strftime('%Y%m%dT%H%M%SZ')}"
        json_text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        markdown = self.to_markdown()
        for name, text in ((f"{stem}.json", json_text), (f"{stem}.md", markdown),
                           ("latest.json", json_text), ("latest.md", markdown)):
            write_file_atomically(directory / name, text.encode("utf-8"))
        return directory / f"{stem}.json", directory / f"{stem}.md"


# Report columns follow the deploy's order of steps.
STEP_ORDER = ["validate", "probe", "wheels", "kernels", "patches amd-aiter", "patches vllm", "smoke", "verify",
              "rollback", "image"]


def _escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


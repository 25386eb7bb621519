"""The cluster report of every run: each host's row in the JSON; in Markdown, the counts and one row per kind of
host (the hosts that report the same thing, named as a Slurm host list), so that 1,000 nodes that agree read as
briefly as 1, and every node that differs from the majority is named. A second Markdown file has one row per host.

The deploy fills it from each host's probe and from what each step decided or did; this module only collects and
renders, so the same report comes out of a deploy, a dry run, a verify or a rollback.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from cdna2.host.distributions import RECORDED_PACKAGES
from cdna2.host.state import write_file_atomically
from cdna2.plan import installed_versions
from cdna2.reports.groups import counted, group_hosts, hosts_label

REPORT_FORMAT = 2

# Step statuses, in the order a reader cares about them.
FAILED, CHANGED, PLANNED, UNCHANGED, SKIPPED = "failed", "changed", "planned", "unchanged", "skipped"
# A step another host does for this one: the writer of a shared environment (cdna2/shared_environments.py).
BY_WRITER = "by writer"


def plan_step_status(plan_status: str) -> str:
    """A patch or config plan's status as its deploy step's: to apply is planned, already patched is unchanged,
    anything else (refused) failed."""
    return {"apply": PLANNED, "patched": UNCHANGED}.get(plan_status, FAILED)


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
    left_alone: str | None = None  # why the deploy leaves this host's AITER and vLLM as they are (its GPU arch)
    connected: bool = True

    def package_changes(self, requirements: Iterable[str]) -> None:
        """Show planned ``name==version`` installs as ``found -> planned`` in the package columns."""
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            if name in self.packages and version:
                self.packages[name] = f"{self.packages[name] or '-'} -> {version}"

    def hand_over(self, writer: str) -> None:
        """Mark every step planned so far as done by ``writer`` (a host sharing this one's environment)."""
        for name, step in self.steps.items():
            if step.status == PLANNED:
                self.steps[name] = StepResult(BY_WRITER, f"{writer}: {step.detail}")

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
    aiter = probe["distributions"].get("amd-aiter") or {}
    if aiter.get("install_mode") == "develop":
        row.notes.append(f"amd-aiter {aiter['version']} is a develop checkout: {aiter['location']} at commit "
                         f"{(aiter['commit'] or 'unknown')[:12]} (git HEAD is the pristine oracle)")


class RunReport:
    """Rows of one run, keyed by inventory name; written sorted by name."""

    def __init__(self, mode: str, inventory: str, started: datetime | None = None):
        self.mode = mode
        self.executed = True  # False for a dry run: decisions only, nothing was carried out
        self.inventory = inventory
        self.started = started or datetime.now(timezone.utc)
        self.rows: dict[str, HostRow] = {}
        # How the hosts were reached when not over SSH: the Slurm job steps the run started (cdna2/slurm/steps.py).
        self.transport: dict[str, Any] | None = None

    def host(self, name: str) -> HostRow:
        return self.rows.setdefault(name, HostRow(host=name))

    def step(self, host: str, step: str, status: str, detail: str = "") -> None:
        self.host(host).steps[step] = StepResult(status, detail)

    def sorted_rows(self) -> list[HostRow]:
        """Rows by host name: hosts are probed in parallel, so the order they were first seen in varies."""
        return sorted(self.rows.values(), key=lambda row: row.host)

    def outcome(self, row: HostRow) -> str:
        """What the run left this host as, in the summary's words: failed, left alone, or the mode's own word."""
        if row.status == FAILED:
            return FAILED
        if row.left_alone:
            return LEFT_ALONE
        return OUTCOMES.get(self.mode, "ok") if self.executed else f"to be {OUTCOMES.get(self.mode, 'checked')}"

    def summary(self) -> dict[str, Any]:
        """Hosts counted by outcome and GPU arch, and the one line that says it: ``16 hosts: 11 gfx90a
        provisioned, 5 left alone (gfx942), 0 failed``; by status, by role in a shared environment and per step by
        the step's status; the transport's line."""
        counts: dict[str, dict[str, int]] = {}
        for row in self.sorted_rows():
            by_arch = counts.setdefault(self.outcome(row), {})
            by_arch[row.arch or "unknown arch"] = by_arch.get(row.arch or "unknown arch", 0) + 1
        parts = []
        for outcome, by_arch in sorted(counts.items(), key=lambda item: item[0] in (LEFT_ALONE, FAILED)):
            if outcome == LEFT_ALONE:
                parts.append(f"{sum(by_arch.values())} left alone ({_counted(by_arch, len(by_arch) > 1)})")
            elif outcome != FAILED:
                parts.append(f"{_counted(by_arch, True)} {outcome}")
        failed = sum(counts.get(FAILED, {}).values())
        parts.append(f"{failed} failed")
        rows = self.sorted_rows()
        return {"hosts": len(self.rows), "failed": failed, "outcomes": counts,
                "text": f"{len(self.rows)} host{'' if len(self.rows) == 1 else 's'}: {', '.join(parts)}",
                "statuses": dict(Counter(row.status for row in rows)),
                "roles": dict(Counter((row.details.get("shared_environment") or {}).get("role", OWN_ENVIRONMENT)
                                      for row in rows)),
                "steps": {name: dict(Counter(row.steps[name].status if name in row.steps else NOT_RUN
                                             for row in rows)) for name in self.step_names()},
                "transport": self.transport["text"] if self.transport else None}

    def step_names(self) -> list[str]:
        """The steps of the report's columns (not the prechecks every host passes), in the deploy's order."""
        return sorted({step for row in self.rows.values() for step in row.steps if step not in PRECHECK_STEPS},
                      key=lambda name: STEP_ORDER.index(name) if name in STEP_ORDER else len(STEP_ORDER))

    def package_sets(self) -> dict[str, list[str]]:
        """Each distinct set of package versions (a row's ``packages``, planned changes included), by table label."""
        sets: dict[str, list[str]] = {}
        for row in self.sorted_rows():
            line = ", ".join(f"{name} {row.packages.get(name) or '-'}" for name in RECORDED_PACKAGES)
            sets.setdefault(line, []).append(row.host)
        return {_label(index): [line, *hosts] for index, (line, hosts) in enumerate(sets.items())}

    def shared_environments(self) -> list[dict[str, Any]]:
        """Per environment several hosts share (host data ``shared_environment``): the host that wrote it in this
        run, and the hosts whose own checks passed (its smoke test, with the environment as written)."""
        environments: dict[str, dict[str, Any]] = {}
        for row in self.sorted_rows():
            entry = row.details.get("shared_environment")
            if not entry:
                continue
            environment = environments.setdefault(entry["identity"], {
                "identity": entry["identity"], "prefix": entry["prefix"], "writer": entry["writer"],
                "hosts": [], "verified_by": []})
            environment["hosts"].append(row.host)
            smoke = row.steps.get("smoke")
            if row.status != FAILED and smoke is not None and smoke.status == "ok":
                environment["verified_by"].append(row.host)
        return list(environments.values())

    def to_json(self) -> dict[str, Any]:
        labels = {host: label for label, (_, *hosts) in self.package_sets().items() for host in hosts}
        return {
            "format": REPORT_FORMAT,
            "mode": self.mode,
            "executed": self.executed,
            "inventory": self.inventory,
            "started": self.started.isoformat(timespec="seconds"),
            "summary": self.summary(),
            "hosts": [dict(asdict(row), status=row.status, outcome=self.outcome(row), package_set=labels[row.host])
                      for row in self.sorted_rows()],
            "failed_hosts": [row.host for row in self.sorted_rows() if row.status == FAILED],
            "shared_environments": self.shared_environments(),
            "transport": self.transport,
        }

    def to_markdown(self, per_host: bool = False, hosts_file: str | None = None) -> str:
        """The cluster on one screen at any size: the summary line and the counts, one short row per kind of host
        (hosts whose every column agrees; the majority first), then only what a reader must act on or may want to
        know, each group of hosts named once. ``per_host``: one row per host instead; ``hosts_file``: the file that
        has them, named in the summary."""
        rows = self.sorted_rows()
        everyone = [row.host for row in rows]
        step_names = self.step_names()
        package_sets = self.package_sets()
        labels = {host: label for label, (_, *hosts) in package_sets.items() for host in hosts}
        summary = self.summary()
        steps_by_counts: dict[str, list[str]] = {}  # steps with the same counts on one line, in the deploy's order
        for name, statuses in summary["steps"].items():
            steps_by_counts.setdefault(counted(statuses), []).append(name)
        header = ["hosts", "status", "arch", "ROCm", "packages", *(SHORT_STEP_NAMES.get(n, n) for n in step_names),
                  "changes"]
        lines = [
            f"# {self.mode} report{'' if self.executed else ' (dry run: nothing executed)'}: {self.inventory}, "
            f"{self.started.isoformat(timespec='seconds')}",
            "",
            f"**{summary['text']}**",
            "",
            f"- status: {counted(summary['statuses'])}",
            f"- role: {counted(summary['roles'])}",
            *(f"- {', '.join(names)}: {counts}" for counts, names in steps_by_counts.items()),
            *([f"- transport: {self.transport['text']}"] if self.transport else []),
            *([f"- every host, one row each: {hosts_file}"] if hosts_file else []),
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        keyed = [(row.host, (row.status, _short_arch(row.arch), row.rocm or "?", labels[row.host],
                             *(row.steps[name].status if name in row.steps else "-" for name in step_names),
                             str(len(row.changes)))) for row in rows]
        groups = [(cells, [host]) for host, cells in keyed] if per_host else group_hosts(keyed)
        for cells, hosts in groups:
            lines.append("| " + " | ".join(_escape(cell) for cell in (hosts_label(hosts, everyone), *cells)) + " |")
        lines += ["", "## Package sets", ""]
        lines += [f"- {label} ({len(hosts)} host{'' if len(hosts) == 1 else 's'}): {line}"
                  for label, (line, *hosts) in package_sets.items()]
        if shared := self.shared_environments():
            lines += ["", "## Shared environments", ""]
            lines += [f"- {env['prefix']} (identity {env['identity'][:12]}): written by {env['writer']}, verified on "
                      f"{len(env['verified_by'])} of its {len(env['hosts'])} hosts"
                      + ("" if len(env["verified_by"]) == len(env["hosts"]) else
                         f" (not: {hosts_label(sorted(set(env['hosts']) - set(env['verified_by'])), everyone)})")
                      for env in shared]
        # A reason that leaves steps of many hosts skipped (a gfx942 host left alone) is written once, with its hosts.
        skipped: dict[str, dict[str, tuple[str, ...]]] = {}
        for row in rows:
            for name, step in row.steps.items():
                if step.status == SKIPPED:
                    by_host = skipped.setdefault(step.detail or "no reason given", {})
                    by_host[row.host] = (*by_host.get(row.host, ()), name)
        if skipped:
            lines += ["", "## Skipped", ""]
            lines += [f"- {reason}: " + "; ".join(f"{', '.join(names)} on {hosts_label(hosts, everyone)}"
                                                  for names, hosts in group_hosts((host, names) for host, names
                                                                                  in by_host.items()))
                      for reason, by_host in skipped.items()]
        # Hosts with the same outcome and the same detail (a cold deploy of identical nodes) share one entry; the
        # failed ones first.
        detailed = sorted(group_hosts((row.host, (self.outcome(row), tuple(entries)))
                                      for row in rows if (entries := _host_detail(row))),
                          key=lambda group: group[0][0] != FAILED)
        if detailed:
            lines += ["", "## Hosts where something happened or failed"]
            for (outcome, entries), hosts in detailed:
                lines += ["", f"### {hosts_label(hosts, everyone)}: {outcome}", ""] + [f"- {entry}" for entry in entries]
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``<mode>-<time>.json``, ``.md`` and ``-hosts.md`` (one row per host) plus ``latest.json``,
        ``latest.md`` and ``latest-hosts.md``, each atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"{self.mode}{'' if self.executed else '-dry'}-{self.started.strftime('%Y%m%dT%H%M%SZ')}"
        json_text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        markdown = self.to_markdown(hosts_file=f"{stem}-hosts.md")
        per_host = self.to_markdown(per_host=True)
        for name, text in ((f"{stem}.json", json_text), (f"{stem}.md", markdown), (f"{stem}-hosts.md", per_host),
                           ("latest.json", json_text), ("latest.md", markdown), ("latest-hosts.md", per_host)):
            write_file_atomically(directory / name, text.encode("utf-8"))
        return directory / f"{stem}.json", directory / f"{stem}.md"


# Report columns follow the deploy's order of steps.
STEP_ORDER = ["validate", "probe", "wheels", "kernels", "patches amd-aiter", "patches vllm", "fp8 configs", "smoke",
              "bench", "verify", "rollback", "image"]
# Steps every host passes before any work (their failure shows as the host's status, with the reason below).
PRECHECK_STEPS = ("validate", "probe", "preflight")
SHORT_STEP_NAMES = {"patches amd-aiter": "aiter patch", "patches vllm": "vllm patch", "fp8 configs": "fp8 cfg"}
# What a host that neither failed nor was left alone is, after a run of each mode.
OUTCOMES = {"deploy": "provisioned", "verify": "as deployed", "rollback": "rolled back"}
LEFT_ALONE = "left alone"
# A host's role where it shares no environment, and a step's count for hosts that did not reach it.
OWN_ENVIRONMENT, NOT_RUN = "own environment", "not run"
# Step statuses worth a line in the host's detail; "unchanged" and "ok" need none, "skipped" is grouped by reason.
DETAILED_STATUSES = (FAILED, CHANGED, PLANNED)


def _counted(by_arch: dict[str, int], with_counts: bool) -> str:
    return ", ".join(f"{count} {arch}" if with_counts else arch for arch, count in sorted(by_arch.items()))


def _label(index: int) -> str:
    """Package set labels: A..Z, then AA, AB, ..."""
    letters = ""
    index += 1
    while index:
        index, remainder = divmod(index - 1, 26)
        letters = chr(ord("A") + remainder) + letters
    return letters


def _short_arch(arch: str | None) -> str:
    return "mixed" if arch and arch.startswith("mixed") else arch or "?"


def _host_detail(row: HostRow) -> list[str]:
    """The lines a reader needs about one host: steps that changed, are planned or failed, errors, notes, changes."""
    entries = [f"{name} {step.status}" + (f": {step.detail}" if step.detail else "")
               for name, step in row.steps.items() if step.status in DETAILED_STATUSES]
    entries += [f"error: {error}" for error in row.errors]
    entries += [f"note: {note}" for note in row.notes]
    if row.changes:
        entries.append(f"{len(row.changes)} operation(s) changed the host: {', '.join(row.changes)}")
    return entries


def _escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


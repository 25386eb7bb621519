"""Run the pyinfra CLI in this process and count, per host, what the run sent over SSH.

    python bench/pyinfra_counted.py COUNTS.json -- INVENTORY deploy.py [pyinfra options]

Run from the root of the checkout to measure, like pyinfra itself (bench/deploy runs it in a snapshot of the
repository, so this file need not live in the tree it measures). The real CLI runs unchanged; the SSH connector's
entry points (connect, shell command, file upload and download) and pyinfra's fact loader are wrapped to count and
time what passes through them:

- ``commands``: shell commands, one SSH exec channel each (facts, operation commands, the kernel source fetch),
  and ``command_s``, the wall time spent waiting on them;
- ``connect_s``: the SSH connection (TCP, key exchange, authentication);
- ``uploads`` / ``downloads``: SFTP file transfers and their bytes, uploads split by what they carry;
- ``facts`` / ``fact_s``: fact commands and their wall time by fact name (``operations.facts.HostProbe`` is the
  deploy's one probe), and ``probe_cpu_s``, the CPU the probe reports it used on the host;
- controller-side: the kernel translations (``ensure_translation``) and gfx942 source fetches of the run.

COUNTS.json is written when the CLI exits (any exit code); this process exits with the CLI's code. The wrappers add
a few dict updates per command; every command, transfer and fact of the real deploy still runs.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

PROBE_FACT = "operations.facts.HostProbe"

# What an upload carries, from its remote path (operations/agent.py, kernels.py, patches.py name them so).
UPLOAD_KINDS = (("/staging/gfx90a-", "kernels"), ("/agent-", "agent"), (".cdna2-staged", "patches"),
                ("/staging/patch-", "patches"))


def upload_kind(remote_path: str) -> str:
    return next((kind for marker, kind in UPLOAD_KINDS if marker in remote_path), "other")


def local_size(filename_or_io) -> int:
    """Bytes pyinfra will send for a put_file source: a local path or a seekable file object."""
    if isinstance(filename_or_io, (str, os.PathLike)):
        return os.path.getsize(filename_or_io)
    position = filename_or_io.tell()
    size = filename_or_io.seek(0, os.SEEK_END)
    filename_or_io.seek(position)
    return size - position


class Counts:
    def __init__(self) -> None:
        self.hosts: dict[str, dict] = defaultdict(lambda: {
            "connect_s": 0.0, "commands": 0, "command_s": 0.0, "facts": defaultdict(int),
            "fact_s": defaultdict(float), "uploads": 0, "upload_bytes": defaultdict(int), "downloads": 0,
            "download_bytes": 0})
        self.translations: list[dict] = []
        self.source_fetches: list[str] = []

    def to_json(self) -> dict:
        self_usage = resource.getrusage(resource.RUSAGE_SELF)
        children_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "hosts": {name: {**row, "connect_s": round(row["connect_s"], 3), "command_s": round(row["command_s"], 3),
                             "facts": dict(row["facts"]),
                             "fact_s": {fact: round(seconds, 3) for fact, seconds in row["fact_s"].items()},
                             "upload_bytes": dict(row["upload_bytes"])}
                      for name, row in sorted(self.hosts.items())},
            "translations": self.translations,
            "source_fetches": self.source_fetches,
            # ru_maxrss is in KiB on Linux; the children's figure is the largest single waited-for descendant.
            "maxrss_kib": {"pyinfra": self_usage.ru_maxrss, "largest_child": children_usage.ru_maxrss},
        }


def instrument(counts: Counts) -> None:
    from pyinfra.api import facts
    from pyinfra.connectors.ssh import SSHConnector

    connect, run_shell_command = SSHConnector.connect, SSHConnector.run_shell_command
    put_file, get_file = SSHConnector.put_file, SSHConnector.get_file
    get_one_fact = facts._get_fact

    def timed_connect(self):
        started = time.monotonic()
        try:
            return connect(self)
        finally:
            counts.hosts[self.host.name]["connect_s"] += time.monotonic() - started

    def counted_run_shell_command(self, command, *args, **kwargs):
        row = counts.hosts[self.host.name]
        row["commands"] += 1
        started = time.monotonic()
        try:
            return run_shell_command(self, command, *args, **kwargs)
        finally:
            row["command_s"] += time.monotonic() - started

    def counted_put_file(self, filename_or_io, remote_filename, *args, **kwargs):
        row = counts.hosts[self.host.name]
        row["uploads"] += 1
        row["upload_bytes"][upload_kind(str(remote_filename))] += local_size(filename_or_io)
        return put_file(self, filename_or_io, remote_filename, *args, **kwargs)

    def counted_get_file(self, remote_filename, filename_or_io, *args, **kwargs):
        fetched = get_file(self, remote_filename, filename_or_io, *args, **kwargs)
        row = counts.hosts[self.host.name]
        row["downloads"] += 1
        if isinstance(filename_or_io, (str, os.PathLike)) and os.path.exists(filename_or_io):
            row["download_bytes"] += os.path.getsize(filename_or_io)
        return fetched

    def counted_get_fact(state, host, cls, *args, **kwargs):
        row, name = counts.hosts[host.name], cls().name
        row["facts"][name] += 1
        started = time.monotonic()
        try:
            result = get_one_fact(state, host, cls, *args, **kwargs)
        finally:
            row["fact_s"][name] += time.monotonic() - started
        if name == PROBE_FACT and isinstance(result, dict) and "cpu_s" in result:
            row["probe_cpu_s"] = result["cpu_s"]  # the probe's own CPU on the host, start-up included
        return result

    SSHConnector.connect = timed_connect
    SSHConnector.run_shell_command = counted_run_shell_command
    SSHConnector.put_file = counted_put_file
    SSHConnector.get_file = counted_get_file
    facts._get_fact = counted_get_fact
    instrument_kernels(counts)


def instrument_kernels(counts: Counts) -> None:
    """Count translations and source fetches where deploy.py's kernel step calls them (module globals)."""
    sys.path.insert(0, os.getcwd())  # the measured checkout, the one pyinfra loads deploy.py from
    from operations import kernels

    ensure_translation, fetch_directory = kernels.ensure_translation, kernels.fetch_directory

    def counted_ensure_translation(cache, source_digest, *args, **kwargs):
        started = time.monotonic()
        tree = ensure_translation(cache, source_digest, *args, **kwargs)
        counts.translations.append({"source_digest": source_digest, "seconds": round(time.monotonic() - started, 2)})
        return tree

    def counted_fetch(source_host, *args, **kwargs):
        counts.source_fetches.append(source_host.name)
        return fetch_directory(source_host, *args, **kwargs)

    kernels.ensure_translation = counted_ensure_translation
    kernels.fetch_directory = counted_fetch


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        print("usage: python bench/pyinfra_counted.py COUNTS.json -- INVENTORY deploy.py [pyinfra options]",
              file=sys.stderr)
        return 2
    counts_path = Path(sys.argv[1])
    counts = Counts()
    instrument(counts)
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", *sys.argv[3:]]
    code = 0
    try:
        pyinfra_main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        staging = counts_path.with_name(f".{counts_path.name}.staging")
        staging.write_text(json.dumps(counts.to_json(), indent=1) + "\n")
        staging.replace(counts_path)
    return code


if __name__ == "__main__":
    sys.exit(main())

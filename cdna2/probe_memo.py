"""What the controller remembers of each host's RECORD files from one run to the next.

A RECORD changes only when pip installs its distribution again, and then its stat (size, mtime, inode) changes
too. The probe reports, per RECORD, its stat and the facts the deploy takes from it
(``cdna2.host.probe.record_facts``); the next probe of the same host gets them back as ``record_memo`` and reads a
RECORD again only when its stat differs. AITER's RECORD alone is 1.5 MB, parsed for its kernel tree on every run
otherwise. A memo that is lost, stale or another host's costs one full read, never a wrong fact: the host decides,
by the stat it sees.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cdna2.cache import cache_root
from cdna2.host.probe import PROBE_FORMAT
from cdna2.host.state import write_file_atomically

_loaded: dict[str, dict] = {}
_state_dirs: dict[str, str | None] = {}


def _memo_path(host_name: str) -> Path:
    return cache_root() / "probe-memo" / f"{hashlib.sha256(host_name.encode('utf-8')).hexdigest()[:32]}.json"


def record_memo(host_name: str) -> dict:
    """The ``record_memo`` option for the next probe of ``host_name``: {package: {stat, facts}}, or {}."""
    if host_name not in _loaded:
        try:
            document = json.loads(_memo_path(host_name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            document = {}
        valid = document.get("format") == PROBE_FORMAT and document.get("host") == host_name
        _loaded[host_name] = document.get("records", {}) if valid else {}
        _state_dirs[host_name] = document.get("state_dir") if valid else None
    return _loaded[host_name]


def remembered_state_dir(host_name: str) -> str | None:
    """The state directory the last probe of ``host_name`` reported (an unprivileged login's XDG one), or None."""
    record_memo(host_name)
    return _state_dirs.get(host_name)


def remember_records(host_name: str, probe: dict) -> None:
    """Keep what this probe of ``host_name`` reported of its RECORDs and where its state directory is, for the next
    one (written only on a change)."""
    records = {package: {"stat": found["stat"], "facts": found["facts"]}
               for package, found in probe.get("record_facts", {}).items() if found["stat"]}
    state_dir = (probe.get("state_dir") or {}).get("path")
    if records != record_memo(host_name) or state_dir != remembered_state_dir(host_name):
        document = {"format": PROBE_FORMAT, "host": host_name, "records": records, "state_dir": state_dir}
        write_file_atomically(_memo_path(host_name), json.dumps(document, sort_keys=True).encode("utf-8"))
        _loaded[host_name], _state_dirs[host_name] = records, state_dir

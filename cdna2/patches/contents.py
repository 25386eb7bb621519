"""The controller's copies of patch-target files, by content hash: a host sends a file's bytes once per controller.

The probe reports every target's RECORD hash and current hash; it sends the bytes only when the current hash is not
one of ``known_hashes()`` (the copies this controller holds: the pristine and the patched text of every version it
has seen), so a re-run on a provisioned cluster moves no file contents at all. ``target_files`` gives the planner
every file's bytes either way, from the probe or from here, each checked against its hash.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdna2.cache import cache_root
from cdna2.host.digests import record_hash
from cdna2.host.distributions import file_content
from cdna2.host.state import write_file_atomically

# The most recently used hashes go into the probe's options: enough for many package versions at once, and far
# below Linux's 128 KiB limit on one command-line argument (about 50 bytes each).
KNOWN_LIMIT = 512
HASH_PREFIX = "sha256="


class TargetContentError(RuntimeError):
    pass


def contents_dir() -> Path:
    return cache_root() / "patch-targets"


def _copy_path(hash_field: str) -> Path:
    # A RECORD hash is urlsafe base64 after its prefix: letters, digits, "-" and "_", safe as a file name.
    return contents_dir() / hash_field.removeprefix(HASH_PREFIX)


def known_hashes() -> list[str]:
    """RECORD-style hashes of the copies held here, most recently used first (at most ``KNOWN_LIMIT``)."""
    try:
        entries = [entry for entry in os.scandir(contents_dir()) if entry.is_file() and not entry.name.startswith(".")]
    except FileNotFoundError:
        return []
    entries.sort(key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
    return [HASH_PREFIX + entry.name for entry in entries[:KNOWN_LIMIT]]


def _stored(hash_field: str, data: bytes) -> None:
    copy = _copy_path(hash_field)
    if not copy.exists():
        write_file_atomically(copy, data)


def _held(hash_field: str, host: str, path: str) -> bytes:
    copy = _copy_path(hash_field)
    try:
        data = copy.read_bytes()
    except FileNotFoundError:
        raise TargetContentError(f"host {host}: {path}: the probe left out its bytes ({hash_field}) because this "
                                 f"controller held them, but {copy} is gone: run again (the next probe sends them)")
    if record_hash(data) != hash_field:
        copy.unlink(missing_ok=True)
        raise TargetContentError(f"host {host}: {path}: the controller's copy {copy} does not match its hash "
                                 f"{hash_field} and was removed: run again")
    os.utime(copy)  # recently used: kept among the hashes the next probes are told about
    return data


def target_files(host: str, entries: dict[str, dict | None]) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """The bytes (None: absent on the host) and RECORD hashes of one package's targets as a probe reported them
    (``probe["patch_targets"][package]["files"]``); bytes the probe sent are kept here for the next runs."""
    files: dict[str, bytes | None] = {}
    for path, entry in entries.items():
        if entry is None:
            files[path] = None
        elif entry["content"] is not None:
            data = file_content(entry["content"])
            if record_hash(data) != entry["current"]:
                raise TargetContentError(f"host {host}: {path}: the bytes the probe sent do not match the hash it "
                                         f"reported ({entry['current']}): run again")
            _stored(entry["current"], data)
            files[path] = data
        else:
            files[path] = _held(entry["current"], host, path)
    record = {path: entry["record"] for path, entry in entries.items() if entry and entry["record"]}
    return files, record

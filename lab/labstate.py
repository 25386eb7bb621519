"""The lab's state on the controller: where its directory is (LabPaths), lab.json read and written atomically, and the
lock that serialises up and down on one lab.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cdna2.host.state import write_file_atomically
from lab import wheelhouse

REPO = Path(__file__).resolve().parent.parent
LAB_FORMAT = 1
# Paths of a host that are its own (bind-mounted from its directory under .lab/hosts/<name>/), by host path.
HOST_BINDS = {"/opt/rocm": "rocm", "/opt/venv": "venv", "/var/lib/cdna2": "state", "/tmp": "tmp"}


def progress(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LabPaths:
    root: Path

    @classmethod
    def default(cls) -> LabPaths:
        if os.environ.get("CDNA2_LAB_DIR"):
            return cls(Path(os.environ["CDNA2_LAB_DIR"]).resolve())
        in_repo = (REPO / ".lab").resolve()
        if any(in_repo.is_relative_to(mount_point) for mount_point in HOST_BINDS):
            # A checkout under /tmp (say, a CI clone) cannot hold the lab: each host replaces /tmp with its own.
            return cls(wheelhouse.cache_root() / "labs" / hashlib.sha256(str(REPO).encode()).hexdigest()[:16])
        return cls(in_repo)

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def client_key(self) -> Path:
        return self.root / "ssh" / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "ssh" / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.root / "ssh" / "known_hosts"

    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    @property
    def mirror(self) -> Path:
        """The lab's package mirror (lab/mirror.py): the wheels and wheel matrix the lab hosts install from."""
        return self.root / "mirror"


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    write_file_atomically(path, text.encode("utf-8"), mode)


def load_lab(paths: LabPaths) -> dict | None:
    if not paths.state_file.exists():
        return None
    lab = json.loads(paths.state_file.read_text())
    if lab.get("format") != LAB_FORMAT:
        raise SystemExit(f"{paths.state_file} has format {lab.get('format')!r}, this labctl reads {LAB_FORMAT}; "
                         f"stop that lab with the labctl that started it, or remove {paths.root} once no host runs")
    return lab


def save_lab(paths: LabPaths, lab: dict) -> None:
    write_atomically(paths.state_file, json.dumps(lab, indent=2) + "\n")


@contextmanager
def lab_locked(paths: LabPaths) -> Iterator[None]:
    """Serialise up/down on one lab; the lock lives outside the lab directory because `down` removes that."""
    with wheelhouse.cache_lock(f"lab-{hashlib.sha256(str(paths.root).encode()).hexdigest()[:12]}"):
        yield

"""Deterministic tar.gz archives: the same files give the same bytes, so their checksums can decide uploads."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def tree_archive(root: Path, dest: Path, prefix: str = "") -> Path:
    """Archive every file and directory under ``root`` (names relative to it, under ``prefix``) into ``dest``.

    Entries are sorted and their owners, times and modes normalised; the gzip header carries no time or name.
    The archive is written beside ``dest`` and renamed into place.
    """
    members: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        members.extend(Path(directory, d) for d in subdirs)
        members.extend(Path(directory, f) for f in sorted(files))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(members, key=lambda p: p.relative_to(root).as_posix()):
            arcname = prefix + path.relative_to(root).as_posix()
            info = _normalised(tar.gettarinfo(str(path), arcname))
            if info.isfile():
                with open(path, "rb") as stream:
                    tar.addfile(info, stream)
            else:
                tar.addfile(info)
    staged = dest.with_name(f".{dest.name}.staged-{os.getpid()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(staged, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as stream:
            stream.write(buffer.getvalue())
        os.replace(staged, dest)
    finally:
        staged.unlink(missing_ok=True)  # a write cut short (a full disk) leaves no partial archive behind
    return dest

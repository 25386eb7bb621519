"""File and tree digests the probe reports and the controller computes alike (cdna2.kernels uses these very
functions): RECORD-style and git-blob hashes, a tree's digest and its cheap stat signature.
"""

from __future__ import annotations

import binascii
import hashlib
import os
from stat import S_ISREG

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc imports collections: annotations only
    from collections.abc import Callable, Collection, Iterator

# base64 by hand (binascii, which base64 itself wraps): the probe's start-up time is paid on every host every run.
_URLSAFE = str.maketrans("+/", "-_")


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def record_hash(data: bytes) -> str:
    """The hash field of a wheel RECORD line for ``data``: ``sha256=<urlsafe base64, no padding>``."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + b64(digest).translate(_URLSAFE).rstrip("=")


# A hash field in git's terms: the blob id git gives the bytes (the pristine oracle of a develop checkout).
GIT_BLOB = "git-blob="


def git_hash_field(data: bytes) -> str:
    """``git-blob=<the id git hash-object gives data>``, computed without git."""
    return GIT_BLOB + hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hash_like(hash_field: str, data: bytes) -> str:
    """The hash of ``data`` in the form of ``hash_field``: a git blob field, or a RECORD sha256 field."""
    return git_hash_field(data) if hash_field.startswith(GIT_BLOB) else record_hash(data)


def read_bytes(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


def read_text(path: str | os.PathLike) -> str:
    return read_bytes(path).decode("utf-8", errors="replace")


def file_sha256(path: str | os.PathLike) -> str | None:
    """Hex sha256 of a file, read in blocks; None when it is not a file."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_of_entries(entries: list[tuple[str, str, str]]) -> str:
    lines = "".join(f"{path},{hash_field},{size}\n" for path, hash_field, size in sorted(entries))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def tree_digest(root: str | os.PathLike, hash_field: Callable[[bytes], str] = record_hash) -> str:
    """Digest of every regular file under ``root``: sha256 over sorted RECORD-style lines relative to ``root``.

    A tree installed from a wheel has the same digest as ``record_tree_digest`` of the wheel's RECORD for that
    subtree, so a host's kernel tree can be compared with what its RECORD promises without reading the files twice.
    ``__pycache__`` directories are left out on both sides. With ``hash_field=git_hash_field`` it is the digest
    ``read_develop_aiter`` computes from the blob ids of a checkout's git HEAD instead.
    """
    entries = []
    # Bytecode caches are derived from the sources beside them, and RECORD lists them without a hash.
    for relative, path in regular_files(root, skip_dirs=("__pycache__",)):
        with open(path, "rb") as stream:
            data = stream.read()
        entries.append((relative, hash_field(data), str(len(data))))
    return digest_of_entries(entries)


def regular_files(root: str | os.PathLike, skip_dirs: Collection[str] = ()) -> Iterator[tuple[str, str]]:
    """(path relative to ``root``, "/"-separated; the full path) of every regular file under ``root`` (a symlink to
    one included), in os.walk order with subdirectories sorted, directories named in ``skip_dirs`` left out."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in skip_dirs)
        relative_dir = os.path.relpath(directory, root)
        for file_name in files:
            path = os.path.join(directory, file_name)
            if os.path.isfile(path):
                yield (file_name if relative_dir == "." else f"{relative_dir}/{file_name}"), path


def tree_stat_signature(root: str | os.PathLike) -> tuple[str, int]:
    """Digest of what ``stat`` says of every regular file under ``root`` (path, size, mtime, ctime, inode), and
    their number: the digest is equal for an untouched tree and changes once any file is written, replaced, added
    or removed; no file is opened. The kernel install records it beside the tree's content digest."""
    lines = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        relative_dir = directory[len(os.fspath(root)) + 1:]
        for file_name in files:
            stat = os.lstat(os.path.join(directory, file_name))
            if S_ISREG(stat.st_mode):
                relative = f"{relative_dir}/{file_name}" if relative_dir else file_name
                lines.append(f"{relative},{stat.st_size},{stat.st_mtime_ns},{stat.st_ctime_ns},{stat.st_ino}\n")
    return hashlib.sha256("".join(sorted(lines)).encode("utf-8")).hexdigest(), len(lines)


TRITON_SOURCES = "aiter/ops/triton"  # AITER's Triton package under site-packages: what the Triton compile proof reads


def is_triton_source(relative: str) -> bool:
    return relative.endswith((".py", ".json"))


def triton_sources_digest(site_packages: str | os.PathLike) -> str | None:
    """Digest (as ``tree_digest``: RECORD-style lines) of AITER's Triton sources and configs, every ``*.py`` and
    ``*.json`` under ``aiter/ops/triton``, read from disk; None where there is no such directory. For a tree
    installed from a wheel it equals ``record_triton_digest`` of its RECORD, which the probe reports: the
    controller's compile proof is keyed by it (cdna2.triton.proof)."""
    root = os.path.join(site_packages, TRITON_SOURCES)
    if not os.path.isdir(root):
        return None
    entries = []
    for relative, path in regular_files(root, skip_dirs=("__pycache__",)):
        if is_triton_source(relative):
            data = read_bytes(path)
            entries.append((relative, record_hash(data), str(len(data))))
    return digest_of_entries(entries)

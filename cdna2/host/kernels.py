"""Install or remove the translated ``hsa/gfx90a`` kernel tree on a host, atomically.

    python -m cdna2.host.kernels install --archive A --sha256 S --digest D --hsa-root H --state-dir SD
    python -m cdna2.host.kernels remove --hsa-root H --state-dir SD

``install`` checks the uploaded archive's checksum, unpacks it into a staging directory beside ``hsa/``, checks
the unpacked tree's digest, and only then swaps it into ``hsa/gfx90a``: with an atomic exchange of the two
directories where the filesystem supports it, so AITER sees the old tree or the new one and never a mix. The
previous tree is kept as ``hsa/.gfx90a.previous`` (hidden from AITER's ``hsa/*/`` scan). ``remove`` takes the
tree and its previous copy away. Both print one JSON object and exit 0 on success, 1 on failure.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

from cdna2.host.cli import finish
from cdna2.host.digests import file_sha256, tree_digest, tree_stat_signature
from cdna2.host.state import host_lock, update_state

STATE_KEY = "kernels"
RENAME_EXCHANGE = 2
AT_FDCWD = -100


class KernelInstallError(RuntimeError):
    pass


def exchange_directories(first: Path, second: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False when the system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(first))


def rename_directory(source: Path, target: Path) -> None:
    """``os.rename``, also for a directory overlayfs cannot rename: one from a lower layer of a container image
    (EXDEV without ``redirect_dir``). That one is copied to ``target`` (copied up), then deleted."""
    try:
        os.rename(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copytree(source, target, symlinks=True)
        shutil.rmtree(source)


def safe_extract(archive: Path, destination: Path) -> None:
    """Unpack regular files and directories only, each inside ``destination``; anything else is refused."""
    with tarfile.open(archive, "r:*") as tar:
        for member in tar.getmembers():
            target = (destination / member.name).resolve()
            if not (member.isfile() or member.isdir()) or not target.is_relative_to(destination.resolve()):
                raise KernelInstallError(f"{archive}: refusing archive member {member.name!r} "
                                         f"(only files and directories inside the tree are allowed)")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(destination, filter="data")
        else:  # Python before 3.11.4 has no extraction filters; the members were vetted above
            tar.extractall(destination)


def install(archive: Path, sha256: str, digest: str, hsa_root: Path, state_dir: Path) -> dict:
    current = hsa_root / "gfx90a"
    previous = hsa_root / ".gfx90a.previous"
    staging = hsa_root / f".gfx90a.staging-{os.getpid()}"
    with host_lock(state_dir):
        if current.is_dir() and tree_digest(current) == digest:
            archive.unlink(missing_ok=True)
            return {"result": "unchanged", "digest": digest}
        actual = file_sha256(archive)
        if actual != sha256:
            raise KernelInstallError(f"{archive}: checksum {actual} does not match the uploaded {sha256}; "
                                     f"the upload is damaged or incomplete, run the deploy again")
        # Under the lock no other install runs: any staging left beside ours is a killed command's.
        for stale in hsa_root.glob(".gfx90a.staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging.mkdir()
        try:
            safe_extract(archive, staging)
            unpacked = tree_digest(staging)
            if unpacked != digest:
                raise KernelInstallError(f"{staging}: unpacked tree digest {unpacked} differs from the expected "
                                         f"{digest}; nothing was replaced")
            atomic = True
            if current.exists():
                atomic = exchange_directories(staging, current)
                if not atomic:
                    # No atomic exchange on this filesystem: the old tree is absent between these two renames.
                    rename_directory(current, staging.with_name(staging.name + ".old"))
                    os.rename(staging, current)
                    os.rename(staging.with_name(staging.name + ".old"), staging)
                shutil.rmtree(previous, ignore_errors=True)
                rename_directory(staging, previous)
            else:
                os.rename(staging, current)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        archive.unlink(missing_ok=True)
        update_state(state_dir, STATE_KEY, {
            "digest": digest, "archive_sha256": sha256, "hsa_root": str(hsa_root),
            # The probe takes the digest from here while the tree's stat is unchanged (cdna2/host/probe.py).
            "stat_signature": tree_stat_signature(current)[0],
            "previous": str(previous) if previous.exists() else None,
            "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
        return {"result": "installed", "digest": digest, "atomic_swap": atomic,
                "previous": str(previous) if previous.exists() else None}


def remove(hsa_root: Path, state_dir: Path) -> dict:
    removed = []
    with host_lock(state_dir):
        for tree in (hsa_root / "gfx90a", hsa_root / ".gfx90a.previous"):
            if tree.exists():
                # Rename first so AITER never sees a half-deleted tree under its real name.
                doomed = tree.with_name(f".gfx90a.removing-{os.getpid()}")
                try:
                    os.rename(tree, doomed)
                except OSError as error:
                    if error.errno != errno.EXDEV:
                        raise
                    doomed = tree  # from a lower layer of a container image (overlayfs): deleted where it is
                shutil.rmtree(doomed)
                removed.append(str(tree))
        update_state(state_dir, STATE_KEY, None)
    return {"result": "removed" if removed else "unchanged", "removed": removed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.kernels", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser("install")
    install_parser.add_argument("--archive", type=Path, required=True)
    install_parser.add_argument("--sha256", required=True)
    install_parser.add_argument("--digest", required=True)
    for sub in (install_parser, commands.add_parser("remove")):
        sub.add_argument("--hsa-root", type=Path, required=True)
        sub.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            result = install(args.archive, args.sha256, args.digest, args.hsa_root, args.state_dir)
        else:
            result = remove(args.hsa_root, args.state_dir)
    except (KernelInstallError, OSError, RuntimeError, tarfile.TarError) as error:
        return finish(f"kernels {args.command}", {"result": "failed", "error": str(error)}, str(error))
    return finish(f"kernels {args.command}", result)


if __name__ == "__main__":
    sys.exit(main())

"""Develop-mode AITER on a lab host: a real git checkout of an AITER tag, installed the way ``pip install -e`` does.

The checkout is cloned once per machine from AITER's git history (``$CDNA2_AITER_GIT``, a bare clone
of github.com/ROCm/aiter; no default) into ``<cache>/lab-aiter/<tag>`` with ``git clone --shared`` (its objects stay in
the mirror's object store), and each host gets a hard-linked copy (``cp -al``) as ``.lab/hosts/<name>/aiter``,
which the host sees at the same path. Sharing the inodes is safe for the venvs' reasons (lab/venvs.py): git and the
cdna2 tool replace a file by a rename, never in place.

Into the host's venv goes what ``pip install -e`` leaves for a setuptools project: a dist-info whose RECORD lists
only the path file and the metadata, ``direct_url.json`` saying editable (PEP 610), and the ``__editable__`` path
file naming the checkout. Nothing is built: AITER's JIT compiles its modules on first use, and the lab has no ROCm
to compile them with. ``aiter/install_mode`` says ``develop``, as AITER's setup.py writes it (the file is gitignored).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from cdna2.host.state import write_file_atomically
from lab.aiter_git import aiter_git, aiter_version
from lab import venvs, wheelhouse
from lab.kinds import Kind

CHECKOUT_DIR = "aiter"  # in the host's lab directory


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


def cached_checkout(tag: str, progress: venvs.Progress) -> Path:
    """The machine's checkout of AITER ``tag`` (cloned once; SourceMissing when there is no AITER git history)."""
    mirror = aiter_git()
    checkout = wheelhouse.cache_root() / "lab-aiter" / tag
    with wheelhouse.cache_lock("lab-aiter"):
        if not (checkout / ".git").is_dir():
            staging = checkout.with_name(checkout.name + ".staging")
            shutil.rmtree(staging, ignore_errors=True)
            progress(f"cloning AITER {tag} from {mirror} into {checkout} (once per machine)")
            _git("clone", "-q", "--shared", "--no-checkout", str(mirror), str(staging))
            # Hard-linked copies change every file's ctime (the link count): git would re-hash the whole checkout
            # on each status. Content changes still show in size and mtime, which the tool's renames change.
            _git("-C", str(staging), "config", "core.trustctime", "false")
            _git("-C", str(staging), "-c", "advice.detachedHead=false", "checkout", "-q", tag)
            staging.rename(checkout)
        # A host that wrote one of its files in place wrote it here too (hard links): never hand that on.
        changed = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], check=True,
                                 capture_output=True, text=True).stdout
    if changed:
        raise RuntimeError(f"the cached AITER checkout {checkout} differs from {tag}, edited in place through a lab "
                           f"host's hard link:\n{changed}restore it (git -C {checkout} checkout -- .) or remove it")
    return checkout


def editable_metadata(site_packages: Path, checkout: Path, version: str) -> None:
    """The files ``pip install -e`` writes into site-packages for a setuptools project at ``checkout``."""
    dist_info = site_packages / f"amd_aiter-{version}.dist-info"
    path_file = f"__editable__.amd_aiter-{version}.pth"
    files = {
        path_file: f"{checkout}\n",
        f"{dist_info.name}/METADATA": f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {version}\n",
        f"{dist_info.name}/INSTALLER": "pip\n",
        f"{dist_info.name}/direct_url.json": json.dumps({"dir_info": {"editable": True}, "url": f"file://{checkout}"}),
    }
    for relative, text in files.items():
        write_file_atomically(site_packages / relative, text.encode("utf-8"))
    record = "".join(f"{relative},,\n" for relative in (*files, f"{dist_info.name}/RECORD"))
    write_file_atomically(dist_info / "RECORD", record.encode("utf-8"))


def install_checkout(kind: Kind, host_dir: Path, progress: venvs.Progress) -> Path:
    """Give a host its own checkout of ``kind.aiter_checkout`` installed in develop mode into its venv (the venv
    comes without the amd-aiter wheel: lab/venvs.py); a host that has its checkout keeps it as it is."""
    checkout = host_dir / CHECKOUT_DIR
    if not checkout.exists():
        source = cached_checkout(kind.aiter_checkout, progress)
        staging = checkout.with_name(checkout.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        venvs.hard_link_copy(source, staging)
        write_file_atomically(staging / "aiter" / "install_mode", b"develop")
        staging.rename(checkout)
        site_packages = next((host_dir / "venv").glob("lib/python3*/site-packages"))
        editable_metadata(site_packages, checkout, aiter_version(aiter_git(), kind.aiter_checkout))
    return checkout

"""Develop-mode AITER: a git checkout installed by setup.py develop or pip install -e, found from its metadata, with
git HEAD as the pristine oracle of its files.
"""

from __future__ import annotations

import os

from cdna2.host.digests import GIT_BLOB, digest_of_entries, read_text
from cdna2.host.jsontext import json_loads
from cdna2.host.programs import run_program

# AITER's wheel installs the repository's csrc/, hsa/, ... under aiter_meta/ (its setup.py copies them there) and
# aiter/ as it is; a develop checkout holds them at its root, where AITER's core.py then points AITER_META_DIR.
WHEEL_META_DIR = "aiter_meta/"


def checkout_path(installed: str) -> str:
    """The repository path of the file AITER's wheel installs at ``installed`` (relative to site-packages)."""
    return installed.removeprefix(WHEEL_META_DIR)


def editable_checkout(dist: dict) -> str | None:
    """The source tree of an editable install, or None for an installed wheel: pip install -e records it in
    ``direct_url.json`` (PEP 610, ``dir_info.editable``); setup.py develop leaves ``<checkout>/<name>.egg-info``,
    found on sys.path through its ``.egg-link`` / ``easy-install.pth``, beside the checkout's setup.py."""
    metadata_dir = dist["metadata_dir"]
    if metadata_dir.endswith(".egg-info"):
        return dist["location"] if os.path.isfile(os.path.join(dist["location"], "setup.py")) else None
    try:
        direct_url = json_loads(read_text(os.path.join(metadata_dir, "direct_url.json")))
    except (OSError, ValueError):
        return None
    url = direct_url.get("url", "") if isinstance(direct_url, dict) else ""
    if not (direct_url.get("dir_info") or {}).get("editable") or not url.startswith("file://"):
        return None
    return os.path.normpath(percent_decoded(url[len("file://"):]))


def percent_decoded(text: str) -> str:
    """A URL path with its ``%XX`` escapes decoded (UTF-8), others left as they are; by hand: urllib.parse costs the
    probe more than the rest of a develop host's probe."""
    pieces = text.encode("utf-8").split(b"%")
    decoded = [pieces[0]]
    for piece in pieces[1:]:
        escape = piece[:2]
        if len(escape) == 2 and all(byte in b"0123456789abcdefABCDEF" for byte in escape):
            decoded.append(bytes([int(escape, 16)]) + piece[2:])
        else:
            decoded.append(b"%" + piece)
    return b"".join(decoded).decode("utf-8", errors="replace")


class GitError(Exception):
    """git is missing, or could not read the checkout; the message says which, and where."""


def find_program(name: str) -> str | None:
    """``name`` on $PATH (as the shell finds it), or None."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    return None


def run_git(checkout: str, *args: str) -> str:
    """``git -C checkout ARGS``' stdout; GitError saying what went wrong and where."""
    git = find_program("git")
    if git is None:
        raise GitError(f"git is not installed (not on PATH), and the checkout's git HEAD is its pristine oracle: "
                       f"install git on the host")
    try:
        # --no-optional-locks: status must not rewrite the index of a checkout someone else owns.
        code, stdout, stderr = run_program([git, "--no-optional-locks", "-C", checkout, *args], timeout=120)
    except (OSError, TimeoutError) as error:
        raise GitError(f"git {args[0]} in {checkout}: {error}") from error
    if code != 0:
        raise GitError(f"git {args[0]} in {checkout} exited {code}: {stderr.strip()[-300:]} (the develop checkout "
                       f"must be a git work tree with a HEAD commit)")
    return stdout


def read_develop_aiter(distributions: dict, target_paths: Collection[str]) -> dict | None:
    """For an AITER installed in develop mode: its distribution entry turned to the checkout (``location``, its
    ``install_mode`` "develop", HEAD ``commit``, ``checkout_error``), and what a RECORD says of a wheel (in
    ``record_facts``' shape) from the blob ids of HEAD. None for an installed wheel, having read one small file."""
    dist = distributions.get("amd-aiter")
    checkout = editable_checkout(dist) if dist else None
    if checkout is None:
        return None
    dist.update(location=checkout, install_mode="develop", commit=None, checkout_error=None)
    facts: dict = {"paths": sorted(target_paths), "targets": {}, "hsa_rel": None, "gfx942": None}
    try:
        dist["commit"] = run_git(checkout, "rev-parse", "--verify", "HEAD^{commit}").strip()
        listing = run_git(checkout, "ls-tree", "-r", "-l", "-z", dist["commit"], "--", "hsa/gfx942",
                          *sorted({checkout_path(path) for path in target_paths}))
    except GitError as error:
        dist["checkout_error"] = str(error)
        return facts
    kernels, blobs = [], {}
    for row in listing.split("\0"):
        meta, _, path = row.partition("\t")
        fields = meta.split()
        if len(fields) != 4 or fields[1] != "blob" or fields[0] == "120000":  # symlinks are no kernel files
            continue
        if path.startswith("hsa/gfx942/"):
            kernels.append((path[len("hsa/gfx942/"):], GIT_BLOB + fields[2], fields[3]))
        else:
            blobs[path] = GIT_BLOB + fields[2]
    facts["targets"] = {path: blobs[checkout_path(path)] for path in target_paths if checkout_path(path) in blobs}
    if kernels:
        facts["hsa_rel"], facts["gfx942"] = "hsa", (digest_of_entries(kernels), len(kernels))
    return facts


def checkout_status(checkout: str) -> dict:
    """``git status`` of a develop checkout, as ``record_mismatches`` reports a RECORD comparison: tracked files
    that differ from HEAD or are gone, and untracked paths that are not ignored (our kernel trees among them)."""
    found: dict = {"git": checkout, "mismatched": [], "missing": [], "untracked": [], "error": None}
    try:
        # Submodules (AITER's 3rdparty/composable_kernel) hold nothing this tool writes: not walked.
        entries = run_git(checkout, "status", "--porcelain=v1", "-z", "--untracked-files=normal",
                          "--ignore-submodules=all").split("\0")
    except GitError as error:
        found["error"] = str(error)
        return found
    renamed_from = False
    for entry in entries:
        if renamed_from or not entry:  # with -z a rename's source path is an entry of its own
            renamed_from = False
            continue
        code, path = entry[:2], entry[3:]
        renamed_from = code[0] in "RC"
        found["untracked" if code == "??" else "missing" if "D" in code else "mismatched"].append(path)
    return found

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc imports collections: annotations only
    from collections.abc import Collection

"""What the probe finds of the machine and the login: the OS, the target Python and its environment's fingerprint
(shared filesystems), free space, the state directory's default for this login, and the places the run writes
that this login may not.
"""

from __future__ import annotations

import os
import pwd
import sys

from cdna2.host.checkouts import checkout_path
from cdna2.host.digests import read_text


def read_os() -> dict:
    release = {}
    if os.path.isfile("/etc/os-release"):
        for line in read_text("/etc/os-release").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                release[key] = value.strip().strip('"')
    uname = os.uname()
    return {
        "hostname": uname.nodename,
        "id": release.get("ID"),
        "version_id": release.get("VERSION_ID"),
        "pretty_name": release.get("PRETTY_NAME"),
        "kernel": uname.release,
        "machine": uname.machine,
    }


# Filesystems one directory of which many hosts mount (network and cluster filesystems, by /proc mountinfo type).
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph", "cifs", "smb3",
                                "glusterfs", "fuse.glusterfs", "panfs", "wekafs", "9p", "fuse.sshfs"})


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` lies on, from the mount whose mount point is its longest prefix."""
    try:
        text = read_text(mountinfo)
    except OSError:
        return None
    target, best, found = os.path.realpath(path), -1, None
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, found = len(point), line.split(" - ", 1)[1].split()[0]
    return found


def environment_fingerprint(prefix: str) -> str | None:
    """Which directory the environment is, as every host that mounts it sees it: the inode and mtime of its prefix
    and the inode of its lib/. On a network or cluster filesystem (NFS, Lustre, ...) one file shows the same inode
    on every client, and the device number, which differs per client, is left out; on a local filesystem the
    device is part of it, so containers from one image (overlayfs: the lower layer's inodes, a device per
    container) are each their own. Two local disks at the same path differ, unless cloned from one image and
    never written since."""
    try:
        top, lib = os.stat(prefix), os.stat(os.path.join(prefix, "lib"))
    except OSError:
        return None
    local = "" if filesystem_type(prefix) in SHARED_FILESYSTEMS else f":{top.st_dev}"
    return f"{top.st_ino}:{top.st_mtime_ns}:{lib.st_ino}{local}"


def read_python(target_python: str) -> dict:
    running = os.path.realpath(sys.executable)
    is_target = os.path.realpath(target_python) == running or sys.executable == target_python
    return {
        "path": sys.executable,
        "target": target_python,
        "target_exists": os.access(target_python, os.X_OK),
        "is_target": is_target,
        "version": sys.version.split()[0],
        "abi": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "prefix": sys.prefix,
        "fingerprint": environment_fingerprint(sys.prefix) if is_target else None,
    }


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged write could still use on the filesystem of ``path`` (or of its nearest parent)."""
    candidate = os.path.abspath(path)
    while not os.path.exists(candidate):
        if candidate == os.path.dirname(candidate):
            return None
        candidate = os.path.dirname(candidate)
    stats = os.statvfs(candidate)
    return stats.f_bavail * stats.f_frsize


# The tool's state directory of a root login (or one through sudo) when host data names none.
ROOT_STATE_DIR = "/var/lib/cdna2"


def default_state_dir(euid: int, environ: dict[str, str]) -> tuple[str, str]:
    """(path, where it comes from) of the tool's state directory when host data names none: ``/var/lib/cdna2`` for
    root; for any other login its XDG state directory, ``$XDG_STATE_HOME/cdna2`` (an absolute XDG_STATE_HOME only,
    as the XDG spec asks), else ``~/.local/state/cdna2`` (the home from the password database when HOME is unset)."""
    if euid == 0:
        return ROOT_STATE_DIR, "the default for root"
    user = pwd.getpwuid(euid).pw_name
    xdg = environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "cdna2"), f"$XDG_STATE_HOME of {user}"
    home = environ.get("HOME") or pwd.getpwuid(euid).pw_dir
    return os.path.join(home, ".local", "state", "cdna2"), f"the XDG state directory of {user} (~/.local/state)"


def _existing_ancestor(path: str) -> str:
    candidate = os.path.abspath(path)
    while not os.path.lexists(candidate) and candidate != os.path.dirname(candidate):
        candidate = os.path.dirname(candidate)
    return candidate


def write_refusal(path: str, user: str) -> str | None:
    """Why this login cannot create, rename or remove entries in the directory ``path`` (or, when it is absent, in
    the nearest existing directory above it, where it would be created), or None when it can."""
    directory = _existing_ancestor(path)
    try:
        info = os.stat(directory)
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError as error:
        return f"{directory}: cannot be inspected ({error.strerror})"
    if read_only:
        return f"{directory}: on a read-only filesystem"
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = f"uid {info.st_uid}"
    foreign = " (foreign-owned)" if info.st_uid != os.geteuid() else ""
    return f"{directory}: not writable by {user}: owner {owner}{foreign}, mode {oct(info.st_mode & 0o7777)[2:]}"


def sticky_refusal(path: str, user: str) -> str | None:
    """Why the file ``path`` cannot be replaced by a rename although its directory is writable: a sticky directory
    (mode +t) lets only the file's or the directory's owner replace it."""
    try:
        info, parent = os.lstat(path), os.stat(os.path.dirname(path))
    except OSError:
        return None
    euid = os.geteuid()
    if euid == 0 or not parent.st_mode & 0o1000 or euid in (info.st_uid, parent.st_uid):
        return None
    return (f"{path}: foreign-owned (uid {info.st_uid}) in the sticky directory {os.path.dirname(path)}: {user} may "
            f"not replace it")


def read_write_access(state_dir: str, python: dict, distributions: dict, aiter: dict | None,
                      patch_targets: dict) -> list[dict]:
    """Every place the run may write that this login cannot, each ``{"path", "why"}``, for the preflight to fail
    the host by name before anything changes: the state directory, the environment's site-packages and bin
    (pip), each distribution's metadata directory (pip replaces it), AITER's hsa/ and its gfx90a trees (the kernel
    swap renames and removes them), the directories of the patch targets, and each target file itself."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    directories = [state_dir]
    if python["is_target"]:
        directories += [os.path.join(python["prefix"], "bin"),
                        *sorted({dist["location"] for dist in distributions.values() if dist})]
    directories += sorted(dist["metadata_dir"] for dist in distributions.values()
                          if dist and dist.get("install_mode") != "develop")
    if aiter and aiter["hsa_root"]:
        directories.append(aiter["hsa_root"])
        for tree in ("gfx90a", ".gfx90a.previous"):
            root = os.path.join(aiter["hsa_root"], tree)
            directories += [top for top, _, _ in os.walk(root)] if os.path.isdir(root) else []
    files = []
    for package, found in patch_targets.items():
        develop = distributions[package].get("install_mode") == "develop"
        for rel, entry in found["files"].items():
            if entry is not None:  # a candidate file this version does not have is not written
                files.append(os.path.join(found["location"], checkout_path(rel) if develop else rel))
                directories.append(os.path.dirname(files[-1]))
    problems = {}
    for directory in dict.fromkeys(directories):
        why = write_refusal(directory, user)
        if why:
            problems.setdefault(why.partition(":")[0], why)
    for path in files:
        why = sticky_refusal(path, user)
        if why:
            problems.setdefault(path, why)
    return [{"path": path, "why": why} for path, why in problems.items()]

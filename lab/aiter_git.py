"""AITER's git history on this machine: where it is, and the version a build of a ref reports.

The lab's develop-mode hosts clone from it, the kernel tests build gfx942 trees from its tags and main, and release
qualification (releases/coverage.py) lays out every tag as the wheel installs it. It is the machine's mirror of
ROCm/aiter unless ``$CDNA2_AITER_GIT`` names another (bare) clone.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DEFAULT_AITER_GIT = "/work/.mirror/ROCm+aiter/repo"


class SourceMissing(RuntimeError):
    """A release's source (the AITER git clone, a wheel) is not available here; the message says how to get it."""


def aiter_git_dir() -> Path:
    """Where AITER's git history is looked for: $CDNA2_AITER_GIT, else the machine's mirror of ROCm/aiter."""
    return Path(os.environ.get("CDNA2_AITER_GIT") or DEFAULT_AITER_GIT)


def aiter_git() -> Path:
    path = aiter_git_dir()
    if not (path / "HEAD").is_file():
        raise SourceMissing(f"{path}: no AITER git directory; set CDNA2_AITER_GIT to a (bare) clone of ROCm/aiter")
    return path


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True).stdout


def aiter_version(git_dir: Path, ref: str) -> str:
    """The version a build of ``ref`` reports (AITER's version comes from setuptools_scm, default scheme): the tag's,
    or for a commit N after tag vX.Y.Z the next release's .devN with +g<sha>: main is 0.1.21.dev46+ge4048607a5."""
    described = git(git_dir, "describe", "--tags", "--match", "v[0-9]*", "--long", ref).decode().strip()
    tag, distance, sha = described.rsplit("-", 2)
    version = tag.removeprefix("v")
    if distance == "0":
        return version
    release = version.split(".post")[0].split(".")
    release[-1] = str(int(release[-1]) + 1)
    return f"{'.'.join(release)}.dev{distance}+{sha}"

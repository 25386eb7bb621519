"""AITER's git history on this machine: where it is, and the version a build of a ref reports.

The lab's develop-mode hosts clone from it, the kernel tests build gfx942 trees from its tags and main, and release
qualification (releases/coverage.py) lays out every tag as the wheel installs it. It is the bare clone of ROCm/aiter
that ``$CDNA2_AITER_GIT`` names; there is no default (where a clone lives is a fact of one machine): without it,
what needs the history says so, and the tests that need it skip with that reason.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SETTING = "CDNA2_AITER_GIT"


class SourceMissing(RuntimeError):
    """A release's source (the AITER git clone, a wheel) is not available here; the message says how to get it."""


def missing_reason() -> str | None:
    """Why AITER's git history cannot be used here (the setting is unset, or names no git directory), or None."""
    value = os.environ.get(SETTING)
    if not value:
        return (f"no AITER git history: {SETTING} is not set; set it to a bare clone of github.com/ROCm/aiter "
                "(git clone --bare)")
    if not (Path(value) / "HEAD").is_file():
        return f"no AITER git history: {SETTING}={value} is not a git directory; set it to a bare clone of ROCm/aiter"
    return None


def aiter_git() -> Path:
    """The git directory ``$CDNA2_AITER_GIT`` names; SourceMissing says why when it cannot be used."""
    reason = missing_reason()
    if reason:
        raise SourceMissing(reason)
    return Path(os.environ[SETTING])


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

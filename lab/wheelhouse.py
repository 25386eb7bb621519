"""The lab's wheelhouse: real wheels from PyPI, downloaded once and cached, and trees installed from them.

The simulated lab, the tests and the benchmarks all take their AITER, triton and vLLM from here, so a package is
fetched from the registry once per machine, never once per host or per test. The cache lives in ``$CDNA2_CACHE``
(default ``~/.cache/cdna2``): ``wheels/`` holds the downloaded files, ``trees/`` the ``pip install --target`` trees.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cdna2.cache import cache_lock, cache_root

# The real packages the project works against (the developers' guide, "What is real here").
AITER = "amd-aiter==0.1.7.post2.dev18"
TRITON_BROKEN = "triton==3.7.0"
TRITON_PINNED = "triton==3.7.1"
# CPU torch for the smoke tests' AITER and device test doubles (no ROCm torch exists here); in this machine's pip
# find-links, with its dependencies from the index.
TORCH_CPU = "torch==2.13.0+cpu"


# How long the index's answer to "which versions of X" is taken as current: CI asks at most once a day.
INDEX_ANSWER_MAX_AGE = 24 * 3600


class IndexUnavailable(RuntimeError):
    """The package index could not be asked (offline, or it refused); the message has pip's own words."""


def _pip(*args: str, quiet: bool = True) -> str:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *(["-q"] if quiet else []), *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def _dist_name(requirement: str) -> str:
    return requirement.split("==")[0].replace("-", "_").lower()


def _download(wheels_dir: Path, *arguments: str) -> None:
    """``pip download`` into ``wheels_dir`` such that each new wheel appears there whole, in one rename: pip copies
    a file into its download directory in place, where a reader outside the lock (``pip install --find-links``)
    could take half a wheel, and a killed download would leave one. pip works in a staging directory holding hard
    links to the wheels already here, which it skips as already downloaded."""
    staging = wheels_dir.with_name(f".wheels-download-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for cached in wheels_dir.glob("*.whl"):
            os.link(cached, staging / cached.name)
        _pip("download", "--only-binary=:all:", "-d", str(staging), *arguments)
        for downloaded in staging.glob("*.whl"):
            if not (wheels_dir / downloaded.name).exists():
                downloaded.rename(wheels_dir / downloaded.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def wheel(requirement: str, *, with_deps: bool = False) -> Path:
    """Return the cached wheel for an exact ``name==version`` requirement, downloading it first if needed.

    With ``with_deps`` its dependencies are downloaded into the same directory too (for a lab find-links index).
    """
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"wheel requirement {requirement!r} must pin an exact version (name==version)")
    wheels_dir = cache_root() / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{_dist_name(name)}-{version}-"
    with cache_lock("wheels"):
        found = sorted(p for p in wheels_dir.glob("*.whl") if p.name.lower().startswith(prefix))
        deps_marker = wheels_dir / f".deps-{_dist_name(name)}-{version}"
        if not found or (with_deps and not deps_marker.exists()):
            print(f"wheelhouse: downloading {requirement}{' with dependencies' if with_deps else ''}", file=sys.stderr)
            _download(wheels_dir, requirement, *([] if with_deps else ["--no-deps"]))
            if with_deps:
                deps_marker.touch()
            found = sorted(p for p in wheels_dir.glob("*.whl") if p.name.lower().startswith(prefix))
    if not found:
        raise RuntimeError(f"pip downloaded no wheel named {prefix}*.whl into {wheels_dir}")
    return found[-1]


@dataclass(frozen=True)
class IndexAnswer:
    versions: list[str]  # newest first, no pre-releases, as pip lists them
    asked: float  # when the index said so (epoch seconds)
    error: str | None = None  # why the index could not be asked now (versions are then the last answer kept)


def available_versions(name: str, max_age: float = INDEX_ANSWER_MAX_AGE) -> IndexAnswer:
    """The versions of ``name`` the package index serves, through ``pip index versions``, which honours this
    machine's pip configuration. The answer is kept in ``$CDNA2_CACHE/index/<name>.json`` and reused while younger
    than ``max_age`` seconds. When the index cannot be asked, the last answer kept comes back with the error; with
    none kept, IndexUnavailable."""
    answer = cache_root() / "index" / f"{_dist_name(name)}.json"
    kept = json.loads(answer.read_text()) if answer.is_file() else None
    if kept and time.time() - kept["asked"] < max_age:
        return IndexAnswer(kept["versions"], kept["asked"])
    try:
        out = _pip("index", "versions", name, "--retries", "0", "--timeout", "20", quiet=False)
        listed = next(line.split(":", 1)[1] for line in out.splitlines() if line.startswith("Available versions:"))
    except (RuntimeError, StopIteration) as error:
        said = str(error).strip().splitlines()[-1] if str(error).strip() else f"pip listed no versions of {name}"
        if kept:
            return IndexAnswer(kept["versions"], kept["asked"], said)
        raise IndexUnavailable(f"pip index versions {name}: {said}") from error
    kept = {"asked": time.time(), "versions": [version.strip() for version in listed.split(",") if version.strip()]}
    answer.parent.mkdir(parents=True, exist_ok=True)
    staging = answer.with_name(f".{answer.name}.{os.getpid()}")
    staging.write_text(json.dumps(kept))
    staging.rename(answer)  # whole or not at all, for a concurrent reader
    return IndexAnswer(kept["versions"], kept["asked"])


def installed_tree(requirement: str, *, with_deps: bool = False) -> Path:
    """Return a site-packages-like directory holding ``requirement`` installed with ``--no-deps``.

    With ``with_deps`` the tree holds its dependencies too (downloaded into the wheelhouse first). The tree (with
    its dist-info and RECORD) is built once and cached; callers must copy it before changing it.
    """
    source = wheel(requirement, with_deps=with_deps)
    tree = cache_root() / "trees" / (source.name.removesuffix(".whl") + ("+deps" if with_deps else ""))
    with cache_lock("trees"):
        if not (tree / ".complete").exists():
            staging = tree.with_name(tree.name + ".staging")
            shutil.rmtree(staging, ignore_errors=True)
            resolution = ["--no-index", "--find-links", str(source.parent)] if with_deps else ["--no-deps"]
            _pip("install", *resolution, "--no-compile", "--target", str(staging), str(source))
            (staging / ".complete").touch()
            shutil.rmtree(tree, ignore_errors=True)
            staging.rename(tree)
    return tree


def copy_subset(tree: Path, relatives, destination: Path) -> Path:
    """Copy ``tree``'s dist-info directories and those of ``relatives`` that exist, with their real bytes.

    Whole installed trees are 0.2-1 GB; the patch engine reads and writes only its target files and RECORD.
    """
    for dist_info in tree.glob("*.dist-info"):
        shutil.copytree(dist_info, destination / dist_info.name)
    for relative in relatives:
        source = tree / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)
    return destination


def controller_wheels(requirements: Path) -> Path:
    """A directory of wheels for every line of ``requirements`` (the controller's dependencies) and what they need,
    downloaded once per content of that file: a fresh controller install can then run offline from it."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    wheels_dir = cache_root() / "controller-wheels" / digest
    with cache_lock("controller-wheels"):
        if not (wheels_dir / ".complete").exists():
            wheels_dir.mkdir(parents=True, exist_ok=True)
            print(f"wheelhouse: downloading the controller's requirements ({requirements})", file=sys.stderr)
            _download(wheels_dir, "-r", str(requirements))
            (wheels_dir / ".complete").touch()
    return wheels_dir

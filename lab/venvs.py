"""The lab hosts' Python environments: real venvs at /opt/venv holding real PyPI packages from the wheelhouse.

A venv hard-codes its own path (script shebangs, pyvenv.cfg), so every venv here is built *at* /opt/venv: inside a
private mount namespace with the target directory bound over /opt/venv. One template per kind is built once per
machine under the wheelhouse cache (``<cache>/lab-venvs/``) and each host gets a hard-linked copy (``cp -al``). The
links are safe to share because nothing edits an installed file in place: pip unlinks a file before writing its
replacement and moves uninstalled files away, Python writes ``__pycache__`` entries through a temporary file and a
rename, and the cdna2 tool stages and renames. A change made on one host therefore never shows on another.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from lab import wheelhouse
from lab.kinds import BASE_PACKAGES, Kind

VENV_MOUNT = "/opt/venv"
# The hosts' interpreter: the distribution's Python, as on a real host (not the controller's pyenv build).
HOST_PYTHON = "/usr/bin/python3"

Progress = Callable[[str], None]


@functools.cache
def _host_python_version() -> str:
    result = subprocess.run([HOST_PYTHON, "-c", "import sys; print(sys.version.split()[0])"],
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _template_dir(label: str, packages: tuple[str, ...]) -> Path:
    # The key changes whenever the interpreter or the package set does, so a stale template is never reused.
    key = hashlib.sha256("\n".join((HOST_PYTHON, _host_python_version(), *packages)).encode()).hexdigest()[:12]
    return wheelhouse.cache_root() / "lab-venvs" / f"{label}-{key}"


def _pip_environment() -> dict[str, str]:
    """The environment for pip: this machine's pip configuration (extra indexes, find-links, constraints) ignored."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return environment


def _run_at_venv_mount(directory: Path, argv: list[str]) -> None:
    """Run argv in a private mount namespace where `directory` is mounted at /opt/venv (the mount point is made
    first: on a new machine nothing else has made it when the container tests build the first template)."""
    command = ["unshare", "-m", "--propagation", "private", "--",
               "sh", "-c", 'mkdir -p "$2" && mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(directory),
               VENV_MOUNT, *argv]
    result = subprocess.run(command, capture_output=True, text=True, env=_pip_environment())
    if result.returncode != 0:
        raise RuntimeError(f"building the lab venv in {directory} failed: {' '.join(argv)} "
                           f"(exit {result.returncode}):\n{result.stderr[-4000:]}")


def _pip_install(directory: Path, requirements: tuple[str, ...], *, no_deps: bool) -> None:
    wheels_dir = wheelhouse.cache_root() / "wheels"
    _run_at_venv_mount(directory, [f"{VENV_MOUNT}/bin/python", "-m", "pip", "install", "-q", "--no-index",
                                   "--find-links", str(wheels_dir), *(["--no-deps"] if no_deps else []),
                                   *requirements])


def _fetch_wheels(packages: tuple[str, ...], progress: Progress) -> None:
    """Make sure the wheelhouse holds every package (base packages with their dependencies)."""
    for requirement in packages:
        progress(f"wheelhouse: {requirement}")
        wheelhouse.wheel(requirement, with_deps=requirement in BASE_PACKAGES)


def _build(final: Path, progress: Progress, populate: Callable[[Path], None]) -> Path:
    """Build a template in a staging directory and rename it into place only once it is complete."""
    if final.exists():
        return final
    staging = final.with_name(final.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    populate(staging)
    staging.rename(final)
    progress(f"template ready: {final}")
    return final


def _base_template(progress: Progress) -> Path:
    def populate(staging: Path) -> None:
        progress(f"building base venv ({', '.join(BASE_PACKAGES)}; about 1 GB, once per machine) in {staging}")
        staging.mkdir(parents=True)
        _run_at_venv_mount(staging, [HOST_PYTHON, "-m", "venv", VENV_MOUNT])
        _pip_install(staging, BASE_PACKAGES, no_deps=False)

    return _build(_template_dir("base", BASE_PACKAGES), progress, populate)


def template_for(kind: Kind, progress: Progress) -> Path:
    """The kind's template venv (built at /opt/venv), building it and the shared base first if needed."""
    _fetch_wheels(kind.packages, progress)
    with wheelhouse.cache_lock("lab-venvs"):
        base = _base_template(progress)
        if kind.aiter_checkout:
            def populate_without_aiter(staging: Path) -> None:
                progress(f"building {kind.key} venv: base without the amd-aiter wheel (a checkout replaces it)")
                hard_link_copy(base, staging)
                _run_at_venv_mount(staging, [f"{VENV_MOUNT}/bin/python", "-m", "pip", "uninstall", "-q", "-y",
                                             "amd-aiter"])
                for left in staging.glob("lib/python3*/site-packages/aiter_meta"):  # pip leaves its empty dirs
                    shutil.rmtree(left)

            return _build(_template_dir(kind.key, (*kind.packages, f"-{wheelhouse.AITER}")), progress,
                          populate_without_aiter)
        if not kind.extra_packages:
            return base

        def populate(staging: Path) -> None:
            progress(f"building {kind.key} venv: base + {', '.join(kind.extra_packages)} (--no-deps)")
            hard_link_copy(base, staging)
            _pip_install(staging, kind.extra_packages, no_deps=True)

        return _build(_template_dir(kind.key, kind.packages), progress, populate)


def hard_link_copy(source: Path, destination: Path) -> None:
    """`cp -al`: a new directory tree whose files are hard links to the source's (same filesystem required)."""
    if os.stat(source).st_dev != os.stat(destination.parent).st_dev:
        raise RuntimeError(f"cannot hard-link {source} into {destination.parent}: they are on different filesystems; "
                           f"point CDNA2_CACHE at a directory on the same filesystem as the lab ({destination.parent})")
    subprocess.run(["cp", "-al", "--", str(source), str(destination)], check=True)


def provision_host_venv(kind: Kind, destination: Path, progress: Progress,
                        owner: tuple[int, int] | None = None) -> None:
    """Give a host its own venv (a hard-linked copy of its kind's template), unless it already has one. With
    ``owner`` (uid, gid) it is a real copy that user owns, file by file: a chown through hard links would change
    the template's files too."""
    if destination.exists():
        return
    template = template_for(kind, progress)
    staging = destination.with_name(destination.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if owner is None:
        hard_link_copy(template, staging)
    else:
        progress(f"copying the {kind.key} venv for its owner uid {owner[0]} (about 1.4 GB)")
        subprocess.run(["cp", "-a", "--", str(template), str(staging)], check=True)
        subprocess.run(["chown", "-R", "--no-dereference", f"{owner[0]}:{owner[1]}", "--", str(staging)], check=True)
    staging.rename(destination)


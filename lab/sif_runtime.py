"""A TEST DOUBLE for Apptainer/SingularityCE on lab hosts: the subset of ``apptainer`` the layer's launch line uses,
done with the kernel's own filesystems. Neither runtime is in Debian, so none can run here.

    apptainer --version
    apptainer exec [--overlay LAYER:ro] [--env KEY=VALUE]... [-B|--bind SRC[:DST[:ro|rw]]]... IMAGE COMMAND [ARGS]

``exec``: a private mount namespace (``unshare --mount``); the SIF's primary partition mounted read-only at its
offset (loop, SquashFS; cdna2/images/sif.py finds it), the layer's SquashFS as a read-only lower over it, both
stacked by overlayfs with no upper directory (whiteouts and opaque directories of the layer honoured as overlayfs
honours them), /proc, /dev, a private /tmp, the binds (their mount points from a lower directory of their own, as
the runtimes make theirs); then ``chroot`` and COMMAND as the calling user (``SUDO_UID`` when called through
sudo), with the caller's environment and the ``--env`` values. COMMAND's exit status is the stand-in's.
Its ``--version`` says it is this stand-in: verify.py's report carries that line as the runtime that ran the checks.

Not covered, because only the real runtimes can show it: squashfuse (SingularityCE's overlay reader), Apptainer's
own overlay set-up, user namespaces (this needs root to mount), the default binds ($HOME, the working directory).
``./lab/up --sif-runtime`` puts it on the hosts' PATH as ``apptainer`` (lab/hosts.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file by its launcher, which sets no PYTHONPATH the container would inherit
    sys.path.insert(0, str(REPO))

from cdna2.images.layer import ImageTargetError, mounted_root  # noqa: E402
from cdna2.images.sif import SifError  # noqa: E402
from lab.labstate import LabPaths, write_atomically  # noqa: E402

NAME = "apptainer"
VERSION_LINE = f"{NAME} version lab-stand-in (lab stand-in: kernel squashfs+overlayfs)"
NAMESPACE_MARK = "CDNA2_STAND_IN_NAMESPACE"
# What ./lab/up --sif-runtime binds over a host's /usr/local/sbin (empty on Debian, on the hosts' default PATH).
PATH_DIR = "/usr/local/sbin"
# Where a host sees this checkout (and its .venv), which runs the stand-in: a checkout under /tmp is not visible at
# its own path in a host's mount namespace (each host has a /tmp of its own).
CHECKOUT_MOUNT = "/opt/cdna2-lab-checkout"


def launcher_text() -> str:
    """The ``apptainer`` a lab host finds on its PATH: this file, run by this checkout's Python, both as the host sees
    them (at CHECKOUT_MOUNT)."""
    python = Path(sys.executable)
    if python.is_relative_to(REPO):  # bin/setup's .venv
        python = Path(CHECKOUT_MOUNT) / python.relative_to(REPO)
    stand_in = Path(CHECKOUT_MOUNT) / Path(__file__).resolve().relative_to(REPO)
    return (f"#!/bin/sh\n# lab stand-in for Apptainer (a test double): {__file__}\n"
            f'exec {python} -P {stand_in} "$@"\n')


def install(paths: LabPaths) -> dict[str, str]:
    """Writes the ``apptainer`` launcher into the lab's directory; returns the binds each host needs for it (mount
    point -> source): the launcher's directory on the hosts' PATH, and this checkout."""
    directory = paths.root / "sif-runtime"
    directory.mkdir(exist_ok=True)
    write_atomically(directory / NAME, launcher_text(), mode=0o755)
    for mount_point in (PATH_DIR, CHECKOUT_MOUNT):  # the hosts' binds need them (Debian has the first)
        Path(mount_point).mkdir(parents=True, exist_ok=True)
    return {PATH_DIR: str(directory), CHECKOUT_MOUNT: str(REPO)}


def _binds(values: list[str]) -> tuple[dict[str, Path], dict[str, Path]]:
    """``-B`` values (comma-separated lists allowed): (read-only, writable) binds, by path inside the container."""
    read_only, writable = {}, {}
    for value in (item for given in values for item in given.split(",") if item):
        source, _, rest = value.partition(":")
        target, _, mode = rest.partition(":")
        (read_only if mode == "ro" else writable)[target or source] = Path(source)
    return read_only, writable


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=NAME, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true")
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("exec")
    run.add_argument("--overlay", action="append", default=[], metavar="FILE:ro")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("-B", "--bind", action="append", default=[], metavar="SRC[:DST[:ro|rw]]")
    run.add_argument("image", type=Path)
    run.add_argument("argv", nargs=argparse.REMAINDER)
    return parser


def run_in_image(arguments: argparse.Namespace) -> int:
    if len(arguments.overlay) > 1 or any(not item.endswith(":ro") for item in arguments.overlay):
        raise ImageTargetError(f"the lab stand-in takes one --overlay FILE:ro, got {arguments.overlay}")
    layer = Path(arguments.overlay[0].removesuffix(":ro")) if arguments.overlay else None
    read_only, writable = _binds(arguments.bind)
    environment = {key: value for key, value in os.environ.items() if key != NAMESPACE_MARK}
    environment.update(item.split("=", 1) for item in arguments.env)
    uid, gid = int(os.environ.get("SUDO_UID", os.getuid())), int(os.environ.get("SUDO_GID", os.getgid()))

    def enter(root: Path):
        def child() -> None:
            os.chroot(root)
            os.chdir("/")
            os.setgid(gid)
            os.setuid(uid)
        return child

    with tempfile.TemporaryDirectory(prefix="lab-stand-in-") as scratch, \
            mounted_root(arguments.image, layer, Path(scratch), writable=False, binds=read_only,
                         writable_binds=writable) as root:
        return subprocess.run(arguments.argv, env=environment, preexec_fn=enter(root)).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    arguments = _parser().parse_args(argv)
    if arguments.version:
        print(VERSION_LINE)
        return 0
    if arguments.command != "exec" or not arguments.argv:
        print(f"{NAME} (lab stand-in): only `exec [options] IMAGE COMMAND [ARGS]` and --version", file=sys.stderr)
        return 255
    if os.geteuid() != 0:
        print(f"{NAME} (lab stand-in): mounts with the kernel's SquashFS and overlayfs, so it needs root",
              file=sys.stderr)
        return 255
    if os.environ.get(NAMESPACE_MARK) != "1":
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-P",
                               str(Path(__file__).resolve()), *argv], {**os.environ, NAMESPACE_MARK: "1"})
    try:
        return run_in_image(arguments)
    except (ImageTargetError, SifError) as error:
        print(f"{NAME} (lab stand-in): {arguments.image}: {error}", file=sys.stderr)
        return 255
    except FileNotFoundError as error:
        print(f"{NAME} (lab stand-in): {arguments.image}: no {error.filename} in the image", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())

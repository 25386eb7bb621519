"""A Singularity/Apptainer image as a deploy target: a read-only SquashFS layer beside the image, never inside it.

The image is read without a runtime: its primary partition (sif.py) is mounted read-only at its offset with the
kernel's SquashFS, under a writable overlay, in a mount namespace of this process's own (root only; the runtime does
the same with squashfuse or the kernel). The ordinary deploy then runs inside that root through pyinfra's ``@chroot``
connector (inventory/sif.py): the same probe, translation, patch plans, agent and smoke checks as on a host. What it
wrote, the overlay's upper directory (the gfx90a tree, the patched files, the records and the agent), is packed into
the layer with ``mksquashfs`` (reproducible: SOURCE_DATE_EPOCH, -all-root, -noappend; mksquashfs sorts each
directory). Scratch the run leaves (temporary files, caches, bytecode a read-only image cannot keep) is left out.

Beside ``NAME.sif`` the deploy writes ``NAME.gfx90a-layer.sqsh`` (the layer), ``NAME.gfx90a-layer.json`` (its record:
both files' SHA-256, what the layer holds, the launch line) and ``NAME.gfx90a-run.sh`` (the launch wrapper). The image
is hashed before and after: it is never written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cdna2 import __version__
from cdna2.host.digests import file_sha256
from cdna2.host.environment import ROOT_STATE_DIR
from cdna2.images import sif

REPO = Path(__file__).resolve().parents[2]
RECORD_FORMAT = 1
# Paths of the run's upper directory that are scratch, not the deploy's result: never in a layer.
SCRATCH = ("tmp", "var/tmp", "root/.cache", "var/cache", "var/lib/cdna2/lease.json")
BYTECODE_DIR = "__pycache__"
OVERLAY_XATTR = "trusted.overlay."
KEPT_OVERLAY_XATTRS = ("trusted.overlay.opaque", "trusted.overlay.redirect")
TARGET_PYTHON = "/opt/venv/bin/python"
# Inside the root, where the deploy's optional find-links directory is bound for a run: a mount point the image already
# has (Debian's empty /mnt), so binding it writes nothing to the upper directory.
WHEELS_MOUNT = "/mnt"
# AITER's JIT directory on the node, per user (a shell word: $HOME expands there); one subdirectory per layer.
JIT_ROOT = "$HOME/.cache/cdna2-aiter-jit"


class ImageTargetError(RuntimeError):
    """The image cannot get a layer (or the layer is not the one recorded): the message names the file and the fix."""


@dataclass(frozen=True)
class LayerFiles:
    """The files the tool keeps beside an image: rollback removes exactly these."""

    image: Path

    @property
    def stem(self) -> str:
        return self.image.name.removesuffix(".sif")

    @property
    def layer(self) -> Path:
        return self.image.with_name(f"{self.stem}.gfx90a-layer.sqsh")

    @property
    def record(self) -> Path:
        return self.image.with_name(f"{self.stem}.gfx90a-layer.json")

    @property
    def wrapper(self) -> Path:
        return self.image.with_name(f"{self.stem}.gfx90a-run.sh")

    def existing(self) -> list[Path]:
        return [path for path in (self.layer, self.record, self.wrapper) if path.exists()]


def read_record(files: LayerFiles) -> dict | None:
    if not files.record.exists():
        return None
    try:
        return json.loads(files.record.read_text())
    except (OSError, ValueError) as error:
        raise ImageTargetError(f"{files.record}: unreadable layer record ({error}); remove the layer with "
                               f"`python -m cdna2.images rollback {files.image}`") from error


def intact_layer(files: LayerFiles, image_sha256: str) -> dict | None:
    """The record of the layer beside the image when it is the one recorded for these image bytes; None when there
    is none. A layer changed since it was written, or one without its record, is refused by name."""
    record = read_record(files)
    if record is None:
        if files.layer.exists():
            raise ImageTargetError(f"{files.layer}: a layer with no record ({files.record} is missing): not written "
                                   f"by this tool, or its record was removed; move it away or remove it")
        return None
    if not files.layer.exists():
        raise ImageTargetError(f"{files.record}: records a layer that is gone ({files.layer}); run "
                               f"`python -m cdna2.images rollback {files.image}` to clear the record")
    found = file_sha256(files.layer)
    if found != record["layer_sha256"]:
        raise ImageTargetError(f"{files.layer}: edited since it was written (SHA-256 {found[:16]}, recorded "
                               f"{record['layer_sha256'][:16]} in {files.record}); run `python -m cdna2.images "
                               f"rollback {files.image}` and deploy again")
    if record["image_sha256"] != image_sha256:
        return None  # written for other image bytes: the deploy writes a new one
    return record


# --- Mounts: the stand-in for the runtime -------------------------------------------------------------------------

def enter_private_namespace(argv: list[str]) -> None:
    """Re-run this command in a mount namespace of its own (mounts vanish with it, the host's view never changes)."""
    if os.environ.get("CDNA2_IMAGES_NAMESPACE") == "1":
        return
    if os.geteuid() != 0:
        raise ImageTargetError("mounting an image's root needs root (the kernel's SquashFS and overlay filesystems "
                               "stand in for the container runtime here): run as root")
    if shutil.which("unshare") is None or shutil.which("mksquashfs") is None:
        raise ImageTargetError("unshare (util-linux) and mksquashfs (squashfs-tools) are needed: bin/setup installs "
                               "them")
    environment = dict(os.environ, CDNA2_IMAGES_NAMESPACE="1")
    os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
                           "cdna2.images", *argv], environment)


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageTargetError(f"mount {' '.join(args)} failed: {result.stderr.strip()}")


@contextmanager
def mounted_root(image: Path, layer: Path | None, scratch: Path, writable: bool,
                 binds: dict[str, Path] | None = None, writable_binds: dict[str, Path] | None = None) -> Iterator[Path]:
    """The image's root with ``layer`` over it, as an overlay (with an upper directory at scratch/upper when
    ``writable``), plus /proc, /dev and a private /tmp: the runtime's view. ``binds`` (read-only) go where the image
    has a directory; ``writable_binds`` (a runtime's ``--bind``) get their mount point from a top lower directory of
    their own where the image has none, as the runtimes make theirs, the root staying read-only. Unmounted on exit."""
    partition = sif.squashfs_root(image)
    lowers = []
    mounted: list[Path] = []
    try:
        if not writable:  # overlayfs needs two lowers without an upper: this one, empty but for the mount points
            points = scratch / "mount-points"
            points.mkdir()
            for target in writable_binds or {}:
                (points / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
            lowers.append(str(points))
        for name, source, offset in (("layer", layer, 0), ("image", image, partition.offset)):
            if source is None:
                continue
            point = scratch / name
            point.mkdir()
            _mount("-t", "squashfs", "-o", f"loop,ro,offset={offset}", str(source), str(point))
            mounted.append(point)
            lowers.append(str(point))
        root = scratch / "root"
        root.mkdir()
        options = f"lowerdir={':'.join(lowers)},xino=on"
        if writable:
            (scratch / "upper").mkdir()
            (scratch / "work").mkdir()
            options += f",upperdir={scratch / 'upper'},workdir={scratch / 'work'}"
        _mount("-t", "overlay", "overlay", "-o", options, str(root))
        mounted.append(root)
        for inside, how in (("proc", ("-t", "proc", "proc")), ("dev", ("--rbind", "/dev")),
                            ("tmp", ("-t", "tmpfs", "tmpfs")), ("var/tmp", ("-t", "tmpfs", "tmpfs")),
                            *((target.lstrip("/"), ("--bind", "-o", "ro", str(source)))
                              for target, source in (binds or {}).items()),
                            *((target.lstrip("/"), ("--bind", str(source)))
                              for target, source in (writable_binds or {}).items())):
            if not (root / inside).is_dir():
                continue  # an image without /proc (say): nothing the deploy needs from it
            _mount(*how, str(root / inside))
            mounted.append(root / inside)
        yield root
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True)


def image_python(root: Path, python: str) -> Path:
    """The image's interpreter, resolved inside the root (a venv's python is a symlink into the image's /usr)."""
    path = root / python.lstrip("/")
    for _ in range(16):
        if not path.is_symlink():
            break
        target = os.readlink(path)
        path = (root / target.lstrip("/")) if target.startswith("/") else (path.parent / target)
    return path


def site_packages(root: Path, python: str) -> Path | None:
    prefix = root / python.lstrip("/").rsplit("/bin/", 1)[0]
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def environment_problem(image: Path, root: Path, python: str, needs_aiter: bool) -> str | None:
    """Why the image cannot be provisioned as it is (no Python, no AITER), by path; None when it can."""
    interpreter = image_python(root, python)
    if not interpreter.is_file():
        return (f"{image}: the image has no Python at {python} (nor at its link target): nothing to provision; "
                "name the image's interpreter with --python")
    site = site_packages(root, python)
    if site is None:
        return f"{image}: {python} has no site-packages in the image"
    if needs_aiter and not any(site.glob("amd_aiter-*.dist-info")):
        return (f"{image}: no amd-aiter in {site.relative_to(root)} inside the image; --wheels DIR carries the "
                "wheel matrix's AITER and triton in the layer")
    return None


# --- The run's result: upper directory -> layer -------------------------------------------------------------------

def prune_scratch(upper: Path) -> list[str]:
    """Remove the run's scratch from the upper directory and directories left empty; the paths that remain."""
    for name in SCRATCH:
        path = upper / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for directory, subdirectories, _ in os.walk(upper, topdown=False):
        for name in subdirectories:
            path = Path(directory) / name
            if name == BYTECODE_DIR and not path.is_symlink():
                shutil.rmtree(path)
    for directory, _, _ in os.walk(upper, topdown=False):
        path = Path(directory)
        if path != upper and not any(path.iterdir()) and not _opaque(path):
            path.rmdir()
    return sorted(str(path.relative_to(upper)) for path in upper.rglob("*") if not path.is_dir())


def strip_overlay_bookkeeping(upper: Path) -> None:
    """Drop the xattrs overlayfs keeps for its own upper directory (origin, impure, the instance's random uuid):
    they mean nothing in a layer mounted as a lower one, and differ from run to run. Opaque directories and
    redirects (what a lower layer's reader needs) stay; whiteouts are device files, not xattrs."""
    for directory, subdirectories, names in os.walk(upper):
        for path in (directory, *(os.path.join(directory, name) for name in subdirectories + names)):
            for attribute in os.listxattr(path, follow_symlinks=False):
                if attribute.startswith(OVERLAY_XATTR) and attribute not in KEPT_OVERLAY_XATTRS:
                    os.removexattr(path, attribute, follow_symlinks=False)


def _opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque") == b"y"
    except OSError:
        return False


def pin_record_times(upper: Path, epoch: int) -> None:
    """The deploy's state record in a layer carries the layer's time (SOURCE_DATE_EPOCH), not the run's, so the same
    image gives the same layer. The kernel tree's stat signature goes too: inodes and times of a tree in a layer
    change with every mount, so the probe reads the tree's content digest instead."""
    path = upper / ROOT_STATE_DIR.lstrip("/") / "state.json"
    if not path.is_file():
        return
    state = json.loads(path.read_text())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    if state.get("kernels"):
        state["kernels"].update(installed=stamp, stat_signature=None)
    if state.get("smoke"):
        state["smoke"]["at"] = stamp
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def pack_layer(tree: Path, destination: Path, epoch: int, compressor: str = "gzip") -> None:
    """``mksquashfs`` of a tree (a run's result): the same tree and epoch give the same bytes. gzip, mksquashfs'
    default, is the compressor every SquashFS reader has."""
    result = subprocess.run(["mksquashfs", str(tree), str(destination), "-noappend", "-all-root", "-no-progress",
                             "-quiet", "-comp", compressor],
                            capture_output=True, text=True, env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
    if result.returncode != 0:
        raise ImageTargetError(f"mksquashfs {tree} -> {destination} failed (exit {result.returncode}): "
                               f"{result.stderr[-2000:]}")


def launch_wrapper(files: LayerFiles, layer_sha256: str) -> str:
    """The wrapper that runs the image with its layer: ``NAME.gfx90a-run.sh exec|run|shell [ARGS]``."""
    return f"""#!/bin/sh
# Runs {files.image.name} with its gfx90a layer as a read-only overlay (written by cdna2-provision {__version__};
# `python -m cdna2.images rollback` removes this file with the layer). AITER JIT-builds into a directory per user
# and per layer, outside the read-only image.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
image="$here/{files.image.name}"
layer="$here/{files.layer.name}"
runtime=${{CDNA2_RUNTIME:-$(command -v singularity || command -v apptainer || echo singularity)}}
jit="${{XDG_CACHE_HOME:-$HOME/.cache}}/cdna2-aiter-jit/{layer_sha256[:16]}"
mkdir -p "$jit"
command=${{1:-run}}
[ "$#" -gt 0 ] && shift
exec "$runtime" "$command" --overlay "$layer:ro" --bind "$jit" --env "AITER_JIT_DIR=$jit" \\
    --env VLLM_ROCM_USE_AITER_FP4BMM=0 --env VLLM_ROCM_USE_AITER_FP8BMM=0 "$image" "$@"
"""


def launch_arguments(layer: str, image: str, jit: str) -> list[str]:
    """The runtime's ``exec``/``run`` options and the image: the layer read-only, AITER's JIT directory ``jit``
    bound and named, the FP4/FP8 BMM paths gfx90a lacks off. The record's launch line and the runtime check
    (cdna2/images/runtime.py) both run these."""
    return ["--overlay", f"{layer}:ro", "--bind", jit, "--env", f"AITER_JIT_DIR={jit}",
            "--env", "VLLM_ROCM_USE_AITER_FP4BMM=0", "--env", "VLLM_ROCM_USE_AITER_FP8BMM=0", image]


def launch_line(files: LayerFiles, layer_sha256: str) -> str:
    jit = f"{JIT_ROOT}/{layer_sha256[:16]}"
    return " ".join(["singularity", "exec", *launch_arguments(str(files.layer), str(files.image), jit), "python ..."])


def place(files: LayerFiles, packed: Path, record: dict, wrapper: str) -> None:
    """Stage the layer, its record and its wrapper beside the image, then rename them in; nothing stays on failure
    (no room, say)."""
    needed = packed.stat().st_size + len(wrapper) + 65536
    free = shutil.disk_usage(files.image.parent).free
    if free < needed:
        raise ImageTargetError(f"{files.layer}: no space for the layer: it needs {needed} bytes, "
                               f"{files.image.parent} has {free} free; free some space or move the image")
    staged = [(files.layer, files.layer.with_name(f".{files.layer.name}.staging")),
              (files.record, files.record.with_name(f".{files.record.name}.staging")),
              (files.wrapper, files.wrapper.with_name(f".{files.wrapper.name}.staging"))]
    try:
        shutil.copyfile(packed, staged[0][1])
        staged[1][1].write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        staged[2][1].write_text(wrapper)
        staged[2][1].chmod(0o755)
        for final, staging in staged:
            with staging.open("rb") as stream:
                os.fsync(stream.fileno())
            os.replace(staging, final)
    except OSError as error:
        for _, staging in staged:
            staging.unlink(missing_ok=True)
        raise ImageTargetError(f"{files.layer}: could not write the layer beside the image: "
                               f"{error.strerror or error}; nothing was left there") from error


def rollback(image: Path) -> list[Path]:
    """Remove the layer, its record and its wrapper; the paths removed."""
    files = LayerFiles(Path(image).resolve())
    removed = files.existing()
    for path in removed:
        path.unlink()
    return removed


@dataclass
class Outcome:
    image: str
    status: str  # "written", "unchanged" or "dry"
    detail: str
    layer: str | None = None
    layer_sha256: str | None = None
    image_sha256: str | None = None
    files: list[str] | None = None
    launch: str | None = None
    deploy_output: str = ""


def run_deploy(root: Path, play: str, dry: bool, wheels: Path | None, matrix: Path | None, python: str,
               report_dir: Path) -> subprocess.CompletedProcess:
    """``pyinfra -y inventory/sif.py PLAY`` with pyinfra's @chroot connector on ``root``."""
    environment = dict(os.environ, CDNA2_SIF_ROOT=str(root), CDNA2_SIF_PYTHON=python, PYINFRA_PROGRESS="off",
                       CDNA2_REPORT_DIR=str(report_dir))
    if wheels:
        environment["CDNA2_SIF_WHEELS"] = WHEELS_MOUNT
    if matrix:
        environment["CDNA2_SIF_WHEEL_MATRIX"] = str(Path(matrix).resolve())
    # pyinfra runs operation bodies (which log the patch diffs) at prepare only without -y: all of --dry.
    command = [sys.executable, "-m", "pyinfra", "--dry" if dry else "-y", "inventory/sif.py", play]
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


def _failure_reasons(output: str) -> str:
    """What pyinfra's output says stopped the deploy (the operation's error, or pyinfra's own), once each."""
    reasons = [line.split("OperationError: ", 1)[1] for line in output.splitlines()
               if line.startswith("pyinfra.api.exceptions.OperationError: ")]
    reasons += [line.removeprefix("--> pyinfra error").lstrip(" :") for line in output.splitlines()
                if line.startswith("--> pyinfra error") and "No hosts remaining" not in line]
    return "; ".join(dict.fromkeys(reasons)) or "see its output below"


def _left_for_next_run(report_dir: Path) -> bool:
    """Whether the run's report says packages it installed are to be translated and patched by the next run."""
    latest = report_dir / "latest.json"
    if not latest.exists():
        return False
    report = json.loads(latest.read_text())
    latest.unlink()  # the next run writes its own
    return any("run the deploy again" in step.get("detail", "") for row in report["hosts"]
               for step in row["steps"].values())


def deploy(image: Path, dry: bool = False, wheels: Path | None = None, matrix: Path | None = None,
           python: str = TARGET_PYTHON, progress=print) -> Outcome:
    """Give ``image`` its layer (or show what it would be with ``dry``). Run inside enter_private_namespace."""
    image = Path(image).resolve()
    files = LayerFiles(image)
    sif.squashfs_root(image)  # refuses what is not a readable SIF before anything else
    image_sha256 = file_sha256(image)
    record = intact_layer(files, image_sha256)
    epoch = sif.read_sif(image).modified or 1
    with tempfile.TemporaryDirectory(prefix="cdna2-image-") as scratch_name:
        scratch = Path(scratch_name)
        outcome = _deploy_in(image, files, record, dry, wheels, matrix, python, scratch, epoch, image_sha256,
                             progress)
    if file_sha256(image) != image_sha256:
        raise ImageTargetError(f"{image}: the image's bytes changed during the run: this tool never writes it; "
                               "something else did")
    outcome.image_sha256 = image_sha256
    return outcome


def _deploy_in(image: Path, files: LayerFiles, record: dict | None, dry: bool, wheels: Path | None,
               matrix: Path | None, python: str, scratch: Path, epoch: int, image_sha256: str, progress) -> Outcome:
    # An intact layer is deployed over: when that changes nothing, the layer stays as it is. When it would change,
    # the layer is written afresh from the image alone (a layer holds one run's result, never a stack of them).
    for base in ((files.layer, None) if record else (None,)):
        attempt = scratch / ("over-layer" if base else "fresh")
        attempt.mkdir()
        binds = {WHEELS_MOUNT: wheels} if wheels else {}
        with mounted_root(image, base, attempt, writable=True, binds=binds) as root:
            problem = environment_problem(image, root, python, needs_aiter=wheels is None and base is None)
            if problem:
                raise ImageTargetError(f"{problem}; nothing was written beside the image")
            output = ""
            # A run whose wheels step (re)installs AITER or vLLM translates and patches them on the next run: the
            # layer holds the result of both.
            for _ in range(2):
                progress(f"images: deploying inside {image.name}{' over its layer' if base else ''}"
                         f"{' (dry run)' if dry else ''}")
                result = run_deploy(root, "deploy.py", dry, wheels, matrix, python, scratch / "reports")
                output += result.stdout + result.stderr
                if result.returncode != 0 or dry or not _left_for_next_run(scratch / "reports"):
                    break
        if result.returncode != 0:
            raise ImageTargetError(f"{image}: the deploy inside the image failed: {_failure_reasons(output)}; "
                                   f"nothing was written beside the image. Its output ends:\n{output[-4000:]}")
        changed = prune_scratch(attempt / "upper")
        if dry:
            return Outcome(str(image), "dry", "preview only (the deploy's report above): nothing written",
                           deploy_output=output)
        if base and not changed:
            return Outcome(str(image), "unchanged", "the layer is current: nothing changed", str(files.layer),
                           record["layer_sha256"], files=record["files"], launch=record["launch"],
                           deploy_output=output)
        if base:
            continue
        if not changed:
            raise ImageTargetError(f"{image}: the deploy changed nothing inside the image (already provisioned "
                                   "for gfx90a?): no layer written")
        packed = scratch / "layer.sqsh"
        pin_record_times(attempt / "upper", epoch)
        strip_overlay_bookkeeping(attempt / "upper")
        pack_layer(attempt / "upper", packed, epoch)
        layer_sha256 = file_sha256(packed)
        if record and record["layer_sha256"] == layer_sha256:
            return Outcome(str(image), "unchanged", "the same layer again", str(files.layer), layer_sha256,
                           files=changed, launch=record["launch"], deploy_output=output)
        launch = launch_line(files, layer_sha256)
        place(files, packed, {"format": RECORD_FORMAT, "tool_version": __version__, "image": files.image.name,
                              "image_sha256": image_sha256, "layer": files.layer.name, "layer_sha256": layer_sha256,
                              "layer_bytes": packed.stat().st_size, "source_date_epoch": epoch, "files": changed,
                              "wrapper": files.wrapper.name, "launch": launch},
              launch_wrapper(files, layer_sha256))
        return Outcome(str(image), "written", f"{files.layer.name}: {len(changed)} files", str(files.layer),
                       layer_sha256, files=changed, launch=launch, deploy_output=output)
    raise AssertionError("unreachable: the fresh attempt returns or raises")

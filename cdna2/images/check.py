"""Check an image with its layer as the runtime would see it: the static smoke checks and ``patch check``.

The image's root and the layer are mounted as a read-only overlay (the layer on top, no upper directory: nothing can
be written), and both checks run inside that root with the image's own Python: the smoke test from the agent the
layer carries (``<state_dir>/agent``), ``patch check`` from this checkout bound read-only at /media with the
controller's own dependencies (PyYAML, jsonschema) bound at /srv, so the controller's Python must be the image's
minor version. GPU checks are skipped with their reason: no GPU runs under this stand-in for the runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from cdna2.host.digests import file_sha256
from cdna2.host.environment import ROOT_STATE_DIR
from cdna2.images.layer import (REPO, ImageTargetError, LayerFiles, image_python, intact_layer, mounted_root,
                                site_packages)

# Mount points Debian-based images have, empty: this checkout and the controller's dependencies are bound there.
CHECKOUT_MOUNT, DEPENDENCIES_MOUNT = "/media", "/srv"
NO_GPU = "no GPU: the image is mounted by the kernel's SquashFS and overlay, standing in for the runtime"


def _in_root(root: Path, python: str, pythonpath: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["chroot", str(root), "/usr/bin/env", "-i", f"PYTHONPATH={pythonpath}", "HOME=/root",
                           "PATH=/usr/local/bin:/usr/bin:/bin", python, "-B", *args],
                          capture_output=True, text=True, timeout=1800)


def _python_minor(root: Path, python: str) -> str:
    result = _in_root(root, python, "", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
    return result.stdout.strip()


def check_image(image: Path, python: str) -> dict:
    """Mount image + layer read-only, run the static smoke checks and ``patch check`` inside; their results."""
    image = Path(image).resolve()
    files = LayerFiles(image)
    record = intact_layer(files, file_sha256(image))
    if record is None:
        raise ImageTargetError(f"{files.layer}: no layer for these image bytes: run `python -m cdna2.images deploy "
                               f"{image}` first")
    controller_site = Path(sysconfig.get_paths()["purelib"])
    with tempfile.TemporaryDirectory(prefix="cdna2-image-check-") as scratch, \
            mounted_root(image, files.layer, Path(scratch), writable=False,
                         binds={CHECKOUT_MOUNT: REPO,
                                DEPENDENCIES_MOUNT: controller_site}) as root:
        if not image_python(root, python).is_file():
            raise ImageTargetError(f"{image}: no Python at {python} in the image")
        site = "/" + str(site_packages(root, python).relative_to(root))
        minor = _python_minor(root, python)
        smoke = _in_root(root, python, f"{ROOT_STATE_DIR}/agent", "-m", "cdna2.host.smoke", "--site-packages", site,
                         "--state-dir", ROOT_STATE_DIR, "--host-arch", "gfx90a", "--no-gpu", NO_GPU, "--json")
        controller_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if minor != controller_minor:
            patch = None
            patch_error = (f"patch check needs the controller's Python minor version in the image ({controller_minor}"
                           f", the image has {minor}): not run")
        else:
            patch = _in_root(root, python, f"{CHECKOUT_MOUNT}:{DEPENDENCIES_MOUNT}", "-m", "cdna2", "patch", "check",
                             "--site-packages", site, "--json")
            patch_error = None if patch.returncode == 0 else (patch.stderr.strip() or patch.stdout)[-2000:]
    smoke_report = _json_or_none(smoke.stdout)
    passed = smoke.returncode == 0 and smoke_report is not None and patch_error is None
    summary = (f"{image.name} + {files.layer.name} (Python {minor} of the image): static smoke "
               f"{'passed' if smoke.returncode == 0 else 'FAILED'}"
               + (f" ({smoke_report['passed']} passed, {smoke_report['skipped']} skipped)" if smoke_report else "")
               + f", patch check {'passed' if patch_error is None else 'FAILED: ' + patch_error}")
    return {"image": str(image), "layer": str(files.layer), "python": minor, "status": "ok" if passed else "failed",
            "smoke": smoke_report, "smoke_stderr": smoke.stderr[-3000:],
            "patch_check": _json_or_none(patch.stdout) if patch else None, "patch_error": patch_error,
            "summary": summary}


def _json_or_none(text: str) -> dict | None:
    try:
        return json.loads(text)
    except ValueError:
        return None

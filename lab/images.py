"""The lab's base image: a local stand-in for a ROCm vLLM image, built once and cached by a content key.

No registry is reachable here, so the image is made from parts built on this machine, with no network in any
container: a Debian root with python3 (``mmdebstrap``, cached as a tarball), the lab's ``mi210-rocm7`` venv at
/opt/venv (real amd-aiter 0.1.7.post2.dev18 and its dependencies, triton 3.7.0, vllm 0.26.0, from the lab's
wheelhouse: lab/venvs.py), a ROCm stand-in like the lab hosts' (lab/kinds.py) whose rocminfo, like the real one,
finds no GPU without ``/dev/kfd``, and the triton 3.7.1 wheel in /opt/wheels for the deploy's wheels step (a
container has no network; the image inventory points ``wheel_find_links`` there). Everything is streamed into
``docker import``; the tag names the content key, so a changed part builds a new image and an unchanged one is
reused as long as the engine's data directory lives.

    python -m lab.images build    # prints the base image's tag (DOCKER_HOST must name the engine)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from cdna2.images.containers import Engine
from lab import kinds, mirror, venvs, wheelhouse
from lab.engine import EngineUnavailable
from lab.labstate import progress, write_atomically

SUITE, VARIANT, INCLUDE = "bookworm", "apt", "python3"
KIND = kinds.kind_by_key("mi210-rocm7")
REPOSITORY = "local/cdna2-base"
WHEELS_IN_IMAGE = "/opt/wheels"
IMAGE_PATH = "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def images_dir() -> Path:
    return wheelhouse.cache_root() / "images"


def _apt_sources_text() -> str:
    files = [path for source in APT_SOURCES if source.exists()
             for path in ([source] if source.is_file() else sorted(source.iterdir())) if path.is_file()]
    return "".join(path.read_text() for path in files)


def debian_root() -> Path:
    """A Debian root with python3 as a tarball, built with mmdebstrap from this machine's apt sources, once."""
    key = hashlib.sha256("\n".join((SUITE, VARIANT, INCLUDE, _apt_sources_text())).encode()).hexdigest()[:12]
    tarball = images_dir() / f"debian-{SUITE}-{INCLUDE}-{key}.tar"
    with wheelhouse.cache_lock("images"):
        if not tarball.is_file():
            if shutil.which("mmdebstrap") is None:
                raise EngineUnavailable("no image builder: mmdebstrap not found (bin/setup installs it)")
            progress(f"images: mmdebstrap {SUITE} with {INCLUDE} (25-75 s) -> {tarball}")
            staging = tarball.with_suffix(".staging")
            # Earlier versions let mmdebstrap infer the format from the name, and ".staging" made it a directory,
            # later renamed to the tarball's name: such a directory, or a staging left by a failed run, goes.
            for leftover in (tarball, staging):
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink(missing_ok=True)
            images_dir().mkdir(parents=True, exist_ok=True)
            result = subprocess.run(["mmdebstrap", "--quiet", "--format=tar", f"--variant={VARIANT}",
                                     f"--include={INCLUDE}", SUITE, str(staging)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"mmdebstrap failed (exit {result.returncode}): {result.stderr[-3000:]}")
            staging.rename(tarball)
    return tarball


def rocminfo_script(kind: kinds.Kind) -> str:
    """The image's stand-in rocminfo: like the real one, it lists the GPUs only where /dev/kfd exists."""
    return (
        "#!/bin/sh\n"
        f"# {kinds.STAND_IN_NOTE}\n"
        "# Without /dev/kfd (an image build, a container started without --device=/dev/kfd) it fails as the real\n"
        f"# rocminfo does; with it, it prints a fixed listing for: {kind.gpu.marketing_name} ({kind.gpu.arch}).\n"
        "if [ ! -e /dev/kfd ]; then\n"
        "    echo 'ROCk module is loaded'\n"
        "    echo 'Unable to open /dev/kfd read-write: No such file or directory' >&2\n"
        "    echo 'hsa api call failure at: rocminfo.cc:1306' >&2\n"
        "    echo 'Call returned HSA_STATUS_ERROR_OUT_OF_RESOURCES' >&2\n"
        "    exit 1\n"
        "fi\n"
        "cat <<'ROCMINFO_END'\n"
        f"{kinds.rocminfo_output(kind)}"
        "ROCMINFO_END\n"
    )


def _stand_in_files(kind: kinds.Kind) -> dict[str, tuple[str, int]]:
    return {"opt/rocm/.info/version": (kinds.rocm_version_file(kind), 0o644),
            "opt/rocm/STAND-IN": (kinds.STAND_IN_NOTE + "\n", 0o644),
            "opt/rocm/bin/rocminfo": (rocminfo_script(kind), 0o755)}


def _add_text(archive: tarfile.TarFile, name: str, text: str, mode: int) -> None:
    data = text.encode()
    member = tarfile.TarInfo(name)
    member.size, member.mode = len(data), mode
    archive.addfile(member, io.BytesIO(data))


def base_image(engine: Engine) -> str:
    """The base image's tag, importing the image into ``engine`` first when it lacks it."""
    root = debian_root()
    venv = venvs.template_for(KIND, progress)
    wheels = [wheelhouse.wheel(wheelhouse.TRITON_PINNED)]
    stand_in = _stand_in_files(KIND)
    key = hashlib.sha256(content_key(root, venv, wheels, stand_in).encode()).hexdigest()[:12]
    tag = f"{REPOSITORY}:{key}"
    with wheelhouse.cache_lock("images"):
        if engine.image_id(tag) is None:
            progress(f"images: importing {tag} (Debian root, {KIND.key} venv, ROCm stand-in, triton wheel)")
            _import(engine, tag, root, venv, wheels, stand_in)
    return tag


def content_key(root: Path, venv: Path, wheels: list[Path], stand_in: dict[str, tuple[str, int]]) -> str:
    # The root tarball and the venv template are named by their own content keys; the rest is spelled out here. The
    # root's size too: an image imported from a root that was not a whole tarball must not be reused by its tag.
    return "\n".join([root.name, str(root.stat().st_size), venv.name, *(wheel.name for wheel in wheels), IMAGE_PATH,
                      *(f"{name} {mode:o} {text}" for name, (text, mode) in sorted(stand_in.items()))])


def _import(engine: Engine, tag: str, root: Path, venv: Path, wheels: list[Path],
            stand_in: dict[str, tuple[str, int]]) -> None:
    command = [engine.command, "import", "--change", f"ENV {IMAGE_PATH}", "--change", 'CMD ["/bin/bash"]', "-", tag]
    with tempfile.TemporaryFile() as errors, tarfile.open(root) as debian:  # the root opens before any import starts
        importer = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
        try:
            with importer.stdin as stream, tarfile.open(fileobj=stream, mode="w|") as archive:
                for member in debian:
                    archive.addfile(member, debian.extractfile(member) if member.isfile() else None)
                archive.add(venv, arcname="opt/venv")
                for wheel in wheels:
                    archive.add(wheel.resolve(), arcname=f"{WHEELS_IN_IMAGE.lstrip('/')}/{wheel.name}")
                for name, (text, mode) in stand_in.items():
                    _add_text(archive, name, text, mode)
        except BrokenPipeError:
            pass  # the importer stopped reading: its exit status and message say why
        except BaseException:
            # The stream was cut short: an image of what got through must not be tagged (the tag is the cache key,
            # so it would be reused as it is).
            importer.kill()
            importer.wait()
            if engine.image_id(tag) is not None:
                engine.remove_image(tag)
            raise
        if importer.wait() != 0:
            errors.seek(0)
            raise RuntimeError(f"{' '.join(command)} failed (exit {importer.returncode}): "
                               f"{errors.read().decode(errors='replace')[-3000:]}")


def wheel_matrix() -> Path:
    """The lab's wheel matrix (lab/mirror.py) as a controller file, for the image inventory's ``wheel_matrix``."""
    path = images_dir() / "wheel-matrix.yaml"
    text = mirror.matrix_yaml(mirror.lab_rocm_versions())
    if not path.exists() or path.read_text() != text:
        images_dir().mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.images", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build",))
    parser.parse_args(argv)
    print(base_image(Engine()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

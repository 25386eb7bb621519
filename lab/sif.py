"""The lab's Singularity images: a Debian root with the lab's venv at /opt/venv, packed as a .sif, cached by content.

No Singularity/Apptainer exists here to build an image, so the tests build one the way the format allows without
it: the root directory (the Debian root of lab/images.py, a venv template of lab/venvs.py at /opt/venv, the ROCm
stand-in) goes through ``mksquashfs`` (reproducible: SOURCE_DATE_EPOCH, -all-root, -noappend), and ``pack_sif``
wraps that SquashFS in a SIF file. ``pack_sif`` is a test helper written from the format's specification (the
layout sylabs/sif defines in pkg/sif/sif.go and descriptor.go): it is not a runtime's builder and writes only what a
runtime reads to find the root (the header, one primary system partition descriptor, the partition).

    python -m lab.sif build [--without-aiter]    # prints the cached image's path
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from cdna2.images import sif
from cdna2.images.layer import pack_layer
from lab import images, kinds, venvs, wheelhouse
from lab.labstate import progress

DESCRIPTOR_SLOTS = 48  # the slots sylabs' own builder reserves
DESCRIPTORS_OFFSET = 4096
PARTITION_ALIGNMENT = 4096
EPOCH = 1700000000  # every timestamp the test images carry: the same root gives the same bytes
# The test images' 2 GB roots pack several times faster with lz4 than with gzip; the kernel reads both.
COMPRESSOR = "lz4"
WITHOUT_AITER_KIND = kinds.DEVELOP_KIND  # its venv template is the base one with the amd-aiter wheel uninstalled


def pack_sif(squashfs: Path, destination: Path, arch: bytes = b"02") -> None:
    """Write ``destination``: a SIF 01 file whose primary system partition is ``squashfs`` (test helper, from the
    specification: 128-byte header, 585-byte descriptors from byte 4096, data after them, the partition aligned)."""
    data_offset = DESCRIPTORS_OFFSET + DESCRIPTOR_SLOTS * sif.DESCRIPTOR.size
    partition_offset = -(-data_offset // PARTITION_ALIGNMENT) * PARTITION_ALIGNMENT
    size = squashfs.stat().st_size
    header = sif.HEADER.pack(b"#!/usr/bin/env run-singularity\n", sif.MAGIC, sif.VERSION, arch + b"\0", bytes(16),
                             EPOCH, EPOCH, DESCRIPTOR_SLOTS - 1, DESCRIPTOR_SLOTS, DESCRIPTORS_OFFSET,
                             DESCRIPTOR_SLOTS * sif.DESCRIPTOR.size, data_offset,
                             partition_offset + size - data_offset)
    extra = sif.PARTITION_EXTRA.pack(sif.FS_SQUASHFS, sif.PART_PRIMARY_SYSTEM, arch + b"\0")
    descriptor = sif.DESCRIPTOR.pack(sif.DATA_PARTITION, True, 1, 1 | sif.GROUP_MASK, 0, partition_offset, size,
                                     partition_offset + size - data_offset, EPOCH, EPOCH, 0, 0, b"root.squashfs",
                                     extra)
    staging = destination.with_name(destination.name + ".staging")
    with staging.open("wb") as out, squashfs.open("rb") as source:
        out.write(header)
        out.seek(DESCRIPTORS_OFFSET)
        out.write(descriptor)
        out.write(bytes((DESCRIPTOR_SLOTS - 1) * sif.DESCRIPTOR.size))
        out.write(bytes(partition_offset - data_offset))
        shutil.copyfileobj(source, out)
    staging.rename(destination)


def venv_sif(with_aiter: bool = True) -> Path:
    """The cached test image: the Debian root, the lab's venv (with or without amd-aiter), the ROCm stand-in."""
    root = images.debian_root()
    kind = images.KIND if with_aiter else WITHOUT_AITER_KIND
    venv = venvs.template_for(kind, progress)
    stand_in = images._stand_in_files(images.KIND)
    content = f"sif 2 {COMPRESSOR}\n" + images.content_key(root, venv, [], stand_in)
    key = hashlib.sha256(content.encode()).hexdigest()[:12]
    image = images.images_dir() / f"{'aiter' if with_aiter else 'no-aiter'}-{key}.sif"
    with wheelhouse.cache_lock("images"):
        if not image.is_file():
            progress(f"images: packing {image.name} (Debian root, {kind.key} venv, ROCm stand-in) with mksquashfs")
            with tempfile.TemporaryDirectory(dir=images.images_dir()) as scratch:
                tree = Path(scratch) / "root"
                tree.mkdir()
                subprocess.run(["tar", "-xf", str(root), "-C", str(tree), "--exclude=./dev/*"], check=True)
                shutil.copytree(venv, tree / "opt/venv", symlinks=True)
                for name, (text, mode) in stand_in.items():
                    path = tree / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    path.chmod(mode)
                squashfs = Path(scratch) / "root.squashfs"
                pack_layer(tree, squashfs, EPOCH, compressor=COMPRESSOR)
                pack_sif(squashfs, image)
    return image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.sif", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build",))
    parser.add_argument("--without-aiter", action="store_true", help="the venv without the amd-aiter wheel")
    arguments = parser.parse_args(argv)
    print(venv_sif(with_aiter=not arguments.without_aiter))
    return 0


if __name__ == "__main__":
    sys.exit(main())

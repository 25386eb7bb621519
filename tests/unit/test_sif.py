"""The SIF reader (cdna2/images/sif.py) on real sylabs/sif test images and on SIFs packed by the lab's test helper
written from the specification (lab/sif.py), and its refusals of files that are not readable SIFs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cdna2.images import sif
from lab.sif import DESCRIPTORS_OFFSET, pack_sif

SYLABS = Path(__file__).parent / "fixtures" / "sylabs-sif"


def test_sylabs_one_group_image_has_its_squashfs_root_where_sylabs_put_it():
    image = sif.read_sif(SYLABS / "one-group.sif")
    assert image.arch == "386" and len(image.descriptors) == 2
    system, primary = image.descriptors
    assert system.partition == (sif.FS_RAW, sif.PART_SYSTEM, "386") and (system.offset, system.size) == (32768, 4)
    assert primary.partition == (sif.FS_SQUASHFS, sif.PART_PRIMARY_SYSTEM, "386") and primary.group == 1
    root = sif.squashfs_root(SYLABS / "one-group.sif")
    assert (root.offset, root.size) == (36864, 4096)
    with (SYLABS / "one-group.sif").open("rb") as stream:
        stream.seek(root.offset)
        assert stream.read(4) == sif.SQUASHFS_MAGIC


def test_a_signed_sylabs_image_reads_the_same_root_and_lists_its_signature():
    image = sif.read_sif(SYLABS / "one-group-signed-pgp.sif")
    assert [d.data_type for d in image.descriptors] == [sif.DATA_PARTITION, sif.DATA_PARTITION, 0x4005]
    assert sif.squashfs_root(image.path).offset == 36864


@pytest.mark.parametrize("name", ["empty.sif", "one-object-generic-json.sif"])
def test_sylabs_images_without_a_root_are_refused_by_name(name):
    image = sif.read_sif(SYLABS / name)
    with pytest.raises(sif.SifError, match=f"{name}: a SIF image, but with no primary system partition"):
        image.primary_partition()


@pytest.mark.skipif(shutil.which("unsquashfs") is None, reason="unsquashfs (squashfs-tools, bin/setup) is missing")
def test_the_sylabs_root_is_a_squashfs_unsquashfs_lists_at_the_offset_read(tmp_path):
    root = sif.squashfs_root(SYLABS / "one-group.sif")
    partition = tmp_path / "root.squashfs"
    partition.write_bytes((SYLABS / "one-group.sif").read_bytes()[root.offset:root.offset + root.size])
    listing = subprocess.run(["unsquashfs", "-l", str(partition)], capture_output=True, text=True, check=True)
    assert "squashfs-root/hello.txt" in listing.stdout


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, bytes]:
    """A SIF packed by the specification-written test helper around the sylabs image's own SquashFS."""
    root = sif.squashfs_root(SYLABS / "one-group.sif")
    squashfs = (SYLABS / "one-group.sif").read_bytes()[root.offset:root.offset + root.size]
    directory = tmp_path_factory.mktemp("packed")
    (directory / "root.squashfs").write_bytes(squashfs)
    pack_sif(directory / "root.squashfs", directory / "packed.sif")
    return directory / "packed.sif", squashfs


def test_the_reader_reads_the_helpers_sif_alike(packed):
    path, squashfs = packed
    image = sif.read_sif(path)
    assert image.arch == "amd64" and len(image.descriptors) == 1
    root = sif.squashfs_root(path)
    assert root.partition == (sif.FS_SQUASHFS, sif.PART_PRIMARY_SYSTEM, "amd64") and root.offset % 4096 == 0
    assert path.read_bytes()[root.offset:root.offset + root.size] == squashfs


def _damaged(tmp_path: Path, source: Path, edit) -> Path:
    data = bytearray(source.read_bytes())
    data = edit(data)
    path = tmp_path / "damaged.sif"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda data: b"#!/bin/sh\necho not an image\n", "not a SIF file"),
    (lambda data: bytes(200), r"not a SIF file \(no SIF_MAGIC at byte 32\)"),
    (lambda data: data[:100], "truncated SIF file: 100 bytes, its header alone is 128"),
    (lambda data: data[:DESCRIPTORS_OFFSET + 300], "truncated SIF file: its descriptors end at byte"),
    (lambda data: data[:-1000], "truncated SIF file: its data end at byte"),
    (lambda data: data[:42] + b"00\0" + data[45:], "SIF version '00', only version 01 is read"),
])
def test_files_that_are_not_readable_sifs_are_refused_naming_the_file(tmp_path, packed, edit, message):
    path = _damaged(tmp_path, packed[0], edit)
    with pytest.raises(sif.SifError, match=message) as error:
        sif.squashfs_root(path)
    assert str(error.value).startswith(f"{path}: ")


def test_a_partition_that_is_not_squashfs_is_refused(tmp_path, packed):
    def garble(data: bytearray) -> bytearray:
        root = sif.squashfs_root(packed[0])
        data[root.offset:root.offset + 4] = b"XXXX"
        return data
    with pytest.raises(sif.SifError, match="does not start with a SquashFS superblock"):
        sif.squashfs_root(_damaged(tmp_path, packed[0], garble))

"""Read a Singularity Image Format (.sif) file without a container runtime: its header, its descriptors, and where
its primary system partition (the image's root, a SquashFS) lies.

The layout (little-endian, packed) is the one sylabs/sif defines (pkg/sif/sif.go, descriptor.go): a 128-byte global
header, then ``descriptors total`` descriptors of 585 bytes each at ``descriptors offset``, then the data objects.
Only version "01" is read, as current runtimes do. Every check names the file and what is wrong with it; nothing is
written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"
HEADER = struct.Struct("<32s10s3s3s16s8q")  # launch script, magic, version, arch, UUID, then eight int64s
DESCRIPTOR = struct.Struct("<i?III3q4q128s384s")  # type, used, ID, group, link, offset, size, padded, 4 times, name
PARTITION_EXTRA = struct.Struct("<ii3s")  # fstype, partition type, arch
DATA_PARTITION = 0x4004
FS_SQUASHFS, FS_EXT3, FS_ARCHIVE, FS_RAW, FS_ENCRYPTED_SQUASHFS = 1, 2, 3, 4, 5
PART_SYSTEM, PART_PRIMARY_SYSTEM, PART_DATA, PART_OVERLAY = 1, 2, 3, 4
GROUP_MASK = 0xF0000000
SQUASHFS_MAGIC = b"hsqs"
SQUASHFS_BYTES_USED = struct.Struct("<q")  # at byte 40 of a SquashFS 4 superblock
ARCHES = {b"00": "unknown", b"01": "386", b"02": "amd64", b"03": "arm", b"04": "arm64", b"05": "ppc64",
          b"06": "ppc64le", b"07": "mips", b"08": "mipsle", b"09": "mips64", b"10": "mips64le", b"11": "s390x",
          b"12": "riscv64", b"13": "loong64"}
FS_NAMES = {FS_SQUASHFS: "SquashFS", FS_EXT3: "ext3", FS_ARCHIVE: "archive", FS_RAW: "raw",
            FS_ENCRYPTED_SQUASHFS: "encrypted SquashFS"}


class SifError(ValueError):
    """The file is not a SIF this tool can read; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Descriptor:
    data_type: int
    id: int
    group: int  # 0 for no group, else the group's number (the on-disk value without GROUP_MASK)
    linked: int
    offset: int
    size: int
    name: str
    extra: bytes

    @property
    def partition(self) -> tuple[int, int, str] | None:
        """(fstype, partition type, arch) of a partition descriptor, else None."""
        if self.data_type != DATA_PARTITION:
            return None
        fstype, part_type, arch = PARTITION_EXTRA.unpack_from(self.extra)
        return fstype, part_type, ARCHES.get(arch.rstrip(b"\0"), "unknown")


@dataclass(frozen=True)
class SifImage:
    path: Path
    arch: str
    uuid: str
    created: int
    modified: int
    descriptors: tuple[Descriptor, ...]

    def primary_partition(self) -> Descriptor:
        """The primary system partition: the image's root file system, which must be a SquashFS."""
        found = [d for d in self.descriptors if d.partition and d.partition[1] == PART_PRIMARY_SYSTEM]
        if not found:
            raise SifError(f"{self.path}: a SIF image, but with no primary system partition (its descriptors: "
                           f"{', '.join(describe(d) for d in self.descriptors) or 'none'}): nothing to run")
        primary = found[0]
        fstype = primary.partition[0]
        if fstype != FS_SQUASHFS:
            raise SifError(f"{self.path}: the primary partition is {FS_NAMES.get(fstype, f'fstype {fstype}')}, not "
                           "an unencrypted SquashFS: only SquashFS roots are read (decrypt or rebuild the image)")
        return primary


def describe(descriptor: Descriptor) -> str:
    partition = descriptor.partition
    kind = (f"partition {FS_NAMES.get(partition[0], partition[0])} type {partition[1]}" if partition
            else f"type {descriptor.data_type:#x}")
    return f"#{descriptor.id} {kind} at {descriptor.offset}+{descriptor.size}"


def read_sif(path: Path) -> SifImage:
    """The header and used descriptors of ``path``, checked against the file's real size."""
    path = Path(path)
    try:
        with path.open("rb") as stream:
            size = stream.seek(0, 2)
            stream.seek(0)
            head = stream.read(HEADER.size)
            if len(head) < HEADER.size:
                if head[32:42] != MAGIC[:len(head[32:42])] or len(head) < 42:
                    raise SifError(f"{path}: not a SIF file ({size} bytes, shorter than a SIF header)")
                raise SifError(f"{path}: truncated SIF file: {size} bytes, its header alone is {HEADER.size}")
            (_launch, magic, version, arch, uuid, created, modified, _free, total, descriptors_offset,
             descriptors_size, data_offset, data_size) = HEADER.unpack(head)
            if magic != MAGIC:
                raise SifError(f"{path}: not a SIF file (no SIF_MAGIC at byte 32)")
            if version != VERSION:
                shown = version.rstrip(b"\0").decode(errors="replace")
                raise SifError(f"{path}: SIF version {shown!r}, only version 01 is read (the format current runtimes "
                               "load)")
            if total < 0 or descriptors_offset < HEADER.size or descriptors_size < total * DESCRIPTOR.size:
                raise SifError(f"{path}: corrupt SIF header: {total} descriptors of {DESCRIPTOR.size} bytes do not fit "
                               f"{descriptors_size} bytes at {descriptors_offset}")
            for what, end in (("descriptors", descriptors_offset + total * DESCRIPTOR.size),
                              ("data", data_offset + data_size)):
                if end > size:
                    raise SifError(f"{path}: truncated SIF file: its {what} end at byte {end}, the file has {size}")
            stream.seek(descriptors_offset)
            table = stream.read(total * DESCRIPTOR.size)
    except OSError as error:
        raise SifError(f"{path}: cannot read: {error.strerror or error}") from error
    descriptors = []
    for index in range(total):
        (data_type, used, ident, group, linked, offset, object_size, _padded, *_times, name,
         extra) = DESCRIPTOR.unpack_from(table, index * DESCRIPTOR.size)
        if not used:
            continue
        if offset < 0 or object_size < 0 or offset + object_size > size:
            raise SifError(f"{path}: truncated SIF file: object #{ident} ends at byte {offset + object_size}, the "
                           f"file has {size}")
        descriptors.append(Descriptor(data_type, ident, group & ~GROUP_MASK, linked, offset, object_size,
                                      name.rstrip(b"\0").decode(errors="replace"), extra))
    return SifImage(path, ARCHES.get(arch.rstrip(b"\0"), "unknown"), uuid.hex(), created, modified,
                    tuple(descriptors))


def squashfs_root(path: Path) -> Descriptor:
    """The image's root partition, checked to hold a whole SquashFS (its superblock's size within the partition)."""
    partition = read_sif(path).primary_partition()
    with Path(path).open("rb") as stream:
        stream.seek(partition.offset)
        superblock = stream.read(48)
    if superblock[:4] != SQUASHFS_MAGIC:
        raise SifError(f"{path}: the primary partition at byte {partition.offset} does not start with a SquashFS "
                       "superblock")
    (bytes_used,) = SQUASHFS_BYTES_USED.unpack_from(superblock, 40)
    if bytes_used > partition.size:
        raise SifError(f"{path}: the SquashFS at byte {partition.offset} says it is {bytes_used} bytes, its partition "
                       f"holds {partition.size}: truncated or corrupt")
    return partition

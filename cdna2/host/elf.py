"""The few ELF facts of an AMDGPU code object the translator reads and changes, checked before they are trusted.

Standard library only: the translator (controller) and the smoke test (host) read code objects the same way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EM_AMDGPU = 224
E_FLAGS_OFFSET = 0x30
MACH_MASK = 0xFF
MACH_GFX942 = 0x4C
MACH_GFX90A = 0x3F
MACH_NAMES = {MACH_GFX942: "gfx942", MACH_GFX90A: "gfx90a"}
# The amdhsa target triple in the code object metadata; only the processor changes, and both names are 6 bytes.
TARGET_GFX942 = b"amdgcn-amd-amdhsa--gfx942"
TARGET_GFX90A = b"amdgcn-amd-amdhsa--gfx90a"

_ELF_HEADER_SIZE = 64
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")


class ElfError(ValueError):
    """The file is not a well-formed 64-bit little-endian AMDGPU code object."""


@dataclass(frozen=True)
class CodeObject:
    e_flags: int
    text_offset: int  # file offset of .text
    text_address: int  # virtual address of .text
    text_size: int

    @property
    def mach(self) -> int:
        return self.e_flags & MACH_MASK

    @property
    def mach_name(self) -> str:
        return mach_name(self.mach)


def mach_name(mach: int) -> str:
    """``gfx90a``, ``gfx942``, or ``mach 0x..`` for another AMDGPU machine."""
    return MACH_NAMES.get(mach, f"mach 0x{mach:02x}")


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    address: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entry_size: int

    @property
    def file_size(self) -> int:
        return 0 if self.type == SHT_NOBITS else self.size


@dataclass(frozen=True)
class Symbol:
    name: str
    info: int  # binding << 4 | type
    other: int  # visibility
    section: int  # section index, or SHN_ABS
    value: int
    size: int

    @property
    def binding(self) -> int:
        return self.info >> 4

    @property
    def kind(self) -> int:
        return self.info & 0xF


SHT_SYMTAB, SHT_NOBITS = 2, 8
SHN_ABS = 0xFFF1
_SYMBOL = struct.Struct("<IBBHQQ")


def _check_header(data: bytes) -> None:
    if len(data) < _ELF_HEADER_SIZE or data[:4] != b"\x7fELF":
        raise ElfError(f"not an ELF file or truncated header ({len(data)} bytes)")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF")
    (e_machine,) = struct.unpack_from("<H", data, 0x12)
    if e_machine != EM_AMDGPU:
        raise ElfError(f"e_machine is {e_machine}, not EM_AMDGPU ({EM_AMDGPU})")


def sections(data: bytes) -> list[Section]:
    """The section header table, names resolved, refusing anything truncated or out of bounds."""
    _check_header(data)
    (section_table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    if entry_size != _SECTION_HEADER.size or count == 0 or names_index >= count:
        raise ElfError(f"bad section header table (entry size {entry_size}, {count} entries)")
    if section_table + count * entry_size > len(data):
        raise ElfError(f"truncated: section header table ends at {section_table + count * entry_size:#x}, "
                       f"file is {len(data):#x} bytes")
    headers = [_SECTION_HEADER.unpack_from(data, section_table + i * entry_size) for i in range(count)]
    names_offset, names_size = headers[names_index][4], headers[names_index][5]
    if names_offset + names_size > len(data):
        raise ElfError("truncated: section name table lies past the end of the file")
    result = []
    for name, kind, flags, address, offset, size, link, info, align, entry in headers:
        section = Section(_name(data, names_offset, names_size, name).decode(errors="replace"), kind, flags,
                          address, offset, size, link, info, align, entry)
        if section.offset + section.file_size > len(data):
            raise ElfError(f"truncated: {section.name} ends at {section.offset + section.file_size:#x}, "
                           f"file is {len(data):#x} bytes")
        result.append(section)
    return result


def symbols(data: bytes, table: list[Section]) -> list[Symbol]:
    """The entries of .symtab after the null symbol, in file order."""
    symtabs = [s for s in table if s.type == SHT_SYMTAB]
    if len(symtabs) != 1:
        raise ElfError(f"expected one symbol table, found {len(symtabs)}")
    symtab = symtabs[0]
    strings = table[symtab.link]
    result = []
    for offset in range(symtab.offset + _SYMBOL.size, symtab.offset + symtab.size, _SYMBOL.size):
        name, info, other, section, value, size = _SYMBOL.unpack_from(data, offset)
        result.append(Symbol(_name(data, strings.offset, strings.size, name).decode(errors="replace"), info, other,
                             section, value, size))
    return result


def read_code_object(data: bytes) -> CodeObject:
    """Parse the header and locate .text, refusing anything truncated or out of bounds."""
    table = sections(data)
    (e_flags,) = struct.unpack_from("<I", data, E_FLAGS_OFFSET)
    texts = [s for s in table if s.name == ".text"]
    if len(texts) != 1:
        raise ElfError(f"expected one .text section, found {len(texts)}")
    return CodeObject(e_flags=e_flags, text_offset=texts[0].offset, text_address=texts[0].address,
                      text_size=texts[0].size)


def _name(data: bytes, table: int, table_size: int, index: int) -> bytes:
    if index >= table_size:
        raise ElfError("name index lies outside its string table")
    end = data.find(b"\0", table + index, table + table_size)
    if end < 0:
        raise ElfError("unterminated name in a string table")
    return data[table + index:end]


def text_of(data: bytes, code_object: CodeObject) -> bytes:
    return data[code_object.text_offset:code_object.text_offset + code_object.text_size]


def retarget_to_gfx90a(data: bytearray, code_object: CodeObject) -> None:
    """Set the ELF machine to gfx90a (feature bits kept) and rename the metadata target.

    The target string is replaced outside .text only, so no instruction byte can be touched by it.
    """
    struct.pack_into("<I", data, E_FLAGS_OFFSET, (code_object.e_flags & ~MACH_MASK) | MACH_GFX90A)
    text_start, text_end = code_object.text_offset, code_object.text_offset + code_object.text_size
    start = 0
    while (found := data.find(TARGET_GFX942, start)) >= 0:
        if not text_start <= found < text_end:
            data[found:found + len(TARGET_GFX942)] = TARGET_GFX90A
        start = found + 1

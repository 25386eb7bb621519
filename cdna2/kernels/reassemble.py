"""Re-assembly: a code object is turned back into assembly source, built again by llvm-mc and ld.lld, and what only
the original's linker wrote is restored, so that code can move (an `s_nop` inserted, one instruction replaced by
several) with every branch still landing on the same instruction.

rebuild() runs the stages in this order, per kernel:
1. read: sections, symbols and the instructions of .text; every branch target computed from its encoding (objdump's
   `<L_end0+0x634>`-style labels are never parsed);
2. source: runs of unchanged instructions as their encodings (`.incbin` of the re-encoded .text, so the assembler
   cannot pick another encoding), branches as their mnemonic and a label at the target, the planned edits as
   instruction text, the original symbols at their (moved) addresses with their binding, type,
   visibility and, only where the original had one, `.size`; the kernel descriptor as its 64 bytes with the code
   entry offset emitted as `.quad NAME@rel64 - NAME.kd` (objdump's `.amdhsa_kernel` directives do not re-assemble
   as printed: the assembler adds its own SGPRs to `.amdhsa_next_free_sgpr`); the metadata note as its bytes;
3. assemble (llvm-mc -filetype=obj) and link (ld.lld -shared);
4. restore what the original's linker and compiler wrote and ours do not: the `.comment` string, LLD 17's layout
   without a `.relro_padding` section, non-allocated compiler sections (`.AMDGPU.gpr_maximums`; DWARF only when no
   code moved).

With no edit the output is byte-identical to the input; tests/unit/kernels/test_reassemble.py proves it on whole
AITER trees.
"""

from __future__ import annotations

import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import isa, llvm

# Allocated sections ld.lld makes itself, and those the source reproduces; any other allocated section is refused.
LINKER_SECTIONS = {"", ".dynsym", ".gnu.hash", ".hash", ".dynstr", ".dynamic", ".relro_padding"}
SOURCE_SECTIONS = {".note", ".rodata", ".text", ".bss"}
LINKED_TABLES = {".symtab", ".strtab", ".shstrtab"}  # the link's own non-allocated sections that are kept
LINKER_SYMBOLS = {"_DYNAMIC"}
SHT_NULL, SHF_ALLOC = 0, 0x2
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
KERNEL_DESCRIPTOR_SIZE = 64
ENTRY_OFFSET_FIELD = 16  # kernel_code_entry_byte_offset: int64, the entry point relative to the descriptor
# e_ident[EI_ABIVERSION] -> code object version (AMDGPUUsage: ELFABIVERSION_AMDGPU_HSA_V4/V5/V6).
CODE_OBJECT_VERSIONS = {2: 4, 3: 5, 4: 6}
_BINDINGS = {0: None, 1: ".globl", 2: ".weak"}
_TYPES = {0: "@notype", 1: "@object", 2: "@function"}
_VISIBILITY = {0: None, 1: ".internal", 2: ".hidden", 3: ".protected"}
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
PT_LOAD = 1


class ReassemblyError(RuntimeError):
    """The kernel cannot be rebuilt as planned; the message says why (the kernel is reported, not written)."""


@dataclass(frozen=True)
class Edit:
    """At original instruction `index`: `insert` puts `texts` before it, `replace` puts them in its place.

    Labels and branches that named the instruction name the first instruction of its new group, so inserted
    instructions run on every path into it (what padding needs)."""
    index: int
    kind: str  # "insert" | "replace"
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    relpath: str
    source: str  # the original code object
    target: str  # where the rebuilt one is written
    mcpu: str  # gfx942 for the round trip, gfx90a for translated kernels
    encodings: dict[bytes, bytes] | None = None  # original instruction -> bytes emitted instead (None: the same)
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True)
class Rebuilt:
    relpath: str
    error: str | None = None  # None: written to the job's target


@dataclass
class _Kernel:
    data: bytes
    sections: list[elf.Section]
    symbols: list[elf.Symbol]
    text: elf.Section
    instructions: list[bytes]
    starts: list[int]  # .text offset of each instruction, plus the end


def _read(data: bytes) -> _Kernel:
    table = elf.sections(data)
    unknown = sorted({s.name for s in table if s.flags & SHF_ALLOC} - LINKER_SECTIONS - SOURCE_SECTIONS)
    if unknown:
        raise ReassemblyError(f"sections the re-assembler does not reproduce: {', '.join(unknown)}")
    texts = [s for s in table if s.name == ".text"]
    if len(texts) != 1:
        raise ReassemblyError(f"expected one .text section, found {len(texts)}")
    text = texts[0]
    instructions = isa.split_instructions(data[text.offset:text.offset + text.size])
    return _Kernel(data, table, elf.symbols(data, table), text, instructions, isa.offsets(instructions))


# --- stage 2: source ------------------------------------------------------------------------------------------------

def _bytes_directive(data: bytes) -> list[str]:
    return [".byte " + ",".join(map(str, data[i:i + 64])) for i in range(0, len(data), 64)]


def _align(section: elf.Section) -> str:
    if section.align & (section.align - 1):
        raise ReassemblyError(f"{section.name} alignment {section.align} is not a power of two")
    return f".p2align {max(section.align, 1).bit_length() - 1}"


def _symbol_lines(kernel: _Kernel) -> list[str]:
    """Declarations in the original symbol-table order: the assembler registers symbols as it first meets them, and
    the linker keeps that order. A .text symbol's size is the distance to a label, so it follows moved code."""
    text_index = kernel.sections.index(kernel.text)
    lines = []
    for number, symbol in enumerate(kernel.symbols):
        if symbol.name in LINKER_SYMBOLS:
            continue
        if symbol.binding not in _BINDINGS or symbol.kind not in _TYPES or symbol.other not in _VISIBILITY:
            raise ReassemblyError(f"symbol {symbol.name}: binding {symbol.binding}, type {symbol.kind}, "
                                  f"visibility {symbol.other} not reproduced")
        if _BINDINGS[symbol.binding]:
            lines.append(f"{_BINDINGS[symbol.binding]} {symbol.name}")
        lines.append(f".type {symbol.name},{_TYPES[symbol.kind]}")
        if _VISIBILITY[symbol.other]:
            lines.append(f"{_VISIBILITY[symbol.other]} {symbol.name}")
        if symbol.section == elf.SHN_ABS:
            lines.append(f".set {symbol.name}, {symbol.value}")
        if symbol.size:
            size = f".Lsize{number} - {symbol.name}" if symbol.section == text_index else str(symbol.size)
            lines.append(f".size {symbol.name}, {size}")
    return lines


def _labels(kernel: _Kernel, section: elf.Section) -> dict[int, list[str]]:
    """Section offset -> labels defined there: the symbols, in symbol-table order, and for .text the ends of the
    symbols that have a size."""
    index = kernel.sections.index(section)
    labels: dict[int, list[str]] = {}
    for number, symbol in enumerate(kernel.symbols):
        if symbol.section == index and symbol.name not in LINKER_SYMBOLS:
            if not 0 <= symbol.value - section.address <= section.size:
                raise ReassemblyError(f"symbol {symbol.name} lies outside {section.name}")
            labels.setdefault(symbol.value - section.address, []).append(symbol.name)
    if section is kernel.text:
        for number, symbol in enumerate(kernel.symbols):
            if symbol.section == index and symbol.size:
                labels.setdefault(symbol.value + symbol.size - section.address, []).append(f".Lsize{number}")
    return labels


def _checked_edits(kernel: _Kernel, job: Job) -> dict[int, dict[str, tuple[str, ...]]]:
    edits: dict[int, dict[str, tuple[str, ...]]] = {}
    for edit in job.edits:
        if not 0 <= edit.index < len(kernel.instructions) or edit.kind not in ("insert", "replace"):
            raise ReassemblyError(f"edit {edit} names no instruction of the kernel or an unknown kind")
        if edit.kind in edits.get(edit.index, {}):
            raise ReassemblyError(f"two {edit.kind} edits at instruction {edit.index}")
        edits.setdefault(edit.index, {})[edit.kind] = edit.texts
    return edits


def branch_targets(instructions: list[bytes], starts: list[int]) -> dict[int, int]:
    """Instruction index of each branch -> instruction index of its target, computed from the encodings; refuses
    code that reads the PC and targets outside the code or inside an instruction."""
    distinct = set(instructions)
    for chunk in distinct:
        if (name := isa.pc_dependent(chunk)) is not None:
            raise ReassemblyError(f"{name} at .text+{starts[instructions.index(chunk)]:#x}: code that reads the PC "
                                  "cannot move")
    branches = {chunk: found for chunk in distinct if (found := isa.branch_of(chunk)) is not None}
    index_of = {start: i for i, start in enumerate(starts)}
    targets = {}
    for i, chunk in enumerate(instructions):
        if chunk in branches:
            target = starts[i] + 4 + 4 * branches[chunk][1]
            if target not in index_of or target == starts[-1]:
                raise ReassemblyError(f"branch at .text+{starts[i]:#x} targets .text+{target:#x}, which is not an "
                                      "instruction of the kernel")
            targets[i] = index_of[target]
    return targets


def _text_lines(kernel: _Kernel, job: Job, body: Path) -> list[str]:
    """The .text source: runs of instructions that stay as they are included from `body` (their encodings, so the
    assembler cannot choose another), branches as mnemonic and label, edits as instruction text."""
    edits = _checked_edits(kernel, job)
    targets = branch_targets(kernel.instructions, kernel.starts)
    labels = _labels(kernel, kernel.text)
    starts = kernel.starts
    index_of = {start: i for i, start in enumerate(starts)}
    if any(offset not in index_of for offset in labels):
        raise ReassemblyError("a .text symbol lies inside an instruction")
    label_at = {index_of[offset]: names for offset, names in labels.items()}
    for target in set(targets.values()):
        label_at.setdefault(target, []).append(f".Lb{target}")
    breaks = sorted(set(label_at) | set(targets) | set(edits) | {len(kernel.instructions)})
    lines = [".text", _align(kernel.text)]
    run_start = 0
    for i in breaks:
        if run_start < i:
            lines.append(f'.incbin "{body}", {starts[run_start]}, {starts[i] - starts[run_start]}')
        lines += [f"{name}:" for name in label_at.get(i, [])]
        if i == len(kernel.instructions):
            break
        planned = edits.get(i, {})
        lines += planned.get("insert", ())
        run_start = i + 1
        if "replace" in planned:
            lines += planned["replace"]
        elif i in targets:
            lines.append(f"{isa.branch_of(kernel.instructions[i])[0]} .Lb{targets[i]}")
        else:
            run_start = i  # an unchanged instruction that only carries a label starts the next run
    return lines


def _body(kernel: _Kernel, job: Job) -> bytes:
    """.text with each instruction re-encoded as the job says (same lengths: offsets inside runs do not move)."""
    if not job.encodings:
        return kernel.data[kernel.text.offset:kernel.text.offset + kernel.text.size]
    for chunk in set(kernel.instructions):
        if len(new := job.encodings.get(chunk, chunk)) != len(chunk):
            raise ReassemblyError(f"re-encoding changes an instruction's length ({len(chunk)} -> {len(new)} bytes)")
    return b"".join(map(job.encodings.get, kernel.instructions, kernel.instructions))


def _source(kernel: _Kernel, job: Job, body: Path) -> str:
    version = CODE_OBJECT_VERSIONS.get(kernel.data[8])
    if version is None:
        raise ReassemblyError(f"ELF ABI version {kernel.data[8]} is no code object version this tool knows")
    lines = [f".amdhsa_code_object_version {version}"] + _symbol_lines(kernel) + _text_lines(kernel, job, body)
    by_name = {s.name: s for s in kernel.symbols}
    for section in kernel.sections:
        if section.name == ".note":
            lines += ['.section .note,"a",@note', _align(section)]
            lines += _bytes_directive(kernel.data[section.offset:section.offset + section.size])
        elif section.name == ".rodata":
            lines += ['.section .rodata,"a",@progbits', _align(section)]
            lines += _rodata_lines(kernel, section, by_name)
        elif section.name == ".bss":
            lines += ['.section .bss,"aw",@nobits', _align(section)]
            labels = _labels(kernel, section)
            for offset in range(section.size + 1):
                lines += [f"{name}:" for name in labels.get(offset, [])]
            lines.append(f".zero {section.size}")
    return "\n".join(lines) + "\n"


def _rodata_lines(kernel: _Kernel, section: elf.Section, by_name: dict[str, elf.Symbol]) -> list[str]:
    """The descriptors' bytes, each code entry offset as an expression the linker resolves."""
    body = kernel.data[section.offset:section.offset + section.size]
    labels = _labels(kernel, section)
    expressions: dict[int, str] = {}
    for offset, names in labels.items():
        for name in names:
            code = by_name.get(name.removesuffix(".kd"))
            if not name.endswith(".kd") or code is None:
                continue
            if offset + KERNEL_DESCRIPTOR_SIZE > len(body):
                raise ReassemblyError(f"kernel descriptor {name} runs past the end of .rodata")
            (entry,) = struct.unpack_from("<q", body, offset + ENTRY_OFFSET_FIELD)
            if section.address + offset + entry != code.value:
                raise ReassemblyError(f"kernel descriptor {name}: entry offset {entry} does not point at {code.name}")
            expressions[offset + ENTRY_OFFSET_FIELD] = f".quad {code.name}@rel64 - {name}"
    lines, position = [], 0
    for offset in sorted(set(labels) | set(expressions) | {len(body)}):
        lines += _bytes_directive(body[position:offset])
        position = offset
        lines += [f"{name}:" for name in labels.get(offset, [])]
        if offset in expressions:
            lines.append(expressions[offset])
            position = offset + 8
    return lines


# --- stage 3: assemble and link -------------------------------------------------------------------------------------

def _build(tools: llvm.LlvmTools, kernel: _Kernel, job: Job, work: Path) -> bytes:
    body = work / "text.bin"
    body.write_bytes(_body(kernel, job))
    (work / "kernel.s").write_text(_source(kernel, job, body))
    for argv in ([tools.tool("llvm-mc"), f"-triple={llvm.TRIPLE}", f"-mcpu={job.mcpu}", "-filetype=obj",
                  str(work / "kernel.s"), "-o", str(work / "kernel.o")],
                 [str(tools.bin_dir / "ld.lld"), "-shared", str(work / "kernel.o"), "-o", str(work / "kernel.co")]):
        result = subprocess.run(argv, capture_output=True, text=True)
        if "branch size exceeds simm16" in result.stderr:
            raise ReassemblyError("a branch would leave the signed 16-bit dword range once the code moves: "
                                  f"{result.stderr.strip()[-300:]}")
        if result.returncode != 0:
            raise ReassemblyError(f"{Path(argv[0]).name} failed: {result.stderr.strip()[-600:]}")
    return (work / "kernel.co").read_bytes()


# --- stage 4: restore -----------------------------------------------------------------------------------------------

def _restore(original: _Kernel, built: bytes, code_moved: bool) -> bytes:
    """Lay out the non-allocated sections again as the original's linker did: the original's .comment and the
    sections only its compiler wrote (DWARF only when no code moved: its addresses would be stale), our symbol and
    string tables, and no .relro_padding where the original had none."""
    table = elf.sections(built)
    if ".relro_padding" in (s.name for s in table) and ".relro_padding" not in (s.name for s in original.sections):
        built, table = _without_relro_padding(built, table)
    ours = {s.name: s for s in table}
    allocated = [s for s in table if s.flags & SHF_ALLOC or s.type == SHT_NULL]
    tail = []  # (section header taken from, its bytes)
    for section in original.sections:
        if section.flags & SHF_ALLOC or section.type == SHT_NULL:
            continue
        if section.name in LINKED_TABLES:
            if section.name not in ours:
                raise ReassemblyError(f"the link made no {section.name}")
            tail.append((ours[section.name], built[ours[section.name].offset:][:ours[section.name].size]))
        elif not (code_moved and section.name.startswith(".debug_")):
            tail.append((section, original.data[section.offset:][:section.size]))
    names = [s.name for s in allocated] + [header.name for header, _ in tail]
    if names == [s.name for s in original.sections]:
        kept = next(s for s in original.sections if s.name == ".shstrtab")
        names_table = original.data[kept.offset:kept.offset + kept.size]
    else:
        names_table = b"\0" + b"".join(name.encode() + b"\0" for name in dict.fromkeys(n for n in names if n))
    tail = [(header, names_table) if header.name == ".shstrtab" else (header, data) for header, data in tail]

    def name_offset(name: str) -> int:
        return names_table.index(b"\0" + name.encode() + b"\0") + 1 if name else 0

    out = bytearray(built[:max(s.offset + s.file_size for s in allocated)])
    headers = [(name_offset(s.name), s.type, s.flags, s.address, s.offset, s.size, s.link, s.info, s.align,
                s.entry_size) for s in allocated]
    for header, data in tail:
        align = max(header.align, 1)
        offset = -(-len(out) // align) * align
        out += bytes(offset - len(out)) + data
        link = names.index(table[header.link].name) if header.type == elf.SHT_SYMTAB else header.link
        headers.append((name_offset(header.name), header.type, header.flags, header.address, offset, len(data), link,
                        header.info, header.align, header.entry_size))
    section_table = -(-len(out) // 8) * 8
    out += bytes(section_table - len(out))
    for header in headers:
        out += SECTION_HEADER.pack(*header)
    struct.pack_into("<Q", out, 0x28, section_table)
    struct.pack_into("<HH", out, 0x3C, len(headers), names.index(".shstrtab"))
    return bytes(out)


def _without_relro_padding(built: bytes, table: list[elf.Section]) -> tuple[bytes, list[elf.Section]]:
    """LLD 18 added a NOBITS .relro_padding up to the page end of the RELRO segment and counts it in the writable
    LOAD segment too; LLD 17 padded only the RELRO segment's memory size. Drop the section, shrink the LOAD."""
    padding = next(s for s in table if s.name == ".relro_padding")
    out = bytearray(built)
    (phoff,) = struct.unpack_from("<Q", built, 0x20)
    (phnum,) = struct.unpack_from("<H", built, 0x38)
    for i in range(phnum):
        fields = list(_PROGRAM_HEADER.unpack_from(built, phoff + i * _PROGRAM_HEADER.size))
        kind, vaddr, memsz = fields[0], fields[3], fields[6]
        if kind == PT_LOAD and vaddr + memsz == padding.address + padding.size:
            fields[6] -= padding.size
            _PROGRAM_HEADER.pack_into(out, phoff + i * _PROGRAM_HEADER.size, *fields)
    index = table.index(padding)
    kept = [s for s in table if s is not padding]
    renumbered = [elf.Section(s.name, s.type, s.flags, s.address, s.offset, s.size,
                              s.link - (s.link > index), s.info, s.align, s.entry_size) for s in kept]
    symtab = next(s for s in kept if s.type == elf.SHT_SYMTAB)
    for offset in range(symtab.offset, symtab.offset + symtab.size, 24):
        (shndx,) = struct.unpack_from("<H", out, offset + 6)
        if index < shndx < elf.SHN_ABS:
            struct.pack_into("<H", out, offset + 6, shndx - 1)
    return bytes(out), renumbered


# --- the entry point ------------------------------------------------------------------------------------------------

def _rebuild_one(tools: llvm.LlvmTools, job: Job, work: Path) -> Rebuilt:
    try:
        kernel = _read(Path(job.source).read_bytes())
        out = _restore(kernel, _build(tools, kernel, job, work), code_moved=bool(job.edits))
    except (ReassemblyError, elf.ElfError, isa.SplitError) as error:
        return Rebuilt(job.relpath, error=str(error))
    target = Path(job.target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(out)
    return Rebuilt(job.relpath)


def rebuild(tools: llvm.LlvmTools, jobs: list[Job]) -> list[Rebuilt]:
    """Rebuild each job's code object through assembly source; one worker's share of a tree."""
    with tempfile.TemporaryDirectory(prefix="cdna2-reassemble-") as work:
        return [_rebuild_one(tools, job, Path(work)) for job in jobs]

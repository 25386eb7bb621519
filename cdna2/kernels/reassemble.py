"""Re-assembly: a code object's code is turned back into assembly source, assembled again by llvm-mc and laid out
in the file as ld.lld lays it out, so that code can move (an `s_nop` inserted, one instruction replaced by several)
with every branch still landing on the same instruction.

rebuild() runs the stages in this order, for a batch of kernels:
1. read: sections, symbols and the instructions of .text; every branch target computed from its encoding (objdump's
   `<L_end0+0x634>`-style labels are never parsed);
2. source: per kernel, its .text as a section of its own: runs of unchanged instructions as their encodings
   (`.incbin` of the re-encoded .text, so the assembler cannot pick another encoding), branches as their mnemonic
   and a label at the target, the planned edits as instruction text, a label at each offset a symbol names;
3. assemble: one llvm-mc -filetype=obj run for the batch (per processor); a kernel it refuses is named by its
   error's line and the rest assembled again without it;
4. link: each file is the original with its new code, every allocated section after .text, the program headers,
   the symbols and the kernel descriptors' code entry offsets placed as ld.lld places them for the same source
   (test_reassemble.py compares with ld.lld), and the original's non-allocated sections (DWARF only when no code
   moved).

With no edit the output is byte-identical to the input, its code assembled again; tests/unit/kernels/
test_reassemble.py proves it on whole AITER trees.
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import isa, llvm

# Allocated sections ld.lld makes itself, and those of the compiler's source; any other allocated section is refused.
LINKER_SECTIONS = {"", ".dynsym", ".gnu.hash", ".hash", ".dynstr", ".dynamic", ".relro_padding"}
SOURCE_SECTIONS = {".note", ".rodata", ".text", ".bss"}
SHT_NULL, SHT_DYNSYM, SHF_ALLOC = 0, 11, 0x2
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
KERNEL_DESCRIPTOR_SIZE = 64
ENTRY_OFFSET_FIELD = 16  # kernel_code_entry_byte_offset: int64, the entry point relative to the descriptor
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")
PT_LOAD, PT_GNU_RELRO = 1, 0x6474E552
PAGE = 0x1000  # ld.lld's maximum and common page size for AMDGPU


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
    # Edit texts whose bytes for `mcpu` are known (assembled before, checked by the proof like any instruction):
    # emitted as those bytes, so llvm-mc parses none of them again (the split's 400,000 MFMA halves cost it 2.5 CPU-s).
    assembled: dict[str, bytes] | None = None
    branches: dict[int, int] | None = None  # branch_targets of the source's instructions, where the caller has them


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


# --- stage 2: source -----------------------------------------------------------------------------------------------

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


def _label_offsets(kernel: _Kernel) -> set[int]:
    """The .text offsets the file's tables name: where its .text symbols start and, for those with a size, end."""
    index = kernel.sections.index(kernel.text)
    offsets = set()
    for symbol in kernel.symbols:
        if symbol.section == index:
            start = symbol.value - kernel.text.address
            if not 0 <= start <= start + symbol.size <= kernel.text.size:
                raise ReassemblyError(f"symbol {symbol.name} lies outside .text")
            offsets.update((start, start + symbol.size))
    return offsets


def _edit_lines(texts: tuple[str, ...], known: dict[str, bytes] | None) -> list[str]:
    """An edit's instructions as text, or as their bytes (`.long` words) when every one's bytes are known
    (Job.assembled). Not `.incbin`: llvm-mc reads the whole file again for each, which cost more than the texts."""
    if not known or not all(text in known for text in texts):
        return list(texts)
    return [".long " + ",".join([_words(known[text]) for text in texts])]


@lru_cache(maxsize=None)
def _words(encoding: bytes) -> str:
    """An encoding as `.long` operands; the split repeats the same halves thousands of times."""
    return ",".join(map(hex, struct.unpack(f"<{len(encoding) // 4}I", encoding)))


def _text_lines(kernel: _Kernel, job: Job, body: Path, name: str) -> list[str]:
    """The kernel's .text as section `name` of the batch's source: runs of instructions that stay as they are
    included from `body` (their encodings, so the assembler cannot choose another), branches as mnemonic and label,
    edits as instruction text or known bytes (_edit_lines), and a label `name.<offset>` where each symbol offset
    (_label_offsets) lands."""
    edits = _checked_edits(kernel, job)
    targets = branch_targets(kernel.instructions, kernel.starts) if job.branches is None else job.branches
    starts = kernel.starts
    index_of = {start: i for i, start in enumerate(starts)}
    offsets = _label_offsets(kernel)
    if any(offset not in index_of for offset in offsets):
        raise ReassemblyError("a .text symbol lies inside an instruction")
    label_at: dict[int, list[str]] = {index_of[offset]: [f"{name}.{offset}"] for offset in offsets}
    for target in set(targets.values()):
        label_at.setdefault(target, []).append(f".L{name}.b{target}")
    breaks = sorted(set(label_at) | set(targets) | set(edits) | {len(kernel.instructions)})
    lines = [f'.section {name},"ax",@progbits']
    run_start = 0
    for i in breaks:
        if run_start < i:
            lines.append(f'.incbin "{body}", {starts[run_start]}, {starts[i] - starts[run_start]}')
        lines += [f"{label}:" for label in label_at.get(i, [])]
        if i == len(kernel.instructions):
            break
        planned = edits.get(i, {})
        lines += _edit_lines(planned.get("insert", ()), job.assembled)
        run_start = i + 1
        if "replace" in planned:
            lines += _edit_lines(planned["replace"], job.assembled)
        elif i in targets:
            lines.append(f"{isa.branch_of(kernel.instructions[i])[0]} .L{name}.b{targets[i]}")
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


# --- stage 3: assemble ----------------------------------------------------------------------------------------------

@dataclass
class _Code:
    """A kernel's new .text as the assembler made it, and where each of its symbol offsets went."""
    data: bytes
    moved_to: dict[int, int]  # original .text offset -> new one


def _llvm_mc_errors(stderr: str, source: Path, owner_of_line: list[int]) -> dict[int, list[str]]:
    """llvm-mc's diagnostics per kernel (by the source line each names), each with the line it quotes."""
    found: dict[int, list[str]] = {}
    lines = stderr.splitlines()
    prefix = f"{source}:"
    for k, line in enumerate(lines):
        if line.startswith(prefix) and ": error: " in line:
            number = int(line[len(prefix):].split(":", 1)[0])
            quoted = lines[k + 1].strip() if k + 1 < len(lines) else ""
            found.setdefault(owner_of_line[number - 1], []).append(f"{line.split(': error: ', 1)[1]}: {quoted}")
    return found


def _assemble(tools: llvm.LlvmTools, mcpu: str, texts: dict[int, list[str]], work: Path
              ) -> tuple[dict[int, _Code], dict[int, str]]:
    """The .text of every kernel in `texts` (its number -> its _text_lines) from one llvm-mc run, each kernel in a
    section of its own: a start of llvm-mc costs about as much as assembling a padded kernel. A kernel whose source
    llvm-mc refuses is named by the line of its error and left out, and the others are assembled again without it.
    Returns the code of each kernel assembled and the error of each refused."""
    errors: dict[int, str] = {}
    source, obj = work / f"batch-{mcpu}.s", work / f"batch-{mcpu}.o"
    while texts:
        owner_of_line = [number for number, lines in texts.items() for _ in lines]
        source.write_text("".join(line + "\n" for lines in texts.values() for line in lines))
        result = llvm.run([tools.tool("llvm-mc"), f"-triple={llvm.TRIPLE}", f"-mcpu={mcpu}", "-filetype=obj",
                           str(source), "-o", str(obj)])
        if result.returncode == 0:
            codes, relocated = _read_assembled(obj.read_bytes(), list(texts))
            return codes, errors | relocated
        refused = _llvm_mc_errors(result.stderr, source, owner_of_line)
        for number in list(refused or texts):  # diagnostics naming no line leave no kernel to trust
            found = refused.get(number) or [result.stderr.strip()[-600:]]
            errors[number] = (("a branch would leave the signed 16-bit dword range once the code moves: "
                               if any("branch size exceeds simm16" in e for e in found) else "llvm-mc failed: ")
                              + "; ".join(found))
            del texts[number]
    return {}, errors


def _read_assembled(obj: bytes, numbers: list[int]) -> tuple[dict[int, _Code], dict[int, str]]:
    """Each kernel's section and labels from the batch's object, and the error of each whose code needs a relocation
    (a reference outside its own section: nothing the link would resolve)."""
    table = elf.sections(obj)
    by_name = {section.name: section for section in table}
    relocated = {number: "the assembler left relocations in the code" for number in numbers
                 if f".relak{number}" in by_name}
    moved_to: dict[int, dict[int, int]] = {number: {} for number in numbers}
    for symbol in elf.symbols(obj, table):
        kernel, dot, offset = symbol.name.partition(".")
        if dot and kernel.startswith("k") and kernel[1:].isdigit() and offset.isdigit():
            moved_to[int(kernel[1:])][int(offset)] = symbol.value
    out = {}
    for number in numbers:
        section = by_name[f"k{number}"]
        if number not in relocated:
            out[number] = _Code(obj[section.offset:section.offset + section.size], moved_to[number])
    return out, relocated


# --- stage 4: link --------------------------------------------------------------------------------------------------

def _align_up(value: int, alignment: int) -> int:
    return -(-value // max(alignment, 1)) * max(alignment, 1)


def _program_headers(data: bytes) -> list[list[int]]:
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    (phnum,) = struct.unpack_from("<H", data, 0x38)
    return [list(_PROGRAM_HEADER.unpack_from(data, phoff + i * _PROGRAM_HEADER.size)) for i in range(phnum)]


def _link(kernel: _Kernel, code: _Code, code_moved: bool) -> bytes:
    """The code object as ld.lld links the kernel's source with its new code (tests/unit/kernels/test_reassemble.py
    compares the two), with what only the original's linker and compiler wrote kept: the sections before .text
    are the original's; each allocated section after it is placed by ld.lld's rules (the first of a PT_LOAD on the
    next page at the file offset's place in its page, its file offset congruent to its address; .relro_padding up
    to the page end); the program headers span their sections again; the symbols and the kernel descriptors' code
    entry offsets follow the code; the non-allocated sections keep the original's order (DWARF only when no code
    moved: its addresses would be stale). One ld.lld run writes one file, so linking a batch by ld.lld would cost
    a start per kernel, as much as the link itself."""
    data, table, text = kernel.data, kernel.sections, kernel.text
    t = table.index(text)
    headers = _program_headers(data)
    load_starts = {header[3] for header in headers if header[0] == PT_LOAD}
    placed = {i: (s.address, s.offset, s.size) for i, s in enumerate(table)}
    placed[t] = (text.address, text.offset, len(code.data))
    address, offset = text.address + len(code.data), text.offset + len(code.data)
    for i in range(t + 1, len(table)):
        section = table[i]
        if not section.flags & SHF_ALLOC:
            continue
        if section.address in load_starts:
            # at the file offset's place in the page: after .relro_padding (no file bytes) that is not the address's
            address = _align_up(_align_up(address, PAGE) + offset % PAGE, section.align)
            offset += (address - offset) % PAGE
        else:
            address = _align_up(address, section.align)
            offset = offset if section.type == elf.SHT_NOBITS else _align_up(offset, section.align)
        size = _align_up(address, PAGE) - address if section.name == ".relro_padding" else section.size
        placed[i] = (address, offset, size)
        address += size
        offset += 0 if section.type == elf.SHT_NOBITS else size
    allocated = [i for i, s in enumerate(table) if s.flags & SHF_ALLOC or s.type == SHT_NULL]
    image = bytearray(data[:text.offset]) + code.data
    for i in allocated:
        if i > t and table[i].type != elf.SHT_NOBITS:
            image += bytes(placed[i][1] - len(image)) + data[table[i].offset:table[i].offset + table[i].size]
    _place_program_headers(image, headers, table, placed, t)

    def moved(value: int, section: int, size: int) -> tuple[int, int]:
        if section == t:
            start = value - text.address
            new = code.moved_to[start]
            return text.address + new, code.moved_to[start + size] - new if size else 0
        if t < section < len(table):
            return value + placed[section][0] - table[section].address, size
        return value, size

    tail_data = {}
    for i, section in enumerate(table):
        if section.type in (elf.SHT_SYMTAB, SHT_DYNSYM):
            entries = bytearray(data[section.offset:section.offset + section.size])
            for at in range(_SYMBOL.size, len(entries), _SYMBOL.size):
                name, info, other, index, value, size = _SYMBOL.unpack_from(entries, at)
                _SYMBOL.pack_into(entries, at, name, info, other, index, *moved(value, index, size))
            if section.flags & SHF_ALLOC:
                image[placed[i][1]:placed[i][1] + len(entries)] = entries
            else:
                tail_data[i] = bytes(entries)
    _move_code_entries(image, kernel, moved, placed)

    tail = [i for i, s in enumerate(table)
            if not (s.flags & SHF_ALLOC or s.type == SHT_NULL) and not (code_moved and s.name.startswith(".debug_"))]
    order = allocated + tail
    names = [table[i].name for i in order]
    shstrtab = next(i for i, s in enumerate(table) if s.name == ".shstrtab")
    if len(order) == len(table):
        names_table = data[table[shstrtab].offset:table[shstrtab].offset + table[shstrtab].size]
    else:
        names_table = b"\0" + b"".join(name.encode() + b"\0" for name in dict.fromkeys(n for n in names if n))
    tail_data[shstrtab] = names_table

    def name_offset(name: str) -> int:
        return names_table.index(b"\0" + name.encode() + b"\0") + 1 if name else 0

    out = image
    rows = []
    for i in order:
        s = table[i]
        address, offset, size = placed[i]
        if i in tail:
            content = tail_data.get(i, data[s.offset:s.offset + s.size])
            offset, size = _align_up(len(out), s.align), len(content)
            out += bytes(offset - len(out)) + content
        link = order.index(s.link) if i in tail and s.type == elf.SHT_SYMTAB else s.link
        rows.append((name_offset(s.name), s.type, s.flags, address, offset, size, link, s.info, s.align, s.entry_size))
    section_table = _align_up(len(out), 8)
    out += bytes(section_table - len(out))
    for row in rows:
        out += SECTION_HEADER.pack(*row)
    struct.pack_into("<Q", out, 0x28, section_table)
    struct.pack_into("<HH", out, 0x3C, len(rows), order.index(shstrtab))
    return bytes(out)


def _place_program_headers(image: bytearray, headers: list[list[int]], table: list[elf.Section],
                           placed: dict[int, tuple[int, int, int]], t: int) -> None:
    """Each program header that spans .text or a section after it spans its sections' new places, as ld.lld sets
    them (a PT_GNU_RELRO's memory size up to the page end)."""
    (phoff,) = struct.unpack_from("<Q", image, 0x20)
    for number, (kind, flags, offset, vaddr, paddr, filesz, memsz, align) in enumerate(headers):
        spanned = [i for i, s in enumerate(table) if s.flags & SHF_ALLOC and s.size
                   and vaddr <= s.address and s.address + s.size <= vaddr + memsz]
        if (kind in (PT_LOAD, PT_GNU_RELRO) and spanned and spanned[-1] + 1 < len(table)
                and table[spanned[-1] + 1].name == ".relro_padding"):
            spanned.append(spanned[-1] + 1)  # ld.lld puts it in the RELRO segment and its PT_LOAD, also when empty
        if not spanned or spanned[-1] < t or table[spanned[0]].address != vaddr:
            continue
        first, last = placed[spanned[0]], placed[spanned[-1]]
        offset, vaddr = first[1], first[0]
        filesz = last[1] - first[1] + (0 if table[spanned[-1]].type == elf.SHT_NOBITS else last[2])
        memsz = last[0] + last[2] - first[0]
        if kind == PT_GNU_RELRO:
            memsz = _align_up(offset + memsz, PAGE) - offset
        _PROGRAM_HEADER.pack_into(image, phoff + number * _PROGRAM_HEADER.size,
                                  kind, flags, offset, vaddr, vaddr, filesz, memsz, align)


def _move_code_entries(image: bytearray, kernel: _Kernel, moved, placed: dict[int, tuple[int, int, int]]) -> None:
    """Each kernel descriptor's code entry offset (kernel_code_entry_byte_offset, relative to the descriptor) set
    to where its code now starts; it is checked to point at the code in the original first."""
    by_name = {symbol.name: symbol for symbol in kernel.symbols}
    for symbol in kernel.symbols:
        code = by_name.get(symbol.name.removesuffix(".kd"))
        if not symbol.name.endswith(".kd") or code is None:
            continue
        section = kernel.sections[symbol.section]
        if section.name != ".rodata":
            raise ReassemblyError(f"kernel descriptor {symbol.name} lies outside .rodata")
        at = section.offset + symbol.value - section.address
        if symbol.value + KERNEL_DESCRIPTOR_SIZE > section.address + section.size:
            raise ReassemblyError(f"kernel descriptor {symbol.name} runs past the end of .rodata")
        (entry,) = struct.unpack_from("<q", kernel.data, at + ENTRY_OFFSET_FIELD)
        if symbol.value + entry != code.value:
            raise ReassemblyError(f"kernel descriptor {symbol.name}: entry offset {entry} does not point at "
                                  f"{code.name}")
        struct.pack_into("<q", image, placed[symbol.section][1] + symbol.value - section.address + ENTRY_OFFSET_FIELD,
                         moved(code.value, code.section, 0)[0] - symbol.value)


# --- the entry point ------------------------------------------------------------------------------------------------

def rebuild(tools: llvm.LlvmTools, jobs: list[Job]) -> list[Rebuilt]:
    """Rebuild each job's code object through assembly source, one llvm-mc run per processor for all of them (one
    worker's share of a tree); a kernel that cannot be rebuilt is reported alone and the others are written."""
    errors: dict[int, str] = {}
    kernels: dict[int, _Kernel] = {}
    texts: dict[str, dict[int, list[str]]] = {}  # mcpu -> kernel number -> its .text source
    with tempfile.TemporaryDirectory(prefix="cdna2-reassemble-") as work:
        for number, job in enumerate(jobs):
            try:
                kernel = kernels[number] = _read(Path(job.source).read_bytes())
                body = Path(work, f"k{number}.bin")
                body.write_bytes(_body(kernel, job))
                texts.setdefault(job.mcpu, {})[number] = _text_lines(kernel, job, body, f"k{number}")
            except (ReassemblyError, elf.ElfError, isa.SplitError) as error:
                errors[number] = str(error)
        codes: dict[int, _Code] = {}
        for mcpu, by_number in texts.items():
            assembled, refused = _assemble(tools, mcpu, by_number, Path(work))
            codes.update(assembled)
            errors.update(refused)
    for number, code in codes.items():
        job = jobs[number]
        try:
            out = _link(kernels[number], code, code_moved=bool(job.edits))
        except KeyError as error:  # a symbol offset the assembler placed no label at
            errors[number] = f"the link found no label for .text+{error.args[0]:#x}"
            continue
        except (ReassemblyError, elf.ElfError) as error:
            errors[number] = str(error)
            continue
        target = Path(job.target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(out)
    return [Rebuilt(job.relpath, errors.get(number)) for number, job in enumerate(jobs)]

"""The post-condition of a kernel whose code moved: the new file says exactly what the plan says, and nothing else.

Checked from the written file alone (its llvm-objdump listing and its ELF tables) against the original:
- the listing is the original's, each instruction in its gfx90a spelling, with exactly the planned edits (inserted
  instructions before, replacing instructions instead); walking it maps every original instruction to the address
  where its group now starts;
- every branch keeps its mnemonic and targets the mapped address of its original target (read from its encoding);
- the symbols are the original's, in the same order, with .text symbols at their mapped addresses and sizes;
- the kernel descriptor is the original's 64 bytes except kernel_code_entry_byte_offset, which must follow the code
  (it is checked to point at the kernel's new entry);
- the metadata note is the original's with only the target processor renamed.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, compress
from operator import ne

from cdna2.host import elf
from cdna2.kernels import isa, llvm
from cdna2.kernels.reassemble import ENTRY_OFFSET_FIELD, KERNEL_DESCRIPTOR_SIZE


@dataclass(frozen=True)
class Expected:
    """One instruction the new listing must hold: its text as objdump prints it and its encoding."""
    text: str
    encoding: bytes

    @cached_property
    def line_around_address(self) -> tuple[str, str]:
        """Its objdump line before and after the address (computed once: most are shared by many kernels)."""
        return llvm.objdump_line_around_address(self.text, self.encoding)


def _words(words: str) -> bytes:
    return b"".join(int(word, 16).to_bytes(4, "little") for word in words.split())


def _section(data: bytes, table: list[elf.Section], name: str) -> bytes:
    found = [s for s in table if s.name == name]
    return data[found[0].offset:found[0].offset + found[0].size] if found else b""


def prove(original: bytes, new: bytes, listing: list[str], groups: list[list[Expected | int]]) -> str | None:
    """None when `new` is `original` with exactly the planned groups, else the first difference.

    groups[i] lists what stands for original instruction i, in order: an Expected, or for an original branch the
    index of its original target instruction (its new offset is checked against that instruction's new address)."""
    old_table, new_table = elf.sections(original), elf.sections(new)
    old_text = next(s for s in old_table if s.name == ".text")
    new_text = next(s for s in new_table if s.name == ".text")
    # Each line the listing must hold, and the address the plan puts it at; a line that is not exactly as planned
    # (a branch, a line laid out otherwise, or a difference) is parsed for its own address, text and words.
    planned = [want for group in groups for want in group]
    first_line = list(accumulate(map(len, groups), initial=0))  # of each original instruction's group
    addresses = list(accumulate((4 if want.__class__ is int else len(want.encoding) for want in planned),
                                initial=new_text.address))
    exact = [None if want.__class__ is int else f"{want.line_around_address[0]}{address:012X}"
             f"{want.line_around_address[1]}" for want, address in zip(planned, addresses)]
    branches: list[tuple[int, str, int, int]] = []  # (address, mnemonic, encoded offset, original target index)
    for position in compress(range(len(listing)), map(ne, listing, exact)):  # (map stops at the shorter)
        line, want, index = listing[position], planned[position], bisect_right(first_line, position) - 1
        text, _, location = line.rpartition("// ")
        address_text, _, words = location.partition(": ")
        words = words.split("<", 1)[0].strip()  # objdump may name a branch target after the words: <sym+0x14>
        address = addresses[position] = int(address_text, 16)
        if isinstance(want, int):
            found = isa.branch_of(_words(words))
            if found is None:
                return (f"{address:#x}: {text.strip()!r} stands where original instruction {index}, a branch, "
                        "belongs")
            branches.append((address, found[0], found[1], want))
        elif text.strip() != want.text.strip() or words != llvm.objdump_words(want.encoding):
            return f"{address:#x}: expected {want.text!r} ({want.encoding.hex()}), found {text.strip()!r} ({words})"
    if len(listing) < len(planned):
        index = next(i for i in range(len(groups)) if first_line[i + 1] > len(listing))
        return f"the listing ends inside the group of original instruction {index}"
    if len(listing) > len(planned):
        return f"the listing has more instructions than planned, from {listing[len(planned)].strip()!r}"
    mapped = [addresses[line] - new_text.address for line in first_line[:-1]]
    mapped.append(new_text.size)
    old_instructions = isa.split_instructions(original[old_text.offset:old_text.offset + old_text.size])
    branch_of = {chunk: isa.branch_of(chunk) for chunk in set(old_instructions)}
    old_branches = [found for found in map(branch_of.__getitem__, old_instructions) if found is not None]
    for (address, mnemonic, offset, target), (old_mnemonic, _) in zip(branches, old_branches):
        if mnemonic != old_mnemonic:
            return f"{address:#x}: branch {mnemonic} stands for {old_mnemonic}"
        if address + 4 + 4 * offset - new_text.address != mapped[target]:
            return (f"{address:#x}: {mnemonic} lands on .text+{address + 4 + 4 * offset - new_text.address:#x}, "
                    f"its original target is now at .text+{mapped[target]:#x}")
    return (_check_symbols(original, new, old_table, new_table, old_text, new_text, isa.offsets(old_instructions),
                           mapped)
            or _check_descriptor(original, new, old_table, new_table)
            or _check_note(original, new, old_table, new_table))


def _check_symbols(original: bytes, new: bytes, old_table, new_table, old_text, new_text, starts: list[int],
                   mapped: list[int]) -> str | None:
    """`starts`: the .text offsets of the original's instructions (isa.offsets); `mapped`: where each now starts."""
    old_symbols, new_symbols = elf.symbols(original, old_table), elf.symbols(new, new_table)
    if [s.name for s in old_symbols] != [s.name for s in new_symbols]:
        return "the symbol table names other symbols, or in another order, than the original's"
    index_of = {start: i for i, start in enumerate(starts)}
    text_index = old_table.index(old_text)
    for old, now in zip(old_symbols, new_symbols):
        if old.section >= elf.SHN_ABS or now.section >= elf.SHN_ABS:
            same_place = (old.section, old.value) == (now.section, now.value)
            offset = old.value
        else:
            # Within its section: sections after .text (.dynamic, .bss) move when the code grows.
            old_section, new_section = old_table[old.section], new_table[now.section]
            offset = old.value - old_section.address
            if old.section == text_index:
                offset = mapped[index_of[offset]]
            same_place = old_section.name == new_section.name and now.value - new_section.address == offset
        size = old.size
        if old.section == text_index and old.size:
            size = mapped[index_of[old.value + old.size - old_text.address]] - offset
        if not same_place or (old.info, old.other, size) != (now.info, now.other, now.size):
            return (f"symbol {old.name}: expected at +{offset:#x} of its section with size {size}, found "
                    f"{now.value:#x} size {now.size} (or its binding, type, visibility or section changed)")
    return None


def _check_descriptor(original: bytes, new: bytes, old_table, new_table) -> str | None:
    old, now = _section(original, old_table, ".rodata"), _section(new, new_table, ".rodata")
    if len(old) != len(now):
        return f".rodata is {len(now)} bytes, the original {len(old)}"
    rodata = next(s for s in new_table if s.name == ".rodata")
    by_name = {s.name: s for s in elf.symbols(new, new_table)}
    follows = set()
    for symbol in by_name.values():
        code = by_name.get(symbol.name.removesuffix(".kd"))
        if symbol.name.endswith(".kd") and code is not None and symbol.size == KERNEL_DESCRIPTOR_SIZE:
            field = symbol.value - rodata.address + ENTRY_OFFSET_FIELD
            entry = int.from_bytes(now[field:field + 8], "little", signed=True)
            if symbol.value + entry != code.value:
                return f"{symbol.name}: kernel_code_entry_byte_offset {entry} does not point at {code.name}"
            follows.update(range(field, field + 8))
    differing = [i for i in range(len(old)) if old[i] != now[i] and i not in follows]
    if differing:
        return f"kernel descriptor bytes differ from the original at .rodata+{differing[0]:#x}"
    return None


def _check_note(original: bytes, new: bytes, old_table, new_table) -> str | None:
    old = _section(original, old_table, ".note").replace(elf.TARGET_GFX942, elf.TARGET_GFX90A)
    if _section(new, new_table, ".note") != old:
        return "the metadata note differs from the original's (beyond the target processor)"
    return None

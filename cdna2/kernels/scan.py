"""Stage 1 of the translation engine, the scan (runs in worker processes): each code object's .text cut into
instructions, each distinct instruction numbered in the batch's own table. Entry point: ``scan_batch``.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from itertools import count
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import isa


def scan_batch(src_root: str, relpaths: list[str]) -> tuple[list[bytes], list[tuple[str, str, object]]]:
    """Per file: ("ok", array of indices into the batch's table of distinct instructions) or ("error"/"skipped",
    why)."""
    # A chunk met for the first time gets the next index from the dict's own factory: no Python-level loop runs per
    # chunk, and the dict's order is the table's.
    index_of: defaultdict[bytes, int] = defaultdict(count().__next__)
    results = []
    # A .text met before in the batch has the same instructions: one file in six of the 0.1.7 tree repeats another's
    # code (mostly beside it), and cutting and indexing them again cost about a third of the scan.
    indices_of_text: dict[bytes, array] = {}
    for relpath in relpaths:
        data = Path(src_root, relpath).read_bytes()
        try:
            code_object = elf.read_code_object(data)
            if code_object.mach != elf.MACH_GFX942:
                results.append((relpath, "skipped", f"ELF machine is {code_object.mach_name}, not gfx942"))
                continue
            text = elf.text_of(data, code_object)
            indices = indices_of_text.get(text)
            if indices is None:
                unique = set(isa.split_instructions(text))
                indices = indices_of_text[text] = array("I", map(index_of.__getitem__, unique))
        except (elf.ElfError, isa.SplitError) as error:
            results.append((relpath, "error", str(error)))
            continue
        results.append((relpath, "ok", indices))
    return list(index_of), results

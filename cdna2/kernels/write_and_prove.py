"""Stages 6 and 7 of the translation engine, write and prove (runs in worker processes): each kernel patched in place
or re-assembled (edits.py) into staging, disassembled by llvm-objdump for gfx90a and compared instruction by
instruction with what it must be; once all are written, llvm-readelf checks that each says gfx90a. A kernel that
fails its proof is removed from staging and reported as an error. Entry points: ``write_batch`` (one worker task),
then ``check_targets`` (once, over every written kernel).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from itertools import compress
from operator import itemgetter, ne
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import edits, isa, llvm

BRANCH_PREFIXES = ("s_branch", "s_cbranch_", "s_call_b64")  # objdump prints their targets as labels


def _patch(data: bytearray, code_object: elf.CodeObject,
           expected: dict[bytes, tuple[bytes, str, str]]) -> tuple[int, list[str]]:
    """Re-encode in place; returns the number of patched instructions and the expected gfx90a objdump lines."""
    chunks = isa.split_instructions(elf.text_of(bytes(data), code_object))
    rows = list(map(expected.__getitem__, chunks))  # (gfx90a bytes, objdump line head, tail)
    starts = isa.offsets(chunks)
    changed = list(compress(range(len(chunks)), map(ne, map(itemgetter(0), rows), chunks)))
    for index in changed:  # C-level maps find them: most instructions keep their bytes
        new, chunk, offset = rows[index][0], chunks[index], code_object.text_offset + starts[index]
        if bytes(data[offset:offset + len(chunk)]) != chunk or len(new) != len(chunk):
            raise elf.ElfError(f"byte mismatch at file offset {offset:#x}: refusing to patch")
        data[offset:offset + len(chunk)] = new
    address = code_object.text_address
    return len(changed), [f"{head}{address + start:012X}{tail}" for (_, head, tail), start in zip(rows, starts)]


def _same_branch(expected: str, actual: str) -> bool:
    """objdump names a branch target by its label where llvm-mc prints the offset, or appends it as
    ``<symbol+offset>``: same address, same bytes and the same branch mnemonic are the same instruction."""
    want, got = llvm.parse_objdump_line(expected), llvm.parse_objdump_line(actual)
    name = isa.mnemonic(want[1])
    return ((want[0], want[2]) == (got[0], got[2].split(" <", 1)[0]) and name == isa.mnemonic(got[1])
            and name.startswith(BRANCH_PREFIXES))


def _prove(expected: list[str], actual: list[str]) -> str | None:
    if expected != actual:
        for want, got in zip(expected, actual):
            if want != got and llvm.normalised(want) != llvm.normalised(got) and not _same_branch(want, got):
                return f"expected {want.strip()!r}, gfx90a disassembly says {got.strip()!r}"
    if len(expected) != len(actual):
        return f"gfx90a disassembly has {len(actual)} instructions, the gfx942 listing {len(expected)}"
    return None


def _write_in_place(src_root: str, staging_root: str, relpaths: list[str],
                    expected: dict[bytes, tuple[bytes, str, str]]
                    ) -> tuple[list[tuple[str, int, str]], list[tuple[str, Path, int, list[str]]]]:
    """Patch and retarget each kernel into staging: (relpath, 0, why) of those refused, and (relpath, target,
    patched instructions, expected objdump lines) of those written, to be proven (_prove_in_place)."""
    refused, written = [], []
    for relpath in relpaths:
        source = Path(src_root, relpath)
        data = bytearray(source.read_bytes())
        code_object = elf.read_code_object(bytes(data))
        try:
            patched, listing = _patch(data, code_object, expected)
        except elf.ElfError as error:
            refused.append((relpath, 0, str(error)))
            continue
        elf.retarget_to_gfx90a(data, code_object)
        target = Path(staging_root, relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, source.stat().st_mode & 0o777)
        written.append((relpath, target, patched, listing))
    return refused, written


def _prove_in_place(written: list[tuple[str, Path, int, list[str]]], disassembly: dict[str, list[str]]
                    ) -> list[tuple[str, int, str | None]]:
    """(relpath, patched instructions, error or None) of each kernel patched in place; one that fails is removed."""
    results = []
    for relpath, target, patched, listing in written:
        error = _prove(listing, disassembly.get(str(target), []))
        if error:
            target.unlink()  # a file that failed its proof is never left in the tree
        results.append((relpath, patched, error))
    return results


def write_batch(tools: llvm.LlvmTools, src_root: str, staging_root: str, in_place: list[str],
                 expected: dict[bytes, tuple[bytes, str, str]], moves: edits.MoveBatch | None
                 ) -> tuple[list[tuple[str, int, str | None]], list[edits.Moved]]:
    """Stages 6 and 7 for one batch: write the kernels patched in place and those re-assembled (`moves`) into
    staging, then prove their code from one llvm-objdump call (each call's start costs about 20-30 ms, as much as
    disassembling a kernel); that each says gfx90a is checked for the whole tree at once (check_targets). Returns
    the in-place outcomes and the re-assembled kernels."""
    in_place_results, written = _write_in_place(src_root, staging_root, in_place, expected)
    failed, staged = edits.rebuild_batch(tools, src_root, staging_root, moves) if moves else ([], [])
    paths = [target for _, target, _, _ in written] + [kernel.target for kernel in staged]
    disassembly = llvm.objdump_lines(tools, paths, "gfx90a") if paths else {}
    return in_place_results + _prove_in_place(written, disassembly), failed + edits.prove_staged(staged, disassembly)


def check_targets(tools: llvm.LlvmTools, staging: Path, outcomes: dict[str, tuple[int, str | None]],
                   moved: dict[str, edits.Moved], pool: ProcessPoolExecutor, jobs: int) -> None:
    """The last step of every kernel's proof, once all are written: its ELF header and metadata must say gfx90a.
    One llvm-readelf call per worker, side by side: a call per write task (17 on the 0.1.7 tree) cost 0.3-0.4 CPU-s
    of a cold run, nearly all in starting the tool, and a single call took 0.11 s with the other core idle. A kernel
    that does not say gfx90a becomes an error, and its file is removed from staging."""
    written = [relpath for relpath, (_, error) in outcomes.items() if error is None]
    written += [relpath for relpath, kernel in moved.items() if kernel.outcome == "written"]
    shares = [share for k in range(jobs) if (share := [staging / relpath for relpath in written[k::jobs]])]
    wrong_target: dict[str, str] = {}
    for errors in pool.map(llvm.target_errors, [tools] * len(shares), shares, ["gfx90a"] * len(shares)):
        wrong_target.update(errors)
    for relpath in written:
        why = wrong_target.get(str(staging / relpath))
        if why is None:
            continue
        (staging / relpath).unlink()
        if relpath in moved:
            moved[relpath] = edits.Moved(relpath, "error", f"proof failed: {why}")
        else:
            outcomes[relpath] = (outcomes[relpath][0], why)

"""Edits as data, for kernels whose code must move: the plan per kernel, and the worker that rebuilds and proves it.

A plan is a list of reassemble.Edit: `replace` one int8 K=32 MFMA by its two halves (split.py), `insert` `s_nop`s
before the consumer of a short MFMA edge ("pad edge X by N": X is the consumer's .text offset in the original,
N the wait states missing). Padding goes before the consumer's label, so every path into it, straight-line or
across a branch, runs the nops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import isa, llvm, reassemble
from cdna2.kernels.relocation_proof import Expected, prove

MAX_NOP_WAIT_STATES = 8  # one s_nop N waits N+1 states; LLVM emits at most s_nop 7 (SIInstrInfo::insertNoops)


@dataclass(frozen=True)
class Pad:
    """Pad the edge ending at the original instruction at .text offset `consumer` by `wait_states`."""
    consumer: int
    wait_states: int


def nops(wait_states: int) -> list[Expected]:
    """The fewest s_nop instructions that wait exactly `wait_states`."""
    out = []
    while wait_states > 0:
        step = min(wait_states, MAX_NOP_WAIT_STATES)
        out.append(Expected(f"s_nop {step - 1}", (0xBF800000 | (step - 1)).to_bytes(4, "little")))
        wait_states -= step
    return out


@dataclass
class Moved:
    relpath: str
    outcome: str = "written"  # or "refused" (the plan cannot be built: why in reason) or "error" (proof failed)
    reason: str | None = None
    split_mfmas: int = 0
    nops: int = 0
    nops_in_loops: int = 0
    text_growth: int = 0  # bytes


def _in_loop(index: int, targets: dict[int, int]) -> bool:
    """A backward branch at or after `index` lands at or before it: the instruction is inside a loop."""
    return any(branch >= index >= target for branch, target in targets.items() if target <= branch)


def _plan(instructions: list[bytes], starts: list[int], targets: dict[int, int],
          halves: dict[bytes, tuple[Expected, Expected]], pads: list[Pad],
          moved: Moved) -> tuple[list[reassemble.Edit], dict[int, list[Expected]], dict[int, list[Expected]]]:
    """The edits, and what each edited instruction's group holds: the inserted and the replacing instructions."""
    index_of = {start: i for i, start in enumerate(starts[:-1])}
    needed: dict[int, int] = {}
    for pad in pads:
        if pad.consumer not in index_of:
            raise reassemble.ReassemblyError(f"pad at .text+{pad.consumer:#x}: no instruction starts there")
        needed[index_of[pad.consumer]] = max(needed.get(index_of[pad.consumer], 0), pad.wait_states)
    edits, inserted, replaced = [], {}, {}
    for index, wait_states in sorted(needed.items()):
        inserted[index] = nops(wait_states)
        edits.append(reassemble.Edit(index, "insert", tuple(e.text for e in inserted[index])))
        moved.nops += len(inserted[index])
        moved.nops_in_loops += len(inserted[index]) if _in_loop(index, targets) else 0
    for index, chunk in enumerate(instructions):
        if chunk in halves:
            replaced[index] = list(halves[chunk])
            edits.append(reassemble.Edit(index, "replace", tuple(e.text for e in replaced[index])))
            moved.split_mfmas += 1
    return edits, inserted, replaced


def move_batch(tools: llvm.LlvmTools, src_root: str, staging_root: str, relpaths: list[str],
               expected: dict[bytes, Expected], halves: dict[bytes, tuple[Expected, Expected]],
               pads: dict[str, list[Pad]]) -> list[Moved]:
    """Plan, rebuild for gfx90a, retarget and prove each kernel; a kernel that fails is reported and not left."""
    results = []
    for relpath in relpaths:
        moved = Moved(relpath)
        source, target = Path(src_root, relpath), Path(staging_root, relpath)
        original = source.read_bytes()
        try:
            code_object = elf.read_code_object(original)
            instructions = isa.split_instructions(elf.text_of(original, code_object))
            starts = [0]
            for chunk in instructions:
                starts.append(starts[-1] + len(chunk))
            targets = reassemble.branch_targets(instructions, starts)
            edits, inserted, replaced = _plan(instructions, starts, targets, halves, pads.get(relpath, []), moved)
            groups: list[list[Expected | int]] = [
                inserted.get(i, []) + (replaced[i] if i in replaced else [targets[i]] if i in targets
                                       else [expected[chunk]])
                for i, chunk in enumerate(instructions)]
            encodings = {chunk: e.encoding for chunk, e in expected.items()}
            job = reassemble.Job(relpath, str(source), str(target), "gfx90a", encodings, tuple(edits))
            rebuilt = reassemble.rebuild(tools, [job])[0]
        except (elf.ElfError, isa.SplitError, reassemble.ReassemblyError) as error:
            results.append(Moved(relpath, "refused", str(error)))
            continue
        except KeyError:
            results.append(Moved(relpath, "error", "an instruction has no gfx90a encoding and is not planned to be "
                                                   "replaced (translator bug: report it with the source tree)"))
            continue
        if rebuilt.error:
            results.append(Moved(relpath, "refused", rebuilt.error))
            continue
        data = bytearray(target.read_bytes())
        elf.retarget_to_gfx90a(data, elf.read_code_object(bytes(data)))
        target.write_bytes(data)
        os.chmod(target, source.stat().st_mode & 0o777)
        listing = llvm.objdump_lines(tools, [target], "gfx90a").get(str(target), [])
        error = prove(original, bytes(data), listing, groups)
        if error is None:
            moved.text_growth = elf.read_code_object(bytes(data)).text_size - code_object.text_size
        else:
            target.unlink()
            moved = Moved(relpath, "error", f"proof failed: {error}")
        results.append(moved)
    return results

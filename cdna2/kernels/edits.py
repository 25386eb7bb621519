"""Edits as data, for kernels whose code must move: the plan per kernel, and the worker steps that rebuild it
(rebuild_batch) and prove it (prove_staged).

A plan is a list of reassemble.Edit: `replace` one int8 K=32 MFMA by its two halves (split.py), `insert` `s_nop`s
before the consumer of a short MFMA edge ("pad edge X by N": X is the consumer's .text offset in the original,
N the wait states missing). Padding goes before the consumer's label, so every path into it, straight-line or
across a branch, runs the nops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import attrgetter
from pathlib import Path

from cdna2.host import elf
from cdna2.kernels import hazard_instructions, hazard_report, hazard_rules, hazards, isa, llvm, reassemble
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
    wait_states_in_loops: int = 0  # of those nops: what one iteration of the enclosing loops now waits more
    text_growth: int = 0  # bytes
    audit: dict | None = None  # the hazard audit of the written file (hazard_report.KernelAudit.to_json)


MAX_PADDING_ROUNDS = 4  # a pad lengthens other edges, never shortens one: one round settles all but rare cases


_SPLICED_OVER = Expected("", b"")  # layout() reads it for a split MFMA (expected has none) until its lines replace it


def _in_loop(index: int, targets: dict[int, int]) -> bool:
    """A backward branch at or after `index` lands at or before it: the instruction is inside a loop."""
    return any(branch >= index >= target for branch, target in targets.items() if target <= branch)


class _Kernel:
    """One kernel's original instructions and what the plan does with them."""

    def __init__(self, instructions: list[bytes], expected: dict[bytes, Expected],
                 halves: dict[bytes, tuple[Expected, Expected]]):
        self.instructions = instructions
        self.starts = isa.offsets(instructions)
        self.targets = reassemble.branch_targets(instructions, self.starts)
        self.expected = expected
        self.replaced = {i: list(halves[chunk]) for i, chunk in enumerate(instructions) if chunk in halves}
        self.wait_states: dict[int, int] = {}  # original instruction index -> wait states inserted before it

    def pad(self, consumer_offset: int, wait_states: int) -> None:
        index = self.starts.index(consumer_offset) if consumer_offset in self.starts[:-1] else None
        if index is None:
            raise reassemble.ReassemblyError(f"pad at .text+{consumer_offset:#x}: no instruction starts there")
        self.wait_states[index] = max(self.wait_states.get(index, 0), wait_states)

    def group(self, index: int) -> list[Expected | int]:
        """What stands for original instruction `index`: inserted nops, then its halves, its branch (as the index
        of its target) or itself."""
        chunk = self.instructions[index]
        body = self.replaced.get(index) or [self.targets[index] if index in self.targets else self.expected[chunk]]
        return nops(self.wait_states[index]) + body if index in self.wait_states else body

    def groups(self) -> list[list[Expected | int]]:
        """group() of every original instruction (most stand for themselves)."""
        special, expected = set(self.replaced) | set(self.targets) | set(self.wait_states), self.expected
        return [self.group(i) if i in special else [expected[chunk]] for i, chunk in enumerate(self.instructions)]

    def layout(self) -> tuple[list[tuple[int, int, str]], list[int]]:
        """The planned listing as the hazard audit reads it, (offset, size, text), and the original instruction
        each line belongs to."""
        edited = {i: self.group(i) for i in set(self.wait_states) | set(self.replaced)}
        lengths = list(map(len, self.instructions))
        for index, group in edited.items():
            lengths[index] = sum(4 if isinstance(item, int) else len(item.encoding) for item in group)
        group_starts = list(accumulate(lengths, initial=0))
        spliced: dict[int, list[tuple[int, int, str]]] = {}  # the lines of each edited instruction and branch
        for index in sorted(set(edited) | set(self.targets)):
            chunk, address, lines = self.instructions[index], group_starts[index], []
            for item in edited.get(index) or [self.targets[index]]:
                if isinstance(item, int):
                    offset = (group_starts[item] - address - 4) // 4
                    if not isa.BRANCH_RANGE[0] <= offset <= isa.BRANCH_RANGE[1]:
                        raise reassemble.ReassemblyError(
                            f"a branch would leave the signed 16-bit dword range once the code moves: the one at "
                            f".text+{self.starts[index]:#x} would need an offset of {offset} dwords")
                    lines.append((address, 4, f"{isa.branch_of(chunk)[0]} {offset & 0xFFFF}"))
                    address += 4
                else:
                    lines.append((address, len(item.encoding), item.text))
                    address += len(item.encoding)
            spliced[index] = lines
        # Every instruction as itself first, by C-level maps (most stand for themselves), then the runs between the
        # spliced ones copied around their lines in one pass (a slice assignment per split MFMA moves the whole
        # tail each time: 30 split kernels' layouts took 0.15 CPU-s that way, 0.13 this way).
        texts = map(attrgetter("text"), map(self.expected.get, self.instructions, repeat(_SPLICED_OVER)))
        plain = list(zip(group_starts, map(len, self.instructions), texts))
        listing: list[tuple[int, int, str]] = []
        owner: list[int] = []
        start = 0
        for index in sorted(spliced):
            listing += plain[start:index]
            listing += spliced[index]
            owner += range(start, index)
            owner += [index] * len(spliced[index])
            start = index + 1
        listing += plain[start:]
        owner += range(start, len(plain))
        return listing, owner

    def audit(self) -> tuple[hazard_report.KernelAudit, list[tuple[int, int, str]], list[int]]:
        """The hazard audit of the planned listing (and the listing, and each line's original instruction)."""
        listing, owner = self.layout()
        try:
            return hazards.audit_listing(listing), listing, owner
        except hazard_instructions.UnparsedError as error:
            raise reassemble.ReassemblyError(f"the hazard audit of the planned listing did not finish: {error}")

    def pad_short_edges(self, shortfalls: dict[int, int] | None = None) -> hazard_report.KernelAudit:
        """Insert before each consumer of a short MFMA edge the wait states missing on the planned listing (the
        largest shortfall among its edges, on every path class), until the audit finds none; returns that audit.
        `shortfalls` (KernelAudit.shortfalls by .text offset) is the engine's audit of the unedited kernel: when
        nothing else is planned it is the first round's answer, so that round needs no audit of its own."""
        rounds = MAX_PADDING_ROUNDS
        if shortfalls and not self.replaced and not self.wait_states:
            index_of = {start: i for i, start in enumerate(self.starts)}
            self.wait_states = {index_of[offset]: count for offset, count in shortfalls.items()}
            rounds -= 1
        for _ in range(rounds):
            audit, listing, owner = self.audit()
            if audit.verdict == hazard_rules.UNAUDITED:
                found = audit.to_json()
                raise reassemble.ReassemblyError("the hazard audit cannot read the planned listing, so it cannot be "
                                                 f"padded: {(found['unparsed'] + found['unresolved_branches'])[:1]}")
            if not audit.short_edges:
                return audit
            line_of = {address: k for k, (address, _, _) in enumerate(listing)}
            missing: dict[int, int] = {}
            for address, count in audit.shortfalls().items():
                index = owner[line_of[address]]
                missing[index] = max(missing.get(index, 0), count)
            for index, count in missing.items():
                self.wait_states[index] = self.wait_states.get(index, 0) + count
        raise reassemble.ReassemblyError(f"padding did not settle within {MAX_PADDING_ROUNDS} rounds")

    def edits(self) -> list[reassemble.Edit]:
        out = [reassemble.Edit(i, "insert", tuple(e.text for e in nops(n))) for i, n in sorted(self.wait_states.items())
               if n]
        out += [reassemble.Edit(i, "replace", tuple(e.text for e in halves)) for i, halves in self.replaced.items()]
        return out

    def count(self, moved: Moved) -> None:
        moved.split_mfmas = len(self.replaced)
        for index, wait_states in self.wait_states.items():
            moved.nops += len(nops(wait_states))
            if _in_loop(index, self.targets):
                moved.nops_in_loops += len(nops(wait_states))
                moved.wait_states_in_loops += wait_states


@dataclass
class MoveBatch:
    """What a batch of kernels to re-assemble needs from the analysis (it crosses to a worker with them)."""
    relpaths: list[str]
    expected: dict[bytes, Expected]  # each instruction's gfx90a text and bytes
    halves: dict[bytes, tuple[Expected, Expected]]  # the int8 K=32 MFMAs to split
    pads: dict[str, list[Pad]]  # asked for, per kernel
    pad_hazards: bool  # pad what the hazard audit of the planned listing finds short
    shortfalls: dict[str, dict[int, int]]  # the engine's audit of each unedited kernel (KernelAudit.shortfalls)


@dataclass
class Staged:
    """A kernel rebuilt into staging, its proof still to come (prove_staged)."""
    moved: Moved
    target: Path
    data: bytes
    original: bytes
    groups: list[list[Expected | int]]
    audit: hazard_report.KernelAudit


def rebuild_batch(tools: llvm.LlvmTools, src_root: str, staging_root: str, batch: MoveBatch
                  ) -> tuple[list[Moved], list[Staged]]:
    """Plan each kernel (splits, the pads asked for, and with `pad_hazards` the pads the hazard audit of the
    planned listing asks for, starting from the engine's shortfalls of the unedited kernel), rebuild it for gfx90a
    and retarget it in staging. Returns the kernels refused or in error and the staged ones, which
    prove_staged then proves from one llvm-objdump call shared with other kernels (a call's start costs about as
    much as disassembling a kernel). The audit a Staged carries is the planned listing's, which the proof shows the
    file holds (the slow real-tree test audits every written file afresh from its disassembly)."""
    failed: list[Moved] = []
    planned = []  # (moved, job, original, .text size, groups, audit) of each kernel whose plan was built
    encodings = {chunk: e.encoding for chunk, e in batch.expected.items()}
    assembled = {e.text: e.encoding for pair in batch.halves.values() for e in pair}
    assembled.update((e.text, e.encoding) for n in range(1, MAX_NOP_WAIT_STATES + 1) for e in nops(n))
    for relpath in batch.relpaths:
        moved = Moved(relpath)
        source, target = Path(src_root, relpath), Path(staging_root, relpath)
        original = source.read_bytes()
        try:
            code_object = elf.read_code_object(original)
            kernel = _Kernel(isa.split_instructions(elf.text_of(original, code_object)), batch.expected,
                             batch.halves)
            for pad in batch.pads.get(relpath, []):
                kernel.pad(pad.consumer, pad.wait_states)
            # Once proven, the written listing is the planned one: this audit is the written file's.
            audit = (kernel.pad_short_edges(batch.shortfalls.get(relpath)) if batch.pad_hazards
                     else kernel.audit()[0])
            kernel.count(moved)
            groups = kernel.groups()
            job = reassemble.Job(relpath, str(source), str(target), "gfx90a", encodings, tuple(kernel.edits()),
                                 assembled, kernel.targets)
        except (elf.ElfError, isa.SplitError, reassemble.ReassemblyError) as error:
            failed.append(Moved(relpath, "refused", str(error)))
            continue
        except KeyError:
            failed.append(Moved(relpath, "error", "an instruction has no gfx90a encoding and is not planned to be "
                                                  "replaced (translator bug: report it with the source tree)"))
            continue
        planned.append((moved, job, original, code_object.text_size, groups, audit))
    staged = []
    for (moved, job, original, text_size, groups, audit), outcome in zip(
            planned, reassemble.rebuild(tools, [job for _, job, *_ in planned])):
        if outcome.error:
            failed.append(Moved(moved.relpath, "refused", outcome.error))
            continue
        target = Path(job.target)
        built = target.read_bytes()
        rebuilt, data = elf.read_code_object(built), bytearray(built)
        elf.retarget_to_gfx90a(data, rebuilt)
        moved.text_growth = rebuilt.text_size - text_size
        target.write_bytes(data)
        os.chmod(target, Path(job.source).stat().st_mode & 0o777)
        staged.append(Staged(moved, target, bytes(data), original, groups, audit))
    return failed, staged


def prove_staged(staged: list[Staged], listings: dict[str, list[str]]) -> list[Moved]:
    """Each staged kernel proven against its plan (relocation_proof.prove) from its llvm-objdump listing; a kernel
    that fails is removed from staging. (That it says gfx90a is checked for the whole tree at once: write_and_prove.
    check_targets.)"""
    out = []
    for kernel in staged:
        target, moved = kernel.target, kernel.moved
        error = prove(kernel.original, kernel.data, listings.get(str(target), []), kernel.groups)
        if error is None:
            moved.audit = kernel.audit.to_json()
        else:
            target.unlink()
            moved = Moved(moved.relpath, "error", f"proof failed: {error}")
        out.append(moved)
    return out

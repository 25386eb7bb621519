"""The per-path audit of one kernel: every MFMA dependency found on every path into each consumer, with the wait
states present on it, judged by the rules (hazard_rules, and here the staggered-writeback credit of gfx942) into
the kernel's report (hazard_report).
Entry point: ``audit_paths(addresses, texts, target)``.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, compress
from operator import attrgetter

from cdna2.kernels.hazard_instructions import BRANCH, CBRANCH, END, MFMA, SCALAR, VALU, Instruction, parse
from cdna2.kernels.hazard_report import KernelAudit, ShortEdge
from cdna2.kernels.hazard_rules import (EXEC_WRITE, FALL_THROUGH, MAX_LOOKBACK, MAX_WAR_LOOKBACK, MEM_READ,
                                        PATH_NAMES, SRC_AB, SRCC_EXACT, SRCC_OVERLAP, STRAIGHT, TAKEN, VALU_READ,
                                        VALU_WRITE, WAR, WAW, needed)

_WAIT_STATES = attrgetter("ws")
_STALLS = ("s_waitcnt", "s_barrier", "s_sleep")  # may take longer than the one wait state they count


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


class _Path:
    """The MFMAs on one path within the look-back, (index, end position, path class) oldest first, and the union of
    the registers they write or read as SrcC (a consumer touching none of them has nothing to check on this path)."""

    __slots__ = ("entries", "mask")

    def __init__(self, entries: list[tuple[int, int, int]], mask: int):
        self.entries, self.mask = entries, mask

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Path) and self.entries == other.entries

    def copy(self) -> "_Path":
        return _Path(list(self.entries), self.mask)



def staggered_need(rule: str, producer: Instruction, operand: tuple[int, int]) -> int | None:
    """gfx942 only: the wait states AMD's own gfx942 code relies on for a 4-pass MFMA result, or None.

    On the gfx942 originals, register k (0..3) of a 4-pass XDL MFMA's 4-register result is read (or overwritten)
    after 4+k wait states instead of LLVM's single P+3 = 7: the code relies on the result being written back one
    register per pass. AMD's own code for its own chip is taken as evidence for gfx942, so such an edge is accepted
    there. On gfx90a it is not: its MFMAs take 8 passes, how their writeback is staggered is documented nowhere we
    can read (LLVM states one number), and no gfx90a code we have relies on it, so gfx90a gets LLVM's rule as is.
    """
    mfma, (lo, hi) = producer.mfma, producer.dst
    if (rule not in (VALU_READ, MEM_READ, WAW) or mfma.dgemm or not mfma.xdl["gfx942"]
            or mfma.passes["gfx942"] != 4 or hi - lo != 3):
        return None
    return 4 + min(operand[1], hi) - lo

class Walker:
    """Dependencies of one listing, found in one forward pass that carries every path into each instruction.

    The state before an instruction is a list of paths (_Path), each the MFMAs issued on it within the look-back;
    end positions are rebased when a path follows a branch, so the wait states between an MFMA and the current
    instruction are always ``pos[i] - end``. A branch target receives a copy of the state at each branch into it; a
    back edge's copy is known only after a pass, so later passes follow just the new paths back edges bring, until
    none is new. VALU producers (2 and 4 wait states before an MFMA) are searched backwards from the MFMA instead.
    """

    # Each later pass follows paths one more time round a loop, and a loop costs at least one wait state per turn:
    # after MAX_LOOKBACK passes every MFMA a back edge could bring is out of the look-back.
    MAX_PASSES = MAX_LOOKBACK

    def __init__(self, addresses: list[int], texts: list[str], target: str, audit: KernelAudit):
        # Per-instruction work is done by C-level maps over the listing; Python loops run over distinct texts.
        self.target, self.audit = target, audit
        self.addresses, self.texts = addresses, texts
        self.ins: list[Instruction] = list(map(parse, texts))
        distinct = set(self.ins)
        if any(facts.__class__ is str for facts in distinct):
            for index, facts in enumerate(self.ins):
                if facts.__class__ is str:
                    audit.unparsed.append((addresses[index], texts[index], facts))
                    self.ins[index] = parse("s_nop 0")  # one wait state: the rest of the kernel is still audited
            distinct = set(self.ins)
        self.pos = [0, *accumulate(map(_WAIT_STATES, self.ins))]  # wait states issued before each instruction
        self.targets: dict[int, int] = {}  # branch index -> target index
        self.sources: dict[int, list[int]] = {}  # target index -> branch indices
        self.found: dict[tuple[int, int, str, int], tuple[int, tuple[int, int] | None]] = {}
        special_facts = {facts for facts in distinct if facts.flow or facts.gpr_index or facts.mfma}
        special = list(compress(range(len(self.ins)), map(special_facts.__contains__, self.ins)))
        mfma_registers, indexed_from = 0, None
        for facts in special_facts:
            if facts.mfma:
                mfma_registers |= facts.result_mask
        for index in special:
            facts = self.ins[index]
            if facts.gpr_index:
                if facts.gpr_index == "on":
                    indexed_from = index + 1 if indexed_from is None else indexed_from
                elif indexed_from is not None:
                    audit.gpr_indexed += index - indexed_from
                    indexed_from = None
            elif facts.flow and facts.flow != END:
                address = addresses[index] + 4 + 4 * facts.offset
                target_index = bisect_left(addresses, address)
                if target_index == len(addresses) or addresses[target_index] != address:
                    audit.unresolved.append((addresses[index], texts[index]))
                else:
                    self.targets[index] = target_index
                    self.sources.setdefault(target_index, []).append(index)
        # Only these take part in the forward pass: MFMAs, branches, branch targets, and VALU/memory instructions that
        # touch a register some MFMA of this kernel writes or reads as SrcC.
        events = special_facts | {facts for facts in distinct if facts.mask & mfma_registers}
        self.events = list(compress(range(len(self.ins)), map(events.__contains__, self.ins)))
        if self.sources:
            self.events = sorted(set(self.events).union(self.sources))
        # Instructions with a branch or a branch target among the 4 before them (VALU producers: searched by path)
        self.near_branches = {index + step for index in special if self.ins[index].flow for step in range(1, 5)}
        self.near_branches.update(t + step for t in self.sources for step in range(4))
        audit.instructions = len(self.ins)
        audit.mfmas = sum(1 for index in special if self.ins[index].mfma)

    def _carry(self, paths: list[_Path], i: int, t: int, path_class: int) -> list[_Path]:
        """The paths leaving instruction i towards instruction t (a branch target or the next instruction)."""
        shift = self.pos[t] - self.pos[i] - self.ins[i].ws
        floor = self.pos[t] - MAX_LOOKBACK
        ins, carried = self.ins, []
        for path in paths:
            kept = [(j, end + shift, max(old, path_class)) for j, end, old in path.entries if end + shift > floor]
            if kept:
                mask = 0
                for j, _, _ in kept:
                    mask |= ins[j].result_mask
                if (new := _Path(kept, mask)) not in carried:
                    carried.append(new)
        return carried

    def _pass(self, back: dict[int, list[_Path]]) -> dict[int, list[_Path]]:
        """One forward pass; returns the paths each back edge carries to its target.

        The first pass (``back`` empty) follows every path but those through back edges. A later pass starts from
        nothing but the paths ``back`` brings to each back-edge target and follows them only until their MFMAs are
        out of the look-back (``horizon``): what follows is what the first pass saw already.
        """
        ins, pos, found, sources, targets = self.ins, self.pos, self.found, self.sources, self.targets
        first = not back
        back_out: dict[int, list[_Path]] = {}
        pending: dict[int, list[_Path]] = {}
        paths: list[_Path] = []
        newest = 0  # end of the latest MFMA on any path: a consumer MAX_LOOKBACK after it has nothing to check
        horizon = 0
        start, last_back = (0, 0) if first else (min(back), max(back))
        for i in self.events[bisect_left(self.events, start):]:
            facts = ins[i]
            if i in sources:
                incoming = pending.pop(i, []) + back.get(i, [])
                if incoming and not first:
                    horizon = max(horizon, pos[i] + MAX_LOOKBACK)
                paths = paths + [path.copy() for path in incoming if path not in paths]  # copies: mutated below
                newest = max((path.entries[-1][1] for path in paths), default=0)
            if not first and pos[i] >= horizon:
                if not paths and not pending and i > last_back:
                    break
                paths = []
                continue
            kind = facts.kind
            if kind == MFMA:
                self._check_mfma(i, facts, paths, first)
                entry = (i, pos[i] + facts.ws, STRAIGHT)
                newest = entry[1]
                if not paths:
                    paths = [_Path([entry], facts.result_mask)]
                else:
                    floor = pos[i] - MAX_LOOKBACK
                    for path in paths:
                        entries = path.entries
                        if entries[0][1] <= floor:
                            while entries and entries[0][1] <= floor:
                                del entries[0]
                            mask = 0
                            for j, _, _ in entries:
                                mask |= ins[j].result_mask
                            path.mask = mask
                        entries.append(entry)
                        path.mask |= facts.result_mask
                    if len(paths) > 1:
                        unique: list[_Path] = []
                        for path in paths:
                            if path not in unique:
                                unique.append(path)
                        paths = unique
            elif kind != SCALAR and paths and pos[i] - newest < MAX_LOOKBACK:
                here = pos[i]
                rule = VALU_READ if kind == VALU else MEM_READ
                for path in paths:
                    if not path.mask & facts.mask:
                        continue
                    for register in facts.reads:
                        hit = self._nearest_write(here, path, register)
                        if hit:
                            self._record(hit[0], i, rule, hit[2], hit[1], register)
                    for register in facts.writes:
                        hit = self._nearest_write(here, path, register)
                        if hit:
                            self._record(hit[0], i, WAW, hit[2], hit[1], register)
                        self._nearest_srcc_read(i, path, register)
            flow = facts.flow
            if flow:
                t = targets.get(i)
                if t is not None and paths:
                    carried = self._carry(paths, i, t, TAKEN)
                    if carried:
                        into = back_out if t <= i else pending
                        known = into.setdefault(t, [])
                        known.extend(path for path in carried if path not in known)
                if flow == CBRANCH and i + 1 < len(ins):  # (i + 1 is an event when it holds a consumer)
                    paths = self._carry(paths, i, i + 1, FALL_THROUGH)
                    newest = max((path.entries[-1][1] for path in paths), default=0)
                else:
                    paths = []
        return back_out

    def _nearest_write(self, here: int, path: _Path, register: tuple[int, int]) -> tuple[int, int, int] | None:
        """(index, present, path class) of the nearest MFMA on `path` whose destination overlaps `register`."""
        ins = self.ins
        for j, end, path_class in reversed(path.entries):
            present = here - end
            if present >= MAX_LOOKBACK:
                return None
            dst = ins[j].dst
            if dst[0] <= register[1] and register[0] <= dst[1]:
                return j, present, path_class
        return None

    def _nearest_srcc_read(self, i: int, path: _Path, register: tuple[int, int]) -> None:
        # IsSMFMAReadAsCFn: the nearest MFMA (not DGEMM) whose SrcC overlaps the register
        here, ins = self.pos[i], self.ins
        for j, end, path_class in reversed(path.entries):
            present = here - end
            if present >= MAX_WAR_LOOKBACK:
                return
            producer = ins[j]
            srcc = producer.srcs[2]
            if srcc is not None and not producer.mfma.dgemm and _overlaps(srcc, register):
                self._record(j, i, WAR, path_class, present, register)
                return

    def _check_mfma(self, i: int, facts: Instruction, paths: list[_Path], first: bool) -> None:
        here, ins = self.pos[i], self.ins
        for operand, register in enumerate(facts.srcs):
            if register is None:
                continue
            register_mask = (1 << (register[1] + 1)) - (1 << register[0])
            for path in paths:
                if not path.mask & register_mask:
                    continue
                hit = self._nearest_write(here, path, register)
                if hit:
                    j, present, path_class = hit
                    rule = SRC_AB if operand < 2 else (SRCC_EXACT if ins[j].dst == register else SRCC_OVERLAP)
                    self._record(j, i, rule, path_class, present, register)
        if first:  # VALU producers are found by a backward search, which does not depend on the pass
            self._valu_producers(i, facts)

    def _valu_producers(self, i: int, consumer: Instruction) -> None:
        """The nearest VALU (not MFMA, not DOT) on each path writing each MFMA source (2) or EXEC (4)."""
        ins, sources = self.ins, self.sources
        if i >= 4 and i not in self.near_branches:
            # Straight-line code for the 4 instructions before (4 wait states at the least): one path.
            wanted, exec_wanted, distance = list(consumer.reads), True, 0
            for p in range(i - 1, i - 5, -1):
                facts = ins[p]
                if facts.legacy_valu:
                    if distance < 2 and wanted and facts.write_mask & consumer.mask:
                        for register in list(wanted):
                            if any(_overlaps(written, register) for written in facts.writes):
                                self._record(p, i, VALU_WRITE, STRAIGHT, distance, register)
                                wanted.remove(register)
                    if exec_wanted and facts.writes_exec:
                        self._record(p, i, EXEC_WRITE, STRAIGHT, distance, None)
                        exec_wanted = False
                distance += facts.ws
                if distance >= 4 or (distance >= 2 and not exec_wanted):
                    return
            return
        stack = [(i, 0, STRAIGHT, consumer.reads, True)]
        while stack:
            k, distance, path_class, wanted, exec_wanted = stack.pop()
            predecessors = [(source, TAKEN) for source in self.sources.get(k, ())]
            if k > 0 and ins[k - 1].flow not in (BRANCH, END):
                predecessors.append((k - 1, FALL_THROUGH if ins[k - 1].flow == CBRANCH else STRAIGHT))
            for p, how in predecessors:
                here_class, facts = max(path_class, how), ins[p]
                still, still_exec = wanted, exec_wanted
                if facts.legacy_valu:
                    if distance < 2 and wanted:
                        still = []
                        for register in wanted:
                            if any(_overlaps(written, register) for written in facts.writes):
                                self._record(p, i, VALU_WRITE, here_class, distance, register)
                            else:
                                still.append(register)
                    if exec_wanted and facts.writes_exec:
                        self._record(p, i, EXEC_WRITE, here_class, distance, None)
                        still_exec = False
                after = distance + facts.ws
                if after < 2 or (still_exec and after < 4):
                    stack.append((p, after, here_class, still if after < 2 else (), still_exec))

    def _record(self, j: int, i: int, rule: str, path_class: int, present: int, register) -> None:
        key = (j, i, rule, path_class)
        if key not in self.found or self.found[key][0] > present:
            self.found[key] = (present, register)

    def run(self) -> None:
        seen: dict[int, list[_Path]] = {}
        back = self._pass({})
        for _ in range(self.MAX_PASSES):
            back = {t: new for t, paths in back.items() if (new := [p for p in paths if p not in seen.get(t, [])])}
            if not back:
                return
            for t, paths in back.items():
                seen.setdefault(t, []).extend(paths)
            back = self._pass(back)

    def edges(self) -> None:
        audit, target, ins = self.audit, self.target, self.ins
        for (j, i, rule, path), (present, register) in sorted(self.found.items(), key=lambda kv: (kv[0][1],
                                                                                                   kv[0][0])):
            producer, consumer = ins[j], ins[i]
            need = needed(rule, target, producer.mfma, consumer.mfma)
            need_942 = needed(rule, "gfx942", producer.mfma, consumer.mfma)
            stagger = staggered_need(rule, producer, register) if producer.kind == MFMA else None
            short_942 = present < need_942 and not (stagger is not None and present >= stagger)
            audit.dependencies += 1
            if target == "gfx942":
                if present < need and not short_942:
                    audit.staggered += 1
                short = short_942
            else:
                short = present < need
            if short:
                passes_wait = (any(text.startswith(_STALLS) for text in self.texts[j + 1:i]) if path == STRAIGHT
                               else None)
                audit.short_edges.append(ShortEdge(
                    producer_address=self.addresses[j], consumer_address=self.addresses[i],
                    producer=self.texts[j], consumer=self.texts[i], rule=rule, path=PATH_NAMES[path],
                    needed=need, present=present, gfx942_needed=need_942, short_on_gfx942=short_942,
                    passes_wait=passes_wait))


def audit_paths(addresses: list[int], texts: list[str], target: str) -> KernelAudit:
    """Audit one kernel's instructions, at `addresses` and spelt `texts`, under `target`'s MFMA rules."""
    audit = KernelAudit(target=target)
    walker = Walker(addresses, texts, target, audit)
    if audit.mfmas:  # without an MFMA there is no dependency to check
        walker.run()
        walker.edges()
    return audit

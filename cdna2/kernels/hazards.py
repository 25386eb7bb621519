"""MFMA wait-state audit: does a kernel leave the wait states gfx90a (or gfx942) needs after each MFMA?

The assembler proves every instruction valid; it cannot prove the spacing. On CDNA the code, not the hardware, must
put enough wait states (independent instructions or ``s_nop``) between an MFMA and an instruction that depends on it,
and gfx90a's MFMAs take twice gfx942's passes, so a one-for-one translation keeps gfx942's (shorter) spacing.

Rules and pass counts are LLVM's (cited where they are used); the tests run one-producer/one-consumer cases through
``llc -run-pass=post-RA-hazard-rec`` for both CPUs and require the audit's requirement to equal the ``s_nop``\\ s
LLVM inserts. Each instruction counts one wait state, ``s_nop N`` counts N+1 (``SIInstrInfo::getNumWaitStates``).
As in LLVM, each register operand of a consumer is checked against the nearest earlier producer on each path
(``getWaitStatesSinceDef``), looking back at most 19 wait states (15 for WAR).

Covered (GCNHazardRecognizer.cpp, checkMAIHazards90A and checkMAIVALUHazards): an MFMA result read by VALU
(``v_accvgpr_read``, DPP and SDWA included), VMEM/FLAT/LDS/export (VGPRs and AccVGPRs); SrcA/B and SrcC reads of a
previous MFMA's result (same tuple and partial overlap); write-after-write; overwriting a register an MFMA reads as
SrcC; VALU writes (``v_accvgpr_write`` included) and EXEC writes feeding an MFMA. Not covered: the DOT-instruction
rules, the gfx90a DGEMM VALU-to-VMEM workaround (DMFMABetweenVALUWriteVMEMRead) and checkMFMAPadding (performance
padding, off by default); no translated kernel holds a DOT or DGEMM instruction. Registers between
``s_set_gpr_idx_on`` and ``_off`` are audited as named (``gpr_indexed_instructions`` counts them).

Every dependency is classed by the path from producer to consumer: ``straight-line`` (no branch instruction on the
path), ``fall-through`` (the path passes an ``s_cbranch`` not taken) or ``taken-branch`` (the path takes a branch,
loop back edges included). A kernel's verdict: ``clean``, ``short-across-branches`` (short only on paths that cross
a branch), ``short-straight-line``, or ``unaudited`` (a line the audit cannot parse or a branch target it cannot
resolve: never called clean).

API (also what padding short edges with ``s_nop``, issue 17, builds on):

    audit_listing(listing, target="gfx90a") -> KernelAudit
        listing: (address, size in bytes, text) per instruction in address order, text as LLVM prints it
        (``llvm-mc -disassemble``; objdump lines go through ``listing_from_objdump``), gfx90a or gfx942 spelling.
        Re-audit a re-assembled listing by calling it again.
    KernelAudit.short_edges: [ShortEdge(producer_address, consumer_address, producer, consumer, rule, path,
                                        needed, present, gfx942_needed, short_on_gfx942, passes_wait)], in
        consumer order; padding an edge with needed - present wait states (s_nop N gives N+1) between producer
        and consumer, on its path, is what LLVM would insert
    KernelAudit.verdict, .worst (the edge the verdict rests on), .to_json()
    audit_batch(...): the engine's stage, run in worker processes over code objects.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate, compress
from operator import attrgetter
from pathlib import Path
from typing import Iterable

from cdna2.host import elf
from cdna2.kernels import isa
from cdna2.kernels.llvm import parse_objdump_line

# Bump whenever a verdict may change for the same input (rules, parsing, path classes).
AUDIT_VERSION = "1"
TARGETS = ("gfx90a", "gfx942")

CLEAN, SHORT_BRANCHES, SHORT_STRAIGHT, UNAUDITED = ("clean", "short-across-branches", "short-straight-line",
                                                    "unaudited")
VERDICTS = (CLEAN, SHORT_BRANCHES, SHORT_STRAIGHT, UNAUDITED)
STRAIGHT, FALL_THROUGH, TAKEN = 0, 1, 2
PATH_NAMES = ("straight-line", "fall-through", "taken-branch")

# What each policy installs (kernel_hazard_policy, host data). "default": a kernel short in straight-line code is
# short every time that code runs, so it is withheld; a kernel short only across branches is installed and listed
# (the time a taken branch costs may cover the gap: fmha_v3_fwd, short only there, is the family validated
# numerically on MI210s).
POLICIES = {
    "default": (CLEAN, SHORT_BRANCHES),
    "strict": (CLEAN,),
    "permissive": VERDICTS,
}
DEFAULT_POLICY = "default"

# Rules (GCNHazardRecognizer.cpp). VALU_READ/MEM_READ/WAW/WAR: checkMAIVALUHazards; SRC*/VALU_WRITE/EXEC_WRITE:
# checkMAIHazards90A (gfx90a and gfx942 alike; v_accvgpr_read/write are plain VALU there, checkMAILdStHazards
# returns 0 on gfx90a+).
VALU_READ = "mfma-result-read-by-valu"  # SMFMA*WriteVgprVALUMemExpRead, GFX940_*_WriteVgprVALUMemExpRead
MEM_READ = "mfma-result-read-by-memory"  # same constants, consumer VMEM/FLAT/LDS/export (DMFMA*WriteVgprMemExpRead)
WAW = "mfma-result-overwritten"  # SMFMA*WriteVgprVALUWaw, GFX940_*_WriteVgprVALUWaw
WAR = "srcc-overwritten"  # SMFMA*ReadVgprVALUWar, GFX940_XDL4PassReadVgprVALUWar
SRCC_EXACT = "srcc-same-tuple"  # GFX940_SMFMA4x4WritesVGPRFullSrcC, DMFMA4x4WritesVGPRFullSrcC
SRCC_OVERLAP = "srcc-partial-overlap"  # SMFMA*WritesVGPROverlapped*SrcC, GFX940_*_WritesVGPROverlapped*SrcC
SRC_AB = "srcab-read"  # SMFMA*WritesVGPROverlappedSrcAB, GFX940_*_WritesVGPROverlappedSrcAB
VALU_WRITE = "valu-write-read-by-mfma"  # LegacyVALUNotDotWritesVGPRWaitStates = 2
EXEC_WRITE = "exec-write-before-mfma"  # VALUWritesExecWaitStates = 4
MAX_LOOKBACK, MAX_WAR_LOOKBACK = 19, 15  # MaxWaitStates, MaxWarWaitStates in checkMAIVALUHazards

MFMA, VALU, MEMORY, SCALAR = "mfma", "valu", "memory", "scalar"
BRANCH, CBRANCH, END = "branch", "cbranch", "end"

MAX_EDGES_LISTED = 20


# --- MFMA facts: passes (SISchedule.td), XDL (VOP3PInstructions.td) ------------------------------------------------

# SISchedule.td, SIDPFullSpeedModel (gfx90a, GCNProcessors.td) and SIDPGFX942FullSpeedModel (gfx942): InstRW regexes
# over LLVM's opcode names, first match wins, value = passes (Write*PassMAI / Write*PassDGEMM).
_PASSES = {
    "gfx90a": ((r"^V_MFMA_.32_4X4X", 2), (r"^V_MFMA_.32_16X16X", 8), (r"^V_MFMA_.32_32X32X", 16),
               (r"^V_MFMA_.64_4X4X", 4), (r"^V_MFMA_.64_16X16X", 8)),
    "gfx942": ((r"^V_MFMA_.32_4X4X", 2), (r"^V_MFMA_.32_16X16X8X", 4), (r"^V_MFMA_.32_16X16X16", 4),
               (r"^V_MFMA_.32_16X16X32", 4), (r"^V_MFMA_.32_16X16X[14][FBI]", 8), (r"^V_MFMA_.32_32X32X4XF", 8),
               (r"^V_MFMA_.32_32X32X8", 8), (r"^V_MFMA_.32_32X32X16", 8), (r"^V_MFMA_.32_32X32X[124][FBI]", 16),
               (r"^V_MFMA_.64_4X4X", 4), (r"^V_MFMA_.64_16X16X", 8)),
}
# VOP3PInstructions.td: is_gfx940_xdl = 1 on every MFMA but the f32-input ones and f64. On gfx90a isXDL() is true
# for every MFMA that is not a DGEMM (GCNHazardRecognizer.cpp, isXDL).
_GFX942_NOT_XDL = {"V_MFMA_F32_4X4X1F32", "V_MFMA_F32_16X16X1F32", "V_MFMA_F32_16X16X4F32", "V_MFMA_F32_32X32X1F32",
                   "V_MFMA_F32_32X32X2F32"}
# gfx942 assembler spellings whose LLVM opcode is named after the gfx90a spelling (cdna2.kernels.isa.RENAMES), plus
# the gfx942-only xf32 ones, whose opcode names drop the underscore.
_OPCODE_SPELLING = {"v_mfma_f32_16x16x8_xf32": "v_mfma_f32_16x16x8xf32",
                    "v_mfma_f32_32x32x4_xf32": "v_mfma_f32_32x32x4xf32"}
_MFMA_SHAPE = re.compile(r"^v_mfma_([fi])(32|64)_(4x4|16x16|32x32)x")


@dataclass(frozen=True)
class Mfma:
    opcode: str  # LLVM's opcode name, e.g. V_MFMA_F32_16X16X16BF16_1K
    shape: str  # 4x4, 16x16, 32x32
    dgemm: bool
    passes: dict  # target -> passes
    xdl: dict  # target -> bool


@lru_cache(maxsize=None)
def mfma_facts(name: str) -> Mfma | None:
    """Passes and XDL-ness of an MFMA mnemonic (either spelling) on both targets; None when not an MFMA we know."""
    shape = _MFMA_SHAPE.match(name)
    if not shape:
        return None
    # LLVM's opcodes are named after the gfx90a spellings (isa.RENAMES maps gfx942's to them)
    opcode = _OPCODE_SPELLING.get(name, isa.RENAMES.get(name, name)).upper()
    passes = {}
    for target, table in _PASSES.items():
        passes[target] = next((count for pattern, count in table if re.match(pattern, opcode)), None)
        if passes[target] is None:
            return None
    dgemm = shape.group(1) == "f" and shape.group(2) == "64"
    return Mfma(opcode=opcode, shape=shape.group(3), dgemm=dgemm, passes=passes,
                xdl={"gfx90a": not dgemm, "gfx942": not dgemm and opcode not in _GFX942_NOT_XDL})


_FIXED = {(2, "gfx90a"): 5, (8, "gfx90a"): 11, (16, "gfx90a"): 19}  # SMFMA{4x4,16x16,32x32}Write... = 5/11/19


def needed(rule: str, target: str, producer: Mfma | None, consumer: Mfma | None = None) -> int:
    """Wait states LLVM requires between producer and consumer under `rule` on `target` (GCNHazardRecognizer.cpp)."""
    if rule == VALU_WRITE:
        return 2
    if rule == EXEC_WRITE:
        return 4
    passes, xdl, gfx942 = producer.passes[target], producer.xdl[target], target == "gfx942"
    small = producer.shape == "4x4"
    if rule in (VALU_READ, MEM_READ, WAW, SRC_AB):
        if producer.dgemm:  # DMFMA4x4/16x16: VALU read and WAW 6/11, memory read 9/18, SrcA/B 6/11
            return (9 if small else 18) if rule == MEM_READ else (6 if small else 11)
        if gfx942:  # GFX940_XDL_N_Pass*: P+3; GFX940_SMFMA_N_Pass*: P+2
            return passes + 3 if xdl else passes + 2
        return _FIXED[passes, target]
    if rule == WAR:  # IsSMFMAReadAsCFn skips DGEMM and, on gfx942, non-XDL readers
        if producer.dgemm or (gfx942 and not xdl):
            return 0
        return {2: 1, 4: 3, 8: 7, 16: 15}[passes]
    if rule == SRCC_EXACT:
        if producer.dgemm and consumer.dgemm and small and consumer.shape == "4x4":
            return 4  # DMFMA4x4WritesVGPRFullSrcCWaitStates
        return 2 if gfx942 and passes == 2 else 0  # GFX940_SMFMA4x4WritesVGPRFullSrcCWaitStates
    if rule == SRCC_OVERLAP:
        if producer.dgemm:
            if not gfx942 and not consumer.dgemm:
                return 0
            return 0 if consumer.xdl[target] else (4 if small else 9)  # DMFMA{4x4,16x16}WritesVGPROverlappedSrcC
        if gfx942:
            if consumer.xdl[target] and not xdl:
                return 0
            return passes + 1 if xdl else passes
        return passes + 1 if consumer.dgemm else passes  # SMFMA*WritesVGPROverlapped{D,S}MFMASrcC: 3/9/17, 2/8/16
    raise ValueError(f"unknown hazard rule {rule!r}")


def staggered_need(rule: str, producer: "Instruction", operand: tuple[int, int]) -> int | None:
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


# --- parsing LLVM's instruction text --------------------------------------------------------------------------------

_REGISTER = re.compile(r"(?<![\w.])([va])(?:(\d+)|\[(\d+):(\d+)\])(?![\w\[])")
_DS_RETURNS = re.compile(r"read|rtn|permute|swizzle|append|consume")
_MEMORY_PREFIXES = ("buffer_", "tbuffer_", "global_", "flat_", "scratch_", "ds_", "image_")
_RETURN_MODIFIER = re.compile(r"\s(glc|sc0)(\s|$)")  # an atomic returns the old value (gfx90a glc, gfx942 sc0)


_WAIT_STATES = attrgetter("ws")
_STALLS = ("s_waitcnt", "s_barrier", "s_sleep")  # may take longer than the one wait state they count


class UnparsedError(ValueError):
    """The audit cannot tell which registers an instruction reads or writes."""


def _ranges(text: str) -> list[tuple[int, int]]:
    """Vector registers named in text, as (first, last) in one numbering: v0..v255 -> 0..255, a0..a255 -> 256..511."""
    out = []
    for bank, single, first, last in _REGISTER.findall(text):
        lo, hi = (int(single), int(single)) if single else (int(first), int(last))
        if hi < lo or hi > 255:
            raise UnparsedError(f"register {bank}[{lo}:{hi}] out of range")
        base = 256 if bank == "a" else 0
        out.append((base + lo, base + hi))
    return out


def _mask(ranges: Iterable[tuple[int, int]]) -> int:
    mask = 0
    for lo, hi in ranges:
        mask |= (1 << (hi + 1)) - (1 << lo)
    return mask


class Instruction:
    """What the audit needs of one instruction text."""

    __slots__ = ("text", "kind", "ws", "flow", "offset", "reads", "writes", "mfma", "dst", "srcs", "writes_exec",
                 "legacy_valu", "gpr_index", "mask", "result_mask", "write_mask")

    def __init__(self, text: str):
        self.text = text
        name, _, operands = text.partition(" ")
        self.kind, self.ws, self.flow, self.offset = SCALAR, 1, None, 0
        self.reads: tuple = ()
        self.writes: tuple = ()
        self.mfma, self.dst, self.srcs = None, None, ()
        self.writes_exec = self.legacy_valu = False
        self.gpr_index = None  # "on"/"off" for s_set_gpr_idx_on/off
        if name.startswith("s_"):
            self._scalar(name, operands)
        elif name.startswith("v_"):
            self._vector(name, operands)
        elif name.startswith(_MEMORY_PREFIXES) or name == "exp":
            self._memory(name, operands)
        else:
            raise UnparsedError(f"unknown instruction class {name!r}")
        self.mask = _mask(self.reads + self.writes)  # every vector register touched
        self.write_mask = _mask(self.writes)
        self.result_mask = _mask((self.dst, self.srcs[2] or self.dst)) if self.mfma else 0

    def _scalar(self, name: str, operands: str) -> None:
        if name == "s_nop":
            self.ws = int(operands, 0) + 1
        elif name in ("s_branch", "s_call_b64") or name.startswith("s_cbranch_"):
            self.flow = BRANCH if name == "s_branch" else CBRANCH  # a call returns: it falls through, as cbranch
            target = operands.rsplit(",", 1)[-1].strip()
            if not target.isdigit():
                raise UnparsedError(f"branch target {target!r} is not the encoded offset (objdump listings go "
                                    "through listing_from_objdump)")
            simm16 = int(target)
            self.offset = simm16 - 0x10000 if simm16 >= 0x8000 else simm16
        elif name.startswith(("s_endpgm", "s_setpc_", "s_swappc_", "s_rfe_")):
            self.flow = END  # the program ends or continues at an address held in registers
        elif name in ("s_set_gpr_idx_on", "s_set_gpr_idx_off"):
            self.gpr_index = name.rsplit("_", 1)[1]

    def _vector(self, name: str, operands: str) -> None:
        first, _, rest = operands.partition(", ")
        if name.startswith(("v_mfma_", "v_smfmac_")):
            self.mfma = mfma_facts(name)
            if self.mfma is None:
                raise UnparsedError(f"MFMA {name!r} has no pass count in LLVM's scheduling models")
            parts = [part.split()[0] if part.split() else "" for part in operands.split(", ")]
            if len(parts) != 4:
                raise UnparsedError(f"MFMA with {len(parts)} operands")
            dst = _ranges(parts[0])
            if len(dst) != 1:
                raise UnparsedError("MFMA destination is not a register tuple")
            self.kind, self.dst = MFMA, dst[0]
            self.srcs = tuple((_ranges(part) or [None])[0] for part in parts[1:])
            self.writes, self.reads = (self.dst,), tuple(r for r in self.srcs if r is not None)
            return
        self.kind, self.legacy_valu = VALU, not name.startswith("v_dot")
        if name.startswith("v_swap"):
            self.writes = self.reads = tuple(_ranges(operands))
            return
        self.writes = tuple(_ranges(first))
        self.reads = tuple(_ranges(rest))
        self.writes_exec = name.startswith("v_cmpx") or first.strip().startswith("exec")

    def _memory(self, name: str, operands: str) -> None:
        self.kind = MEMORY
        first, _, rest = operands.partition(", ")
        if name.startswith("ds_"):
            returns = bool(_DS_RETURNS.search(name))
        elif "atomic" in name:
            returns = bool(_RETURN_MODIFIER.search(operands))
        else:
            # loads write their first operand unless they load into LDS (" lds", *_load_lds_*): then it is an address
            returns = ("_load" in name or name.startswith(("image_sample", "image_gather"))) and not (
                " lds" in operands or "_lds_" in name)
        if returns:
            self.writes = tuple(_ranges(first))
            # a buffer atomic returns into its data operand; global/flat atomics have a separate destination
            self.reads = tuple(_ranges(rest)) + (self.writes if name.startswith("buffer_atomic") else ())
        else:
            self.reads = tuple(_ranges(operands))


@lru_cache(maxsize=None)  # a tree has about 100k distinct instruction texts
def parse(text: str) -> Instruction | str:
    """The instruction's facts, or the reason it cannot be parsed."""
    try:
        return Instruction(text)
    except (UnparsedError, ValueError) as error:
        return str(error)


# --- the audit ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShortEdge:
    producer_address: int
    consumer_address: int
    producer: str
    consumer: str
    rule: str
    path: str  # straight-line, fall-through, taken-branch
    needed: int  # on the audited target
    present: int
    gfx942_needed: int  # what gfx942 needs at the same edge (the source's own chip)
    short_on_gfx942: bool  # below gfx942's rule too, after the staggered-writeback credit
    # Straight-line edges: whether an s_waitcnt or s_barrier lies between. It counts one wait state, as in LLVM, but
    # may stall for longer when it runs; None on paths across branches (which path it is, is not kept).
    passes_wait: bool | None = None

    def to_json(self) -> dict:
        return {"producer_address": f"{self.producer_address:#x}", "consumer_address": f"{self.consumer_address:#x}",
                "producer": self.producer, "consumer": self.consumer, "rule": self.rule, "path": self.path,
                "needed": self.needed, "present": self.present, "gfx942_needed": self.gfx942_needed,
                "short_on_gfx942": self.short_on_gfx942, "passes_wait": self.passes_wait}


@dataclass
class KernelAudit:
    target: str
    instructions: int = 0
    mfmas: int = 0
    dependencies: int = 0  # producer/consumer edges checked (within the look-back)
    staggered: int = 0  # gfx942 edges below LLVM's rule that the staggered-writeback credit accepts
    short_edges: list[ShortEdge] = field(default_factory=list)
    unparsed: list[tuple[int, str, str]] = field(default_factory=list)  # (address, text, why)
    unresolved: list[tuple[int, str]] = field(default_factory=list)  # branches whose target is no instruction
    gpr_indexed: int = 0  # instructions between s_set_gpr_idx_on and _off: registers audited as named

    @property
    def verdict(self) -> str:
        if self.unparsed or self.unresolved:
            return UNAUDITED
        if any(edge.path == PATH_NAMES[STRAIGHT] for edge in self.short_edges):
            return SHORT_STRAIGHT
        return SHORT_BRANCHES if self.short_edges else CLEAN

    @property
    def worst(self) -> ShortEdge | None:
        """The largest shortfall among the edges the verdict rests on (straight-line ones when there are any)."""
        straight = [edge for edge in self.short_edges if edge.path == PATH_NAMES[STRAIGHT]]
        candidates = straight or self.short_edges
        return max(candidates, key=lambda e: (e.needed - e.present, -e.consumer_address), default=None)

    def shortfalls(self, base: int = 0) -> dict[int, int]:
        """Consumer address - `base` -> the wait states missing before it (the largest shortfall of its edges)."""
        missing: dict[int, int] = {}
        for edge in self.short_edges:
            offset = edge.consumer_address - base
            missing[offset] = max(missing.get(offset, 0), edge.needed - edge.present)
        return missing

    def to_json(self) -> dict:
        paths = {name: 0 for name in PATH_NAMES}
        for edge in self.short_edges:
            paths[edge.path] += 1
        worst = self.worst
        return {
            "target": self.target, "audit_version": AUDIT_VERSION, "verdict": self.verdict,
            "instructions": self.instructions, "mfmas": self.mfmas, "dependencies": self.dependencies,
            "short_edges": paths, "short_on_gfx942": sum(e.short_on_gfx942 for e in self.short_edges),
            "straight_line_passing_wait": sum(bool(e.passes_wait) for e in self.short_edges),
            "staggered": self.staggered, "worst": worst.to_json() if worst else None,
            "edges": [edge.to_json() for edge in self.short_edges[:MAX_EDGES_LISTED]],
            "unparsed": [{"address": f"{a:#x}", "text": t, "reason": why} for a, t, why in self.unparsed],
            "unresolved_branches": [{"address": f"{a:#x}", "text": t} for a, t in self.unresolved],
            "gpr_indexed_instructions": self.gpr_indexed,
        }


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


class _Walker:
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


def audit_listing(listing: Iterable[tuple[int, int, str]], target: str = "gfx90a") -> KernelAudit:
    """Audit one kernel's instructions, (address, size, text) in address order, under `target`'s MFMA rules."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: the audit knows {', '.join(TARGETS)}")
    listing = list(listing)
    return _audit([address for address, _, _ in listing], [text for _, _, text in listing], target)


def _audit(addresses: list[int], texts: list[str], target: str) -> KernelAudit:
    audit = KernelAudit(target=target)
    walker = _Walker(addresses, texts, target, audit)
    if audit.mfmas:  # without an MFMA there is no dependency to check
        walker.run()
        walker.edges()
    return audit


def listing_from_objdump(lines: list[str]) -> list[tuple[int, int, str]]:
    """(address, size, text) from llvm-objdump instruction lines; branch targets, which objdump may print as
    labels, are put back as the encoded offset (the low 16 bits of the first word)."""
    listing = []
    for line in lines:
        address, text, words = parse_objdump_line(line)
        words = words.split("<", 1)[0].split()
        name = text.split(None, 1)[0]
        if name in ("s_branch", "s_call_b64") or name.startswith("s_cbranch_"):
            text = f"{text.rpartition(' ')[0]} {int(words[0], 16) & 0xFFFF}"
        listing.append((address, 4 * len(words), text))
    return listing


def installs(policy: str, verdict: str) -> bool:
    """Whether `policy` installs a kernel with `verdict`."""
    return verdict in POLICIES[policy]


# --- the engine's stage (runs in worker processes) -----------------------------------------------------------------

def audit_batch(src_root: str, relpaths: list[str], texts: dict[bytes, str],
                target: str) -> list[tuple[str, dict, dict[int, int]]]:
    """Audit each code object: its .text cut into instructions, each spelt as `texts` gives it. Per kernel: the
    audit (KernelAudit.to_json) and its shortfalls by consumer .text offset (what padding the kernel needs)."""
    results = []
    for relpath in relpaths:
        data = Path(src_root, relpath).read_bytes()
        code_object = elf.read_code_object(data)
        chunks = isa.split_instructions(elf.text_of(data, code_object))
        addresses = list(accumulate(map(len, chunks), initial=code_object.text_address))
        audit = _audit(addresses, list(map(texts.__getitem__, chunks)), target)
        results.append((relpath, audit.to_json(), audit.shortfalls(code_object.text_address)))
    return results

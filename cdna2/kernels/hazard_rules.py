"""The MFMA wait-state rules the audit applies: what LLVM requires between a producer and a consumer on each target.

Rule names, pass counts and the wait states they need are LLVM's (GCNHazardRecognizer.cpp, SISchedule.td,
VOP3PInstructions.td; cited where each is used); the staggered-writeback credit AMD's gfx942 code relies on is in
hazard_paths (``staggered_need``), which applies it. Also here: the verdicts, the path classes and which verdicts
each kernel hazard policy installs.
Entry point: ``needed(rule, target, producer, consumer)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from cdna2.kernels import isa

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


def installs(policy: str, verdict: str) -> bool:
    """Whether `policy` installs a kernel with `verdict`."""
    return verdict in POLICIES[policy]

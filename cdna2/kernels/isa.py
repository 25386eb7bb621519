"""What the translator knows about the AMDGPU instruction set: instruction lengths, the rename map, blocker buckets.

Splitting is done here, in Python, because it is ~8x cheaper than running llvm-objdump over the whole tree; it is
never trusted on its own: every distinct instruction is decoded by LLVM, which must consume exactly the bytes the
split gave it, and every written file is disassembled by llvm-objdump and compared instruction by instruction.
"""

from __future__ import annotations

import re
from itertools import accumulate

# gfx942 mnemonics whose gfx90a spelling names the very same operation (LLVM accepts the gfx90a spelling as an
# alias on gfx942, and the engine checks that both spellings encode to the same gfx942 bytes before using a row).
# The bf16 16x16x16 row must land on the `_1k` opcode (D3E7 on gfx90a); the old hand patch to D3CD (f16) computed
# garbage at full speed.
RENAMES = {
    "v_mfma_f32_32x32x4_2b_bf16": "v_mfma_f32_32x32x4bf16_1k",
    "v_mfma_f32_16x16x4_4b_bf16": "v_mfma_f32_16x16x4bf16_1k",
    "v_mfma_f32_4x4x4_16b_bf16": "v_mfma_f32_4x4x4bf16_1k",
    "v_mfma_f32_32x32x8_bf16": "v_mfma_f32_32x32x8bf16_1k",
    "v_mfma_f32_16x16x16_bf16": "v_mfma_f32_16x16x16bf16_1k",
    "v_mfma_f32_32x32x4_2b_f16": "v_mfma_f32_32x32x4f16",
    "v_mfma_f32_16x16x4_4b_f16": "v_mfma_f32_16x16x4f16",
    "v_mfma_f32_4x4x4_16b_f16": "v_mfma_f32_4x4x4f16",
    "v_mfma_f32_32x32x8_f16": "v_mfma_f32_32x32x8f16",
    "v_mfma_f32_16x16x16_f16": "v_mfma_f32_16x16x16f16",
    "v_mfma_f32_32x32x1_2b_f32": "v_mfma_f32_32x32x1f32",
    "v_mfma_f32_16x16x1_4b_f32": "v_mfma_f32_16x16x1f32",
    "v_mfma_f32_4x4x1_16b_f32": "v_mfma_f32_4x4x1f32",
    "v_mfma_f32_32x32x2_f32": "v_mfma_f32_32x32x2f32",
    "v_mfma_f32_16x16x4_f32": "v_mfma_f32_16x16x4f32",
    "v_mfma_i32_32x32x4_2b_i8": "v_mfma_i32_32x32x4i8",
    "v_mfma_i32_16x16x4_4b_i8": "v_mfma_i32_16x16x4i8",
    "v_mfma_i32_4x4x4_16b_i8": "v_mfma_i32_4x4x4i8",
    "v_mfma_f64_16x16x4_f64": "v_mfma_f64_16x16x4f64",
    "v_mfma_f64_4x4x4_4b_f64": "v_mfma_f64_4x4x4f64",
}

INT8_K32 = "int8 with K=32"  # the bucket the split (split.py) can unlock
# Why a blocking instruction blocks, checked in this order; the first match names the bucket.
BUCKETS = (
    ("fp8", re.compile(r"fp8|bf8")),
    ("gfx950-only", re.compile(r"mfma_f32_(16x16x32|32x32x16)_(bf16|f16)")),
    (INT8_K32, re.compile(r"mfma_i32_(16x16x32|32x32x16)_i8")),
    ("bf16 atomics", re.compile(r"atomic\w*_bf16")),
    ("64-bit VALU", re.compile(r"^v_\S*_(u64|b64|i64)")),  # v_lshl_add_u64, v_mov_b64_e32, ...
    ("cache-policy modifiers", re.compile(r"\s(sc0|sc1|nt)(\s|$)")),
)
OTHER = "other"
BUCKET_NAMES = tuple(name for name, _ in BUCKETS) + (OTHER,)


class SplitError(ValueError):
    """The .text bytes cannot be cut into whole instructions."""


# Instruction lengths, from the first 32-bit word (little-endian bytes b0 b1 b2 b3; b3 holds bits 31:24).
# One regular expression does the cut, because a Python loop over ~6M instructions costs ~3x more; alternatives are
# tried in order, and together they match any 4 bytes, so every instruction start is matched.
_ANY_EVEN = b"[" + b"".join(re.escape(bytes([value])) for value in range(0, 256, 2)) + b"]"
_SRC0_SPECIAL = rb"[\xf9\xfa\xff]" + _ANY_EVEN  # VOP src0 (bits 8:0) = literal 0xFF, SDWA 0xF9 or DPP 0xFA
_VOP2_WITH_CONSTANT = rb"[\x2e-\x31\x48-\x4b]"  # VOP2 ops 0x17, 0x18, 0x24, 0x25: v_mad{mk,ak}_{f32,f16}
_INSTRUCTION_PATTERNS = (
    rb"...[\xc0-\xd3\xd8-\xff].{4}",  # SMEM, EXP, VOP3(P), DS, FLAT, MUBUF, MTBUF, MIMG: 8 bytes
    rb"...[\xd4-\xd7]",  # VINTRP: 4 bytes
    _SRC0_SPECIAL + rb"." + _VOP2_WITH_CONSTANT + rb".{8}",
    _SRC0_SPECIAL + rb".[\x00-\x7f].{4}",  # VOP1/VOP2/VOPC with literal, SDWA or DPP word
    rb"..." + _VOP2_WITH_CONSTANT + rb".{4}",
    rb"...[\x00-\x7f]",  # VOP1/VOP2/VOPC
    rb"..[\x80-\xff]\xbf",  # SOPP
    rb"(?:\xff.|.\xff)[\x00-\x7f]\xbf.{4}",  # SOPC with a literal source
    rb"..[\x00-\x7f]\xbf",  # SOPC
    rb"\xff.[\x80-\xff]\xbe.{4}",  # SOP1 with a literal source
    rb"..[\x80-\xff]\xbe",  # SOP1
    rb"..[\x00-\x7f]\xba.{4}",  # SOPK op 0x14 s_setreg_imm32_b32, which carries a constant
    rb"...[\xb0-\xbe]",  # SOPK
    rb"(?:\xff.|.\xff).[\x80-\xaf].{4}",  # SOP2 with a literal source
    rb"...[\x80-\xaf]",  # SOP2
)
_INSTRUCTION = re.compile(rb"(?s:" + b"|".join(_INSTRUCTION_PATTERNS) + rb")")


def split_instructions(text: bytes) -> list[bytes]:
    """Cut a .text section into its instructions (each 4, 8 or 12 bytes), in order."""
    if len(text) % 4:
        raise SplitError(f".text is {len(text)} bytes, not a whole number of 32-bit words")
    instructions = _INSTRUCTION.findall(text)
    # findall skips what it cannot match; the only such place is a long instruction cut off by the section's end.
    if len(b"".join(instructions)) != len(text):  # a C-level copy: summing 6M lengths costs 4x more
        raise SplitError("the last instruction of .text runs past the end of the section")
    return instructions


def offsets(instructions: list[bytes]) -> list[int]:
    """The .text offset of each instruction, and one more entry: the end of the code."""
    return list(accumulate(map(len, instructions), initial=0))


def mnemonic(text: str) -> str:
    return text.split(None, 1)[0] if text else ""


def rename(text: str) -> str:
    """The gfx90a spelling of a gfx942 instruction text (unchanged when no rename applies)."""
    name, sep, operands = text.partition(" ")
    renamed = RENAMES.get(name)
    return renamed + sep + operands if renamed else text


def bucket_of(text: str) -> str:
    for name, pattern in BUCKETS:
        if pattern.search(text):
            return name
    return OTHER


# Program-counter facts, from the encodings (GFX9 SOPP/SOP1/SOPK, the same on gfx90a and gfx942).
# SOPP branches carry a signed 16-bit dword offset from the next instruction: target = address + 4 + 4 * simm16.
BRANCHES = {2: "s_branch", 4: "s_cbranch_scc0", 5: "s_cbranch_scc1", 6: "s_cbranch_vccz", 7: "s_cbranch_vccnz",
            8: "s_cbranch_execz", 9: "s_cbranch_execnz", 23: "s_cbranch_cdbgsys", 24: "s_cbranch_cdbguser",
            25: "s_cbranch_cdbgsys_or_user", 26: "s_cbranch_cdbgsys_and_user"}
BRANCH_RANGE = (-32768, 32767)  # simm16, in dwords
# Instructions whose effect depends on where code lies (they read or load the PC): moving code changes them.
_PC_SOP1 = {0x1C: "s_getpc_b64", 0x1D: "s_setpc_b64", 0x1E: "s_swappc_b64", 0x1F: "s_rfe_b64"}
_SOPK_CALL = 0x15  # s_call_b64


def branch_of(chunk: bytes) -> tuple[str, int] | None:
    """(mnemonic, signed dword offset) of a SOPP branch, else None."""
    if len(chunk) != 4:
        return None
    word = int.from_bytes(chunk, "little")
    if word >> 23 != 0x17F or (word >> 16) & 0x7F not in BRANCHES:
        return None
    offset = word & 0xFFFF
    return BRANCHES[(word >> 16) & 0x7F], offset - 0x10000 if offset & 0x8000 else offset


def pc_dependent(chunk: bytes) -> str | None:
    """The mnemonic of an instruction that reads or writes the PC other than a SOPP branch (s_getpc_b64, ...)."""
    if len(chunk) < 4:
        return None
    word = int.from_bytes(chunk[:4], "little")
    if word >> 23 == 0x17D and (word >> 8) & 0xFF in _PC_SOP1:
        return _PC_SOP1[(word >> 8) & 0xFF]
    if word >> 28 == 0xB and (word >> 23) & 0x1F == _SOPK_CALL:
        return "s_call_b64"
    return None

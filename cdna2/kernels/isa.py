"""What the translator knows about the AMDGPU instruction set: instruction lengths, the rename map, blocker buckets.

Splitting is done here, in Python, because it is ~8x cheaper than running llvm-objdump over the whole tree; it is
never trusted on its own: every distinct instruction is decoded by LLVM, which must consume exactly the bytes the
split gave it, and every written file is disassembled by llvm-objdump and compared instruction by instruction.
"""

from __future__ import annotations

import array
import re

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

# Why a blocking instruction blocks, checked in this order; the first match names the bucket.
BUCKETS = (
    ("fp8", re.compile(r"fp8|bf8")),
    ("gfx950-only", re.compile(r"mfma_f32_(16x16x32|32x32x16)_(bf16|f16)")),
    ("int8 with K=32", re.compile(r"mfma_i32_(16x16x32|32x32x16)_i8")),
    ("bf16 atomics", re.compile(r"atomic\w*_bf16")),
    ("64-bit VALU", re.compile(r"^v_\w*_(u64|b64|i64)\b")),
    ("cache-policy modifiers", re.compile(r"\s(sc0|sc1|nt)(\s|$)")),
)
OTHER = "other"
BUCKET_NAMES = tuple(name for name, _ in BUCKETS) + (OTHER,)


class SplitError(ValueError):
    """The .text bytes cannot be cut into whole instructions."""


# Instruction formats by the top 9 bits of the first dword (GCN3/CDNA encoding).
_FIXED_4, _FIXED_8, _VOP_32, _SALU_2SRC, _SALU_1SRC, _SOPK = range(6)
_VOP2_LITERAL_OPCODES = {0x17, 0x18, 0x24, 0x25}  # v_mad{mk,ak}_{f32,f16} always carry a 32-bit constant
_SOPK_SETREG_IMM32 = 0x14  # s_setreg_imm32_b32 carries a 32-bit constant
_SRC_LITERAL, _SRC_SDWA, _SRC_DPP = 0xFF, 0xF9, 0xFA


def _format_of(top9: int) -> int:
    word = top9 << 23
    if word >> 31 == 0:
        return _VOP_32  # VOP1, VOP2, VOPC
    if word >> 30 == 0b10:
        if top9 in (0b101111101, 0b101111110):
            return _SALU_1SRC if top9 == 0b101111101 else _SALU_2SRC  # SOP1, SOPC
        if top9 == 0b101111111:
            return _FIXED_4  # SOPP
        if word >> 28 == 0b1011:
            return _SOPK
        return _SALU_2SRC  # SOP2
    if word >> 26 == 0b110101:
        return _FIXED_4  # VINTRP
    return _FIXED_8  # SMEM, VOP3, VOP3P, DS, FLAT, MUBUF, MTBUF, MIMG, EXP


_FORMATS = tuple(_format_of(top9) for top9 in range(512))


def split_instructions(text: bytes) -> list[bytes]:
    """Cut a .text section into its instructions (each 4, 8 or 12 bytes), in order."""
    if len(text) % 4:
        raise SplitError(f".text is {len(text)} bytes, not a whole number of 32-bit words")
    words = array.array("I")
    words.frombytes(text)
    count, index, out = len(words), 0, []
    formats = _FORMATS
    while index < count:
        word = words[index]
        kind = formats[word >> 23]
        if kind == _FIXED_8:
            size = 2
        elif kind == _VOP_32:
            size = 2 if (word & 0x1FF) in (_SRC_LITERAL, _SRC_SDWA, _SRC_DPP) else 1
            if word >> 25 in _VOP2_LITERAL_OPCODES:
                size += 1
        elif kind == _SALU_2SRC:
            size = 2 if (word & 0xFF) == _SRC_LITERAL or (word >> 8) & 0xFF == _SRC_LITERAL else 1
        elif kind == _SALU_1SRC:
            size = 2 if (word & 0xFF) == _SRC_LITERAL else 1
        elif kind == _SOPK:
            size = 2 if (word >> 23) & 0x1F == _SOPK_SETREG_IMM32 else 1
        else:
            size = 1
        if index + size > count:
            raise SplitError(f"instruction at .text offset {index * 4:#x} runs past the end of the section")
        out.append(text[index * 4:(index + size) * 4])
        index += size
    return out


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

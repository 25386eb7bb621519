"""The int8 K=32 split: one gfx942 `v_mfma_i32_{16x16x32,32x32x16}_i8` becomes two gfx90a K=16/K=8 MFMAs.

Operand layouts (AMD's matrix instruction calculator, github.com/ROCm/amd_matrix_instruction_calculator, for CDNA3
`v_mfma_i32_16x16x32_i8` / `v_mfma_i32_32x32x16_i8` and CDNA2 `v_mfma_i32_16x16x16i8` / `v_mfma_i32_32x32x8i8`; the
CDNA3 and CDNA2 ISA guides, "Matrix Arithmetic Instructions"): with g the lane's group (lane // 16 for 16x16,
lane // 32 for 32x32), byte j of a lane's A (and B) register holds k = 8g + j in the low dword and k = 8g + 4 + j in
the high dword of the K=32 (32x32: K=16) form, and k = 4g + j in the one dword of the K=16 (32x32: K=8) form. A and
B share the map and C/D have the same layout in both. So D = C + sum_k A[i,k] B[k,j] equals a half-K MFMA on the low
dwords with SrcC = C followed by one on the high dwords with SrcC = that result: each covers half of the k (the same
half for A and B), and int32 addition (wrapping; no clamp) is associative. tests/unit/kernels/test_split.py checks
this exactly on an emulator of both layouts.

The rule applies only where it is exact and needs no other register: the destination is a register tuple, SrcC is
that tuple or the constant 0, no operand modifier is present, and the destination does not overlap A or B (the
first MFMA would overwrite what the second reads).
"""

from __future__ import annotations

import re

K32_TO_HALF = {"v_mfma_i32_16x16x32_i8": "v_mfma_i32_16x16x16i8", "v_mfma_i32_32x32x16_i8": "v_mfma_i32_32x32x8i8"}
_TUPLE = r"([va])\[(\d+):(\d+)\]"
_FORM = re.compile(rf"^(\S+) {_TUPLE}, {_TUPLE}, {_TUPLE}, (?:(0)|{_TUPLE})$")


def split_int8_k32(text: str) -> tuple[tuple[str, str] | None, str | None]:
    """((first, second), None) for a K=32 int8 MFMA the rule splits exactly, else (None, why not)."""
    match = _FORM.match(text.strip())
    if not match or match.group(1) not in K32_TO_HALF:
        return None, f"not in the form the int8 K=32 split handles (D, A, B, SrcC and no modifier): {text!r}"
    name, dk, dlo, dhi, ak, alo, ahi, bk, blo, bhi, zero, ck, clo, chi = match.groups()
    destination = (dk, int(dlo), int(dhi))
    a, b = (ak, int(alo), int(ahi)), (bk, int(blo), int(bhi))
    if a[2] != a[1] + 1 or b[2] != b[1] + 1:
        return None, f"A and B must be two registers each: {text!r}"
    if zero is None and (ck, int(clo), int(chi)) != destination:
        return None, f"SrcC is neither the destination nor 0: {text!r}"
    for operand in (a, b):
        if operand[0] == destination[0] and operand[1] <= destination[2] and destination[1] <= operand[2]:
            return None, f"the destination overlaps A or B, which the first half would overwrite: {text!r}"
    half = K32_TO_HALF[name]
    d = f"{dk}[{dlo}:{dhi}]"
    first = f"{half} {d}, {ak}{alo}, {bk}{blo}, {'0' if zero is not None else d}"
    second = f"{half} {d}, {ak}{ahi}, {bk}{bhi}, {d}"
    return (first, second), None

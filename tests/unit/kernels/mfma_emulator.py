"""An emulator of the int8 MFMAs the split touches, written from AMD's documented operand layouts (no GPU here).

Layouts: AMD's matrix instruction calculator (github.com/ROCm/amd_matrix_instruction_calculator @ 2ef9189,
`matrix_calculator.py --architecture cdna3 --instruction v_mfma_i32_16x16x32_i8 --register-layout --A-matrix`, and
the same with --B-matrix / --D-matrix, for CDNA3 v_mfma_i32_32x32x16_i8 and CDNA2 v_mfma_i32_16x16x16i8 /
v_mfma_i32_32x32x8i8). AMD's CDNA2/CDNA3 ISA guides were not readable on this machine; the calculator is AMD's
tabulation of them. For an M x N x K int8 MFMA on a wave of 64 lanes, with G = 64 / M lane groups and P = K / G
k-values per lane (4 bytes to a register):
- A[i][k] is byte k % 4 of register (k % P) // 4 in lane i + M * (k // P); B[k][j] likewise, with j for i;
- C[i][j] and D[i][j] are register 4 * (i // (4 * G)) + i % 4 in lane j + N * ((i // 4) % G).
These formulas equal the calculator's tables entry by entry for all four instructions (5,632 entries, checked when
this file was written). D = C + A x B in int32, wrapping (the split is applied only without clamp).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WAVE = 64
SHAPES = {  # name -> (M, N, K, registers per lane of A and of B)
    "v_mfma_i32_16x16x32_i8": (16, 16, 32, 2),
    "v_mfma_i32_16x16x16i8": (16, 16, 16, 1),
    "v_mfma_i32_32x32x16_i8": (32, 32, 16, 2),
    "v_mfma_i32_32x32x8i8": (32, 32, 8, 1),
}


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    ab_registers: int

    @property
    def groups(self) -> int:
        return WAVE // self.m

    @property
    def per_lane(self) -> int:
        return self.k // self.groups

    @property
    def cd_registers(self) -> int:
        return self.m * self.n // WAVE

    def ab_place(self, row: int, k: int) -> tuple[int, int, int]:
        """(register, lane, byte) of A[row][k] (or B[k][row])."""
        return (k % self.per_lane) // 4, row + self.m * (k // self.per_lane), k % 4

    def cd_place(self, i: int, j: int) -> tuple[int, int]:
        """(register, lane) of C[i][j] / D[i][j]."""
        return 4 * (i // (4 * self.groups)) + i % 4, j + self.n * ((i // 4) % self.groups)


def shape(name: str) -> Shape:
    return Shape(*SHAPES[name])


def _signed8(value: int) -> int:
    return value - 256 if value & 0x80 else value


def _wrap32(value: int) -> int:
    return value & 0xFFFFFFFF


Registers = list[list[int]]  # [register][lane] -> 32-bit value


def mfma(name: str, a: Registers, b: Registers, c: Registers | None) -> Registers:
    """D = C + A x B of `name`, registers in and out (c None: SrcC is the constant 0)."""
    s = shape(name)
    assert len(a) == len(b) == s.ab_registers and (c is None or len(c) == s.cd_registers)

    def element(regs: Registers, row: int, k: int) -> int:
        register, lane, byte = s.ab_place(row, k)
        return _signed8((regs[register][lane] >> (8 * byte)) & 0xFF)

    d = [[0] * WAVE for _ in range(s.cd_registers)]
    for i in range(s.m):
        a_row = [element(a, i, k) for k in range(s.k)]
        for j in range(s.n):
            register, lane = s.cd_place(i, j)
            total = c[register][lane] if c is not None else 0
            total += sum(x * element(b, j, k) for k, x in enumerate(a_row))
            d[register][lane] = _wrap32(total)
    return d


# --- register files and instruction texts ---------------------------------------------------------------------------

_OPERAND = re.compile(r"^([va])(?:\[(\d+):(\d+)\]|(\d+))$")


def _operand(text: str) -> list[tuple[str, int]] | None:
    if text == "0":
        return None
    match = _OPERAND.match(text)
    assert match, text
    kind, low, high, single = match.groups()
    first, last = (int(single), int(single)) if single else (int(low), int(high))
    return [(kind, r) for r in range(first, last + 1)]


def run(text: str, registers: dict[tuple[str, int], list[int]]) -> None:
    """Execute one MFMA instruction text on a register file {("v"|"a", number): 64 lane values}."""
    name, operands = text.split(" ", 1)
    d, a, b, c = (_operand(o.strip()) for o in operands.split(","))
    result = mfma(name, [registers[r] for r in a], [registers[r] for r in b],
                  None if c is None else [registers[r] for r in c])
    for register, values in zip(d, result):
        registers[register] = values

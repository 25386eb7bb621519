"""What the MFMA wait-state audit reads from one instruction as LLVM prints it: its class, the wait states it counts,
the vector registers it reads and writes, its MFMA facts, whether it branches. Entry point: ``parse(text)``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

from cdna2.kernels.hazard_rules import mfma_facts

MFMA, VALU, MEMORY, SCALAR = "mfma", "valu", "memory", "scalar"
BRANCH, CBRANCH, END = "branch", "cbranch", "end"

_REGISTER = re.compile(r"(?<![\w.])([va])(?:(\d+)|\[(\d+):(\d+)\])(?![\w\[])")
_DS_RETURNS = re.compile(r"read|rtn|permute|swizzle|append|consume")
_MEMORY_PREFIXES = ("buffer_", "tbuffer_", "global_", "flat_", "scratch_", "ds_", "image_")
_RETURN_MODIFIER = re.compile(r"\s(glc|sc0)(\s|$)")  # an atomic returns the old value (gfx90a glc, gfx942 sc0)


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

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

The audit's parts, each a module: ``hazard_rules`` (rule names, pass counts, the wait states each rule needs,
verdicts, policies), ``hazard_instructions`` (what one instruction text reads, writes and counts),
``hazard_paths`` (the walk over every path of one kernel) and ``hazard_report`` (KernelAudit, ShortEdge: the
verdict and the short edges). This module is their entry: a listing or a batch of code objects in, audits out.

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

from itertools import accumulate
from pathlib import Path
from typing import Iterable

from cdna2.host import elf
from cdna2.kernels import isa
from cdna2.kernels.hazard_paths import audit_paths
from cdna2.kernels.hazard_report import KernelAudit
from cdna2.kernels.hazard_rules import TARGETS
from cdna2.kernels.llvm import parse_objdump_line


def audit_listing(listing: Iterable[tuple[int, int, str]], target: str = "gfx90a") -> KernelAudit:
    """Audit one kernel's instructions, (address, size, text) in address order, under `target`'s MFMA rules."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: the audit knows {', '.join(TARGETS)}")
    listing = list(listing)
    return audit_paths([address for address, _, _ in listing], [text for _, _, text in listing], target)


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
        audit = audit_paths(addresses, list(map(texts.__getitem__, chunks)), target)
        results.append((relpath, audit.to_json(), audit.shortfalls(code_object.text_address)))
    return results

"""What the MFMA wait-state audit reports for one kernel: its short edges, its verdict, the edge the verdict rests on,
the wait states missing before each consumer (what padding needs) and the JSON the engine's report holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdna2.kernels.hazard_rules import (AUDIT_VERSION, CLEAN, PATH_NAMES, SHORT_BRANCHES, SHORT_STRAIGHT, STRAIGHT,
                                        UNAUDITED)

MAX_EDGES_LISTED = 20


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

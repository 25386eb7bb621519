"""The translate and classify reports: one entry per kernel (why it is blocked, its audit, how it was written or why
not), the family table, the counts, the MFMA wait-state summary and the limitations measured on the tree.
Entry points: ``kernel_entry`` per kernel as the stages finish, then ``translation`` or ``classification`` for
the whole report.
"""

from __future__ import annotations

from collections import Counter
from itertools import zip_longest
from pathlib import Path

from cdna2.kernels import edits, hazard_rules, llvm
from cdna2.kernels.analysis import Analysis
from cdna2.kernels.policy import Policy
from cdna2.kernels.tree_cache import TRANSLATOR_VERSION

REPORT_FORMAT = 1
MAX_BLOCKERS_LISTED = 20
LIMITATIONS = (
    "MFMA wait states are audited statically (no GPU) against LLVM's gfx90a rules; translation keeps gfx942's "
    "spacing and gfx90a's MFMAs take twice the passes (a read of a 16x16x16 result needs 11 wait states, not 7; "
    "32x32x8: 19, not 11); kernel_hazard_policy decides which kernels are installed (default: none short in "
    "straight-line code, those short only across branches listed). With pad_mfma_hazards (the default) each short "
    "edge first gets the missing s_nop before its consumer and the kernel is re-assembled, so what is installed is "
    "clean under LLVM's rules. Wait states the hardware may add on its own "
    "are not credited, as in LLVM: a taken branch, s_waitcnt and s_barrier count one wait state each though they "
    "may stall longer, so a short edge is a risk, not a proven fault (the report says which straight-line ones "
    "pass an s_waitcnt or s_barrier), and padding may add more than the hardware needs, never less than LLVM's rules.",
    "Every newly enabled kernel family needs numerical validation on a real MI210 (done by the smoke checks for "
    "fmha_v3_fwd and pa_fwd_asm only).",
)


def _family(relpath: str) -> str:
    head, sep, _ = relpath.partition("/")
    return head if sep else "(top-level)"


def kernel_entry(analysis: Analysis, relpath: str) -> dict:
    """One kernel's entry from the analysis: unreadable or skipped (why), blocked (by what, listed), or portable
    (its audit); translate then adds how it was written or why not."""
    kind, payload = analysis.files[relpath]
    entry: dict = {"family": _family(relpath)}
    if kind != "ok":
        entry.update(status=kind, reason=payload)
        return entry
    counts, first = analysis.blockers_by_bucket(relpath, MAX_BLOCKERS_LISTED)
    if not counts:
        entry.update(status="portable", hazards=analysis.audits[relpath])
        return entry
    # Round-robin over the buckets, so every reason a kernel is blocked shows among the listed examples.
    examples = [gid for rank in zip_longest(*first.values()) for gid in rank if gid is not None]
    listed = []
    for gid in examples[:MAX_BLOCKERS_LISTED]:
        text = analysis.texts[gid]
        listed.append({"instruction": text if text is not None else analysis.chunks[gid].hex(),
                       "bucket": analysis.buckets[gid], "reason": analysis.reasons[gid]})
    entry.update(status="blocked", blocking_instructions=sum(counts.values()), blockers=listed,
                 buckets=dict(sorted(counts.items())))
    if analysis.split_unlocks(relpath):
        entry["unlocked_by"] = "int8_k32_split"
    return entry


def _family_table(kernels: dict[str, dict]) -> dict[str, dict]:
    families: dict[str, dict] = {}
    for relpath, entry in sorted(kernels.items()):
        row = families.setdefault(entry["family"], {"total": 0, "portable": 0, "blocked": 0, "withheld": 0,
                                                    "errors": 0, "skipped": 0, "blocked_by": {}})
        row["total"] += 1
        status = entry["status"]
        if status in ("portable", "written"):
            row["portable"] += 1
        elif status == "withheld":
            row["withheld"] += 1
        elif status in ("blocked", "refused"):
            row["blocked"] += 1
            for bucket in entry.get("buckets", {}):
                row["blocked_by"][bucket] = row["blocked_by"].get(bucket, 0) + 1
        elif status == "skipped":
            row["skipped"] += 1
        else:
            row["errors"] += 1
    return dict(sorted(families.items()))


def _counts(kernels: dict[str, dict]) -> dict[str, int]:
    counts = Counter(entry["status"] for entry in kernels.values())
    return {"code_objects": len(kernels), **dict(sorted(counts.items()))}


def _hazard_summary(kernels: dict[str, dict], policy: str | None) -> dict:
    """The audit's verdicts over the portable kernels, and what the policy did with them (classify: no policy)."""
    audited = {relpath: entry["hazards"] for relpath, entry in kernels.items() if "hazards" in entry}
    verdicts = Counter(audit["verdict"] for audit in audited.values())
    return {
        "target": "gfx90a", "audit_version": hazard_rules.AUDIT_VERSION, "policy": policy,
        "verdicts": {verdict: verdicts.get(verdict, 0) for verdict in hazard_rules.VERDICTS},
        "short_kernels": {verdict: sorted(r for r, a in audited.items() if a["verdict"] == verdict)
                          for verdict in hazard_rules.VERDICTS if verdict != hazard_rules.CLEAN},
        "withheld": sorted(relpath for relpath, entry in kernels.items() if entry["status"] == "withheld"),
    }


def withheld_reason(audit: dict, policy: str) -> str:
    """Why the hazard policy does not install a kernel with this audit."""
    if audit["verdict"] == hazard_rules.UNAUDITED:
        found = f"{len(audit['unparsed'])} unparsed lines, {len(audit['unresolved_branches'])} unresolved branches"
    else:
        worst = audit["worst"]
        found = (f"{worst['present']} of {worst['needed']} wait states from {worst['producer_address']} "
                 f"{worst['producer']!r} to {worst['consumer_address']} {worst['consumer']!r} ({worst['path']}, "
                 f"{worst['rule']})")
    return f"MFMA wait states: {audit['verdict']}: {found}; kernel_hazard_policy {policy} does not install it"


def _limitations(policy: str | None, kernels: dict[str, dict]) -> list[str]:
    """LIMITATIONS, what the audit measured on this tree (before any padding), and, under the permissive policy, what
    that installed."""
    audits = [entry.get("hazards_before_edits", entry["hazards"]) for entry in kernels.values() if "hazards" in entry]
    by_verdict = {verdict: [audit for audit in audits if audit["verdict"] == verdict]
                  for verdict in hazard_rules.VERDICTS}

    def most(verdict: str) -> int:
        return max((audit["worst"]["needed"] - audit["worst"]["present"] for audit in by_verdict[verdict]), default=0)

    straight = by_verdict[hazard_rules.SHORT_STRAIGHT]
    edges = sum(audit["short_edges"]["straight-line"] for audit in straight)
    waits = sum(audit["straight_line_passing_wait"] for audit in straight)
    texts = [*LIMITATIONS, (
        f"Measured on this tree: of {len(audits)} portable kernels, {len(straight)} are short of gfx90a's MFMA "
        f"wait states in straight-line code (by up to {most(hazard_rules.SHORT_STRAIGHT)}; {waits} of their {edges} "
        f"short straight-line edges pass an s_waitcnt or s_barrier), "
        f"{len(by_verdict[hazard_rules.SHORT_BRANCHES])} only on paths across a branch (by up to "
        f"{most(hazard_rules.SHORT_BRANCHES)}), {len(by_verdict[hazard_rules.UNAUDITED])} could not be audited, "
        f"{len(by_verdict[hazard_rules.CLEAN])} are clean.")]
    if any(entry.get("split_mfmas") for entry in kernels.values()):
        texts.append("int8_k32_split: each split MFMA runs two gfx90a MFMAs (4x the gfx942 cycles); the split is "
                     "exact on an emulator of AMD's operand layouts, not yet measured on an MI210")
    if policy == "permissive":
        texts.append(f"kernel_hazard_policy permissive: every portable kernel is installed, "
                     f"{len(by_verdict[hazard_rules.SHORT_STRAIGHT])} of them short of gfx90a's MFMA wait states in "
                     "straight-line code")
    return texts


def moved_entry(moved: edits.Moved, audit_before: dict | None) -> dict:
    """A re-assembled kernel's outcome, with the audit of the original (`audit_before`) beside the new one."""
    if moved.outcome != "written":
        return {"status": moved.outcome, "reason": moved.reason}
    code = " and ".join(kind for kind, count in (("split", moved.split_mfmas), ("padded", moved.nops)) if count)
    entry = {"status": "written", "code": code or "re-assembled", "split_mfmas": moved.split_mfmas,
             "nops": moved.nops, "nops_in_loops": moved.nops_in_loops,
             "wait_states_in_loops": moved.wait_states_in_loops, "text_growth_bytes": moved.text_growth,
             "hazards": moved.audit}
    if audit_before is not None:
        entry["hazards_before_edits"] = audit_before
    return entry


def _llvm(tools: llvm.LlvmTools) -> dict[str, str]:
    return {"bin_dir": str(tools.bin_dir), "version": tools.version, "banner": tools.banner}


def classification(tools: llvm.LlvmTools, src: Path, distinct_instructions: int, kernels: dict[str, dict]) -> dict:
    """The classify report (but its durations), each portable or unlocked kernel marked with what translate would
    do with it under the default policy (refusals show only there)."""
    for entry in kernels.values():
        if entry["status"] == "portable":
            short = entry["hazards"]["verdict"] in (hazard_rules.SHORT_STRAIGHT, hazard_rules.SHORT_BRANCHES)
            entry["translation"] = "padded" if short else "in place"
        elif entry.get("unlocked_by") == "int8_k32_split":
            entry["translation"] = "split, with int8_k32_split"
    return {
        "format": REPORT_FORMAT, "command": "classify", "translator_version": TRANSLATOR_VERSION,
        "llvm": _llvm(tools), "source": str(src), "distinct_instructions": distinct_instructions,
        "counts": _counts(kernels), "families": _family_table(kernels), "kernels": kernels,
        "hazards": _hazard_summary(kernels, None), "limitations": _limitations(None, kernels),
    }


def translation(tools: llvm.LlvmTools, base: dict, output_digest: str, distinct_instructions: int,
                kernels: dict[str, dict], manifests: dict[str, dict], carried: list[str], policy: Policy,
                split: dict, moved: list[str]) -> dict:
    """The translate report (but its durations): `base` says where from, where to and the cache; `moved`, the
    kernels re-assembled."""
    return {
        "format": REPORT_FORMAT, "command": "translate", "translator_version": TRANSLATOR_VERSION,
        "llvm": _llvm(tools), **base, "output_digest": output_digest, "distinct_instructions": distinct_instructions,
        "counts": _counts(kernels), "families": _family_table(kernels), "kernels": kernels,
        "manifests": manifests,
        "manifest_rows": {"kept": sum(m["kept"] for m in manifests.values()),
                          "dropped": sum(m["dropped"] for m in manifests.values())},
        "carried_files": carried, "hazards": _hazard_summary(kernels, policy.hazards),
        "limitations": _limitations(policy.hazards, kernels), "int8_k32_split": split,
        "padding": {"enabled": policy.pad_mfma_hazards, "kernels": sum(1 for r in moved if kernels[r].get("nops")),
                    "nops": sum(kernels[r].get("nops", 0) for r in moved)},
    }

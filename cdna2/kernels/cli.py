"""``python -m cdna2 translate`` and ``python -m cdna2 classify``: the engine on the command line.

Exit codes: 0 done, every kernel accounted for; 1 unusable input or tools (nothing written); 2 the tree was built,
but some kernels are errors (unreadable source object or failed proof) and were left out: see the report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

from cdna2.families import family_rows, reach_table
from cdna2.host.state import write_file_atomically
from cdna2.kernels.engine import TranslationError, classify_tree, translate_tree
from cdna2.kernels.hazard_rules import DEFAULT_POLICY, POLICIES
from cdna2.kernels.isa import BUCKET_NAMES
from cdna2.kernels.llvm import LlvmNotFoundError, LlvmOutputError
from cdna2.kernels.policy import Policy


def register(subparsers: argparse._SubParsersAction) -> None:
    translate = subparsers.add_parser("translate", help="translate an hsa/gfx942 kernel tree into hsa/gfx90a",
                                      description=translate_tree.__doc__)
    translate.add_argument("src", type=Path, metavar="SRC", help="the hsa/gfx942 tree")
    translate.add_argument("dst", type=Path, metavar="DST", help="the hsa/gfx90a tree to produce (replaced whole)")
    translate.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    translate.add_argument("--report", type=Path, metavar="FILE.json", help="write the JSON report here")
    translate.add_argument("--cache", type=Path, metavar="DIR", help="content-addressed cache of translated trees")
    translate.add_argument("--hazard-policy", choices=sorted(POLICIES), default=DEFAULT_POLICY,
                           help="which kernels to install by their MFMA wait-state verdict (default: %(default)s, "
                                "all but those short in straight-line code; strict: clean only; permissive: all)")
    translate.add_argument("--no-mfma-padding", action="store_true",
                           help="do not pad short MFMA edges with s_nop (the hazard policy then judges them as found)")
    translate.add_argument("--int8-k32-split", action="store_true",
                           help="also write the kernels whose only blocker is an int8 K=32 MFMA, each split in two")
    translate.set_defaults(func=run_translate)

    classify = subparsers.add_parser("classify", help="why each gfx942 kernel is or is not portable to gfx90a",
                                     description=classify_tree.__doc__)
    classify.add_argument("src", type=Path, metavar="SRC", help="the hsa/gfx942 tree")
    classify.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    classify.add_argument("--json", type=Path, metavar="FILE", help="write the JSON report here")
    classify.set_defaults(func=run_classify)


def _progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr)


def family_table(report: dict) -> str:
    """The per-family table: total, portable, blocked (and by what), errors."""
    header = f"{'family':<16} {'total':>6} {'portable':>9} {'blocked':>8} {'withheld':>9} {'errors':>7}  blocked by"
    lines = [header, "-" * len(header)]
    for family, row in report["families"].items():
        blocked_by = ", ".join(f"{bucket} {row['blocked_by'][bucket]}" for bucket in BUCKET_NAMES
                               if bucket in row["blocked_by"])
        lines.append(f"{family:<16} {row['total']:>6} {row['portable']:>9} {row['blocked']:>8} {row['withheld']:>9} "
                     f"{row['errors'] + row['skipped']:>7}  {blocked_by}")
    totals = [sum(row[key] for row in report["families"].values())
              for key in ("total", "portable", "blocked", "withheld")]
    errors = sum(row["errors"] + row["skipped"] for row in report["families"].values())
    lines.append(f"{'total':<16} {totals[0]:>6} {totals[1]:>9} {totals[2]:>8} {totals[3]:>9} {errors:>7}")
    return "\n".join(lines)


def hazard_lines(report: dict) -> list[str]:
    """The MFMA wait-state verdicts, the kernels short in straight-line code with their worst edge, the policy."""
    summary = report["hazards"]
    counts = ", ".join(f"{verdict} {count}" for verdict, count in summary["verdicts"].items())
    policy = f", kernel_hazard_policy {summary['policy']}" if summary["policy"] else ""
    lines = [f"MFMA wait states ({summary['target']} rules, audit {summary['audit_version']}{policy}): {counts}"]
    for relpath in summary["short_kernels"]["short-straight-line"] + summary["short_kernels"]["unaudited"]:
        audit = report["kernels"][relpath]["hazards"]
        worst = audit["worst"]
        edge = (f"{worst['present']}/{worst['needed']} wait states {worst['producer_address']} -> "
                f"{worst['consumer_address']} ({worst['consumer'].split()[0]}"
                f"{', passes s_waitcnt/s_barrier' if worst['passes_wait'] else ''})" if worst else "audit incomplete")
        withheld = " (withheld)" if relpath in summary["withheld"] else ""
        lines.append(f"  {audit['verdict']} {relpath}{withheld}: {edge}")
    across = summary["short_kernels"]["short-across-branches"]
    if across:
        families = Counter(report["kernels"][relpath]["family"] for relpath in across)
        installed = sum(1 for relpath in across if report["kernels"][relpath]["status"] == "written")
        lines.append(f"  short-across-branches: {', '.join(f'{f} {n}' for f, n in sorted(families.items()))}"
                     + (f" ({installed} installed; names in the JSON report)" if summary["policy"] else ""))
    return lines


def _errors(report: dict) -> list[str]:
    return [f"{relpath}: {entry['status']}: {entry['reason']}" for relpath, entry in report["kernels"].items()
            if entry["status"] in ("error", "skipped")]


def code_summary(report: dict) -> list[str]:
    """How the written kernels were made (in place, split, padded), what was refused and why, what the split would
    add when it is off."""
    kernels = report["kernels"].values()
    written = [entry for entry in kernels if entry["status"] == "written"]
    made = {code: [e for e in written if e.get("code") == code] for code in sorted({e.get("code") for e in written})}
    parts = []
    for code, entries in made.items():
        detail = []
        if any(e.get("split_mfmas") for e in entries):
            detail.append(f"{sum(e['split_mfmas'] for e in entries)} MFMAs split")
        if any(e.get("nops") for e in entries):
            detail.append(f"{sum(e['nops'] for e in entries)} s_nop added, "
                          f"{sum(e['nops_in_loops'] for e in entries)} inside loops")
        parts.append(f"{len(entries)} {code}" + (f" ({'; '.join(detail)})" if detail else ""))
    lines = [f"written: {', '.join(parts) or 'none'}"]
    lines += [f"refused  {relpath}: {entry['reason']}" for relpath, entry in report["kernels"].items()
              if entry["status"] == "refused"]
    split = report["int8_k32_split"]
    if not split["enabled"] and split["kernels_unlocked"]:
        rows = split["manifest_rows_it_would_add"]
        lines.append(f"int8_k32_split is off: it would add {split['kernels_unlocked']} kernels and "
                     f"{sum(rows.values())} manifest rows ({', '.join(f'{m} +{n}' for m, n in sorted(rows.items()))})")
    return lines


def classify_summary(report: dict) -> list[str]:
    """What translate would do with the kernels, under the default policy."""
    plans = Counter(entry["translation"] for entry in report["kernels"].values() if "translation" in entry)
    return [f"translate would write: {', '.join(f'{count} {plan}' for plan, count in sorted(plans.items()))}"]


# What each command's kernels are for the reachability table: those written, or those translate would write.
INSTALLED = {"translate": ("written",), "classify": ("in place", "padded")}


def installed_kernels(report: dict) -> list[str]:
    """The code objects the tree holds (translate) or would hold under the default policy (classify)."""
    key = "status" if report["command"] == "translate" else "translation"
    return [relpath for relpath, entry in report["kernels"].items() if entry.get(key) in INSTALLED[report["command"]]]


def _summary(report: dict) -> str:
    lines = [family_table(report), "",
             "families installed, by the path that reaches them on a patched gfx90a host (dispatched: AITER's own "
             "entry; direct: only a direct call of the op; none: nothing loads them) and the GPU check proving them:",
             *reach_table(report["reachability"]), "", *hazard_lines(report)]
    lines += code_summary(report) if report["command"] == "translate" else classify_summary(report)
    lines += [f"error  {line}" for line in _errors(report)]
    if "manifest_rows" in report:
        lines.append(f"manifests: {report['manifest_rows']['kept']} rows kept, "
                     f"{report['manifest_rows']['dropped']} rows dropped (kernel not written)")
        lines.append(f"output: {report['destination']} (digest {report['output_digest'][:16]}, "
                     f"cache {report['cache']['status']})")
    durations = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in report["durations"].items())
    lines.append(f"LLVM {report['llvm']['version']} at {report['llvm']['bin_dir']}; {durations}")
    lines += [f"limitation: {text}" for text in report["limitations"]]
    return "\n".join(lines)


def _run(command: str, produce: Callable[[], dict], json_path: Path | None) -> int:
    """Exit 1 when the input is unusable (nothing written), 2 when some kernels are errors, else 0."""
    try:
        report = produce()
    except (TranslationError, LlvmNotFoundError, LlvmOutputError) as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 1
    if not report["kernels"]:  # a verdict over no kernel is no verdict
        print(f"{command}: {report.get('source')}: no code object found, so nothing was judged: SRC must be an "
              f"AITER hsa/gfx942 tree", file=sys.stderr)
        return 1
    report = {**report, "reachability": family_rows(installed_kernels(report))}
    if json_path:
        write_file_atomically(json_path, (json.dumps(report, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    print(_summary(report))
    return 2 if _errors(report) else 0


def run_translate(args: argparse.Namespace) -> int:
    policy = Policy(hazards=args.hazard_policy, pad_mfma_hazards=not args.no_mfma_padding,
                    int8_k32_split=args.int8_k32_split)
    return _run("translate", lambda: translate_tree(args.src, args.dst, jobs=args.jobs, cache_dir=args.cache,
                                                    progress=_progress, policy=policy), args.report)


def run_classify(args: argparse.Namespace) -> int:
    return _run("classify", lambda: classify_tree(args.src, jobs=args.jobs, progress=_progress), args.json)

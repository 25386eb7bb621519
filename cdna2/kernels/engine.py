"""Translate an AITER ``hsa/gfx942`` tree into an ``hsa/gfx90a`` tree, or only classify it.

Pipeline (whole tree at once, so LLVM sees each distinct instruction once):
1. scan (scan.py): every .co is parsed and its .text cut into instructions (worker processes); distinct byte
   strings are collected across the tree;
2. decode and 3. judge (judge.py, worker processes, in batches queued as the scan finds new instructions): LLVM
   decodes each distinct instruction for gfx942 (it must consume exactly the bytes given); each text gets its
   gfx90a spelling (isa.RENAMES, checked against gfx942 as an alias) and is assembled for gfx90a; an instruction
   passes when it assembles to an encoding of the original length; each int8 K=32 MFMA gets its two gfx90a halves
   (split.py), assembled, and decoded back by LLVM when the split is on;
4. audit: each kernel whose every instruction passes gets its MFMA wait states audited under gfx90a's rules
   (hazards.py, worker processes); the kernel hazard policy decides which of them are installed;
5. plan: a portable kernel with short MFMA edges (when pad_mfma_hazards) or with pads asked for, and a kernel whose
   only blockers are split MFMAs (when int8_k32_split), gets edits (edits.py); the others are patched in place;
6. write and prove in place (write_and_prove.py): each kernel to install is patched in place (old bytes checked
   first), retargeted to gfx90a, then disassembled by llvm-objdump for gfx90a and compared instruction by
   instruction with the expected listing; any difference removes the file and reports an error;
7. re-assemble and prove: each kernel with edits is rebuilt through assembly source (reassemble.py), retargeted,
   proven against the original plus exactly its edits (relocation_proof.py) and audited again; the hazard policy
   then judges its new verdict. Stages 6 and 7 share a worker task per audit batch (write_batch), so its kernels
   of both kinds are disassembled by one llvm-objdump call; once all are written, llvm-readelf (one call per
   worker) checks that every written kernel says gfx90a (check_targets);
8. manifests are pruned to the written kernels, other files carried over, the post-condition checked, and the
   staging tree moved into place (tree_cache.py, which also keeps finished trees by what they depend on).

Stages 1-4 are ``_analyse`` (shared with classify), 5-8 the rest of ``translate_tree``, which runs stages 4 to 7
pipelined on the worker pool (``_audit_write_and_move``): a kernel is planned, written and proven as soon as its
audit batch is back.

This module holds the order of the stages and what passes between them (an ``Analysis``, analysis.py, from the
analysis stages; routes and outcomes from the pipelined ones). How files are cut into worker tasks is batching.py,
the worker processes workers.py, the reports report.py, the policy policy.py.
"""

from __future__ import annotations

import os
import shutil
import time
from array import array
from collections import Counter, defaultdict
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from itertools import compress, count
from pathlib import Path
from typing import Callable

from cdna2.host import manifest
from cdna2.host.digests import regular_files, tree_digest
from cdna2.kernels import batching, edits, hazard_rules, hazards, judge, llvm, report, workers
from cdna2.kernels.analysis import Analysis
from cdna2.kernels.policy import Policy
from cdna2.kernels.scan import scan_batch
from cdna2.kernels.tree_cache import cache_key, from_cache, move_into_place, staging_for, store_in_cache
from cdna2.kernels.write_and_prove import check_targets, write_batch

Progress = Callable[[str], None]


class TranslationError(RuntimeError):
    """The input cannot be translated (missing SRC, bad manifest, failed post-condition); the message says why."""


# --- stages 1-4: the analysis shared by translate and classify ------------------------------------------------------

def _analyse(src: Path, kernels: list[str], tools: llvm.LlvmTools, jobs: int, pool: ProcessPoolExecutor,
             progress: Progress, audit: bool = True, with_split: bool = False) -> Analysis:
    """Stages 1-4 (without `audit`, 1-3: translate runs the audit pipelined with the writing); `with_split` when
    split kernels are to be written (their halves are assembled, and decoded back for their proof). The judge's
    batches are queued as the scan finds new instructions, so they fill the scan's last moments."""
    analysis = Analysis()
    started = time.monotonic()
    progress(f"scanning {len(kernels)} code objects with {jobs} processes, judging their distinct instructions for "
             "gfx90a as they are found")
    gid_of: defaultdict[bytes, int] = defaultdict(count().__next__)  # as in scan_batch: the order is the gids'
    groups = batching.runs(src, kernels, jobs * 4)
    judged: list[Future] = []
    pending: list[bytes] = []  # found, not yet queued to be judged

    size = batching.JUDGE_BATCH

    def queue(at_least: int) -> None:
        while pending and len(pending) >= at_least:
            judged.append(pool.submit(judge.judge_batch, tools, pending[:size], with_split))
            del pending[:size]

    for table, results in pool.map(scan_batch, [str(src)] * len(groups), groups):
        known = len(gid_of)
        local = list(map(gid_of.__getitem__, table))
        for relpath, kind, payload in results:
            analysis.files[relpath] = (kind, array("I", map(local.__getitem__, payload)) if kind == "ok" else payload)
        pending += compress(table, map(known.__le__, local))  # the new ones, in the order of their gids
        queue(size)
    queue(1)
    analysis.chunks = list(gid_of)
    analysis.durations["scan"] = time.monotonic() - started

    started = time.monotonic()
    assembled: Counter[str] = Counter()
    for future in judged:  # merged in gid order, each as soon as it is back
        verdicts = future.result()
        analysis.add_verdicts(verdicts)
        assembled.update(texts=verdicts.assembled, halves=verdicts.halves_assembled, renamed=verdicts.renamed)
    analysis.durations["judge"] = time.monotonic() - started
    progress(f"judged {len(analysis.chunks)} distinct instructions in {len(judged)} batches: "
             f"{len(analysis.encodings)} pass on gfx90a, {len(analysis.blocking)} block; assembled "
             f"{assembled['texts']} distinct texts for gfx90a ({assembled['halves']} of them halves of int8 K=32 "
             f"MFMAs), {assembled['renamed']} renamed ones for gfx942")

    if audit:
        started = time.monotonic()
        _audit(analysis, src, jobs, pool, progress)
        analysis.durations["audit"] = time.monotonic() - started
    return analysis


def _audit(analysis: Analysis, src: Path, jobs: int, pool: ProcessPoolExecutor, progress: Progress) -> None:
    portable = analysis.portable()
    progress(f"auditing MFMA wait states of {len(portable)} portable kernels for gfx90a")
    groups = batching.balanced(src, portable, jobs * 2)
    for batch in pool.map(hazards.audit_batch, [str(src)] * len(groups), groups,
                          [analysis.gfx90a_texts_for(group) for group in groups], ["gfx90a"] * len(groups)):
        analysis.add_audits(batch)


def _list_tree(src: Path) -> tuple[list[str], list[str]]:
    """The tree's code objects and its other files, relative, in path order (walked as tree_digest walks it: a
    pathlib walk of the 1,300 files took 0.17 s). ``__pycache__`` is left out, as from the tree's digest (so from
    the cache key): bytecode that Python rebuilds, never carried into a translated tree."""
    kernels, others = [], []
    for relative, _ in regular_files(src, skip_dirs=("__pycache__",)):
        (kernels if os.path.splitext(relative)[1] == ".co" else others).append(relative)
    return sorted(kernels, key=_parts), sorted(others, key=_parts)


def _parts(relpath: str) -> list[str]:
    return relpath.split("/")


def _check_source(src: Path) -> None:
    if not src.is_dir():
        raise TranslationError(f"{src}: no such directory; SRC must be an AITER hsa/gfx942 tree "
                               "(e.g. <site-packages>/aiter_meta/hsa/gfx942)")


# --- classify -------------------------------------------------------------------------------------------------------

def classify_tree(src: Path, *, jobs: int | None = None, progress: Progress | None = None) -> dict:
    """Why each kernel of a gfx942 tree is or is not portable to gfx90a; writes nothing."""
    started = time.monotonic()
    progress = progress or (lambda message: None)
    _check_source(src)
    tools = llvm.find_llvm()
    kernel_paths, _ = _list_tree(src)
    jobs = jobs or os.cpu_count() or 1
    with workers.pool(jobs) as pool:
        analysis = _analyse(src, kernel_paths, tools, jobs, pool, progress)
    kernels = {relpath: report.kernel_entry(analysis, relpath) for relpath in kernel_paths}
    classification = report.classification(tools, src, len(analysis.chunks), kernels)
    classification["durations"] = {**{k: round(v, 3) for k, v in analysis.durations.items()},
                                   "total": round(time.monotonic() - started, 3)}
    return classification


# --- translate ------------------------------------------------------------------------------------------------------

def _write_manifests(src: Path, staging: Path, others: list[str], source_kernels: set[str],
                     written: set[str]) -> tuple[dict[str, dict], list[str]]:
    manifests, carried = {}, []
    for relpath in others:
        target = staging / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        if relpath.endswith(".csv"):
            try:
                pruned = manifest.prune(relpath, (src / relpath).read_text(encoding="utf-8"), source_kernels, written)
            except manifest.ManifestError as error:
                raise TranslationError(f"{src}: {error}") from error
            if pruned.column is not None:
                target.write_text(pruned.text, encoding="utf-8")
                manifests[relpath] = {"column": pruned.column, "kept": pruned.kept, "dropped": pruned.dropped}
                continue
        shutil.copyfile(src / relpath, target)
        os.chmod(target, (src / relpath).stat().st_mode & 0o777)
        carried.append(relpath)
    return manifests, carried


def _check_postcondition(staging: Path, manifests: dict[str, dict], dst: Path) -> None:
    dangling = {relpath: rows for relpath in manifests if (rows := manifest.dangling_rows(staging, relpath))}
    if dangling:
        detail = "; ".join(f"{path}: {len(rows)} rows, e.g. {rows[0]!r}" for path, rows in sorted(dangling.items()))
        raise TranslationError(f"post-condition failed for {dst}: manifest rows name missing kernels ({detail}); "
                               "nothing was installed. This is a translator bug: report it with the source tree")


def _route(relpath: str, audit: dict, policy: Policy, pads: dict[str, list[edits.Pad]]) -> str:
    """What becomes of a portable kernel once audited: re-assembled (`move`: padded, or pads asked for), patched
    `in place`, or `withheld` by the hazard policy."""
    if relpath in pads or (policy.pad_mfma_hazards and audit["verdict"] in (hazard_rules.SHORT_STRAIGHT,
                                                                           hazard_rules.SHORT_BRANCHES)):
        return "move"
    return "in place" if hazard_rules.installs(policy.hazards, audit["verdict"]) else "withheld"


def _kernels_the_split_unlocks(analysis: Analysis) -> list[str]:
    """The kernels whose every blocker the int8 K=32 split handles."""
    return sorted(relpath for relpath, (kind, _) in analysis.files.items()
                  if kind == "ok" and analysis.split_unlocks(relpath))


def _audit_write_and_move(src: Path, staging: Path, analysis: Analysis, unlocked: list[str], policy: Policy,
                          pads: dict[str, list[edits.Pad]], tools: llvm.LlvmTools, jobs: int,
                          pool: ProcessPoolExecutor, progress: Progress, meanwhile: Callable[[], dict]
                          ) -> tuple[dict[str, str], dict[str, tuple[int, str | None]], dict[str, edits.Moved], dict]:
    """Stages 4, 6 and 7 pipelined on the pool. The audits are queued first, then the kernels the split unlocks
    (`unlocked`: re-assembled without an audit of the original); each audit batch, once back, queues one
    write_batch for its kernels to patch in place and to re-assemble, so no worker waits for the last audit.
    `meanwhile` is the parent's own work, done once the workers have their first tasks (it would otherwise run after
    the pool, with one core idle). Returns each portable kernel's route (_route), the in-place outcomes, the
    re-assembled kernels and what `meanwhile` returned."""
    started = time.monotonic()
    portable = analysis.portable()
    progress(f"auditing MFMA wait states of {len(portable)} portable kernels for gfx90a and writing and proving them "
             f"as their audits come back; re-assembling and proving {len(unlocked)} kernels the split unlocks")
    audits = [pool.submit(hazards.audit_batch, str(src), group, analysis.gfx90a_texts_for(group), "gfx90a")
              for group in batching.balanced(src, portable, jobs * 4)]

    def write(in_place: list[str], to_move: list[str]) -> Future:
        moves = edits.MoveBatch(to_move, *analysis.moves_for(to_move), {r: pads[r] for r in to_move if r in pads},
                                policy.pad_mfma_hazards,
                                {r: analysis.shortfalls[r] for r in to_move if r in analysis.shortfalls}
                                ) if to_move else None
        return pool.submit(write_batch, tools, str(src), str(staging), in_place, analysis.expected_for(in_place),
                           moves)

    writes = [write([], group) for group in batching.balanced(src, unlocked, jobs * 4)]
    done_meanwhile = meanwhile()
    routes = {}
    for done, future in enumerate(as_completed(audits), 1):
        batch = future.result()
        analysis.add_audits(batch)
        routed = {relpath: _route(relpath, audit, policy, pads) for relpath, audit, _ in batch}
        routes.update(routed)
        in_place = sorted(relpath for relpath, route in routed.items() if route == "in place")
        to_move = sorted(relpath for relpath, route in routed.items() if route == "move")
        if done < len(audits):
            writes += [write(in_place, to_move)] if in_place or to_move else []
        else:
            # The last audit's kernels to re-assemble are the pool's last tasks: one per task, largest first (each
            # about 0.1 s, against 0.4 s for a batch), so that the workers end together.
            writes += [write(in_place, [])] if in_place else []
            writes += [write([], single) for single in batching.balanced(src, to_move, len(to_move))]
    analysis.durations["audit"] = time.monotonic() - started
    results = [future.result() for future in writes]
    outcomes = {relpath: (patched, error) for in_place, _ in results for relpath, patched, error in in_place}
    moved = {result.relpath: result for _, batch in results for result in batch}
    check_targets(tools, staging, outcomes, moved, pool, jobs)
    return routes, outcomes, moved, done_meanwhile


def _rows_gained(src: Path, others: list[str], source_kernels: set[str], written: set[str],
                 more: set[str]) -> dict[str, int]:
    """Per manifest, the rows that writing `more` kernels too would keep."""
    gained = {}
    for relpath in others:
        if relpath.endswith(".csv"):
            text = (src / relpath).read_text(encoding="utf-8")
            extra = (manifest.prune(relpath, text, source_kernels, written | more).kept
                     - manifest.prune(relpath, text, source_kernels, written).kept)
            if extra:
                gained[relpath] = extra
    return gained


def translate_tree(src: Path, dst: Path, *, jobs: int | None = None, cache_dir: Path | None = None,
                   progress: Progress | None = None, policy: Policy = Policy(),
                   pads: dict[str, list[edits.Pad]] | None = None) -> dict:
    """Build the gfx90a tree DST from the gfx942 tree SRC atomically; returns the JSON-able report.

    `policy` says which kernels are installed from their MFMA wait-state verdicts (cdna2.kernels.hazard_rules.POLICIES),
    whether short MFMA edges are padded and whether int8 K=32 kernels are split; `pads` asks, per kernel, for more
    wait states before given consumers. Kernels with edits are re-assembled instead of patched in place."""
    started = time.monotonic()
    progress = progress or (lambda message: None)
    src, dst = Path(src), Path(dst)
    if policy.hazards not in hazard_rules.POLICIES:
        raise TranslationError(f"unknown kernel hazard policy {policy.hazards!r}: use one of "
                               f"{', '.join(hazard_rules.POLICIES)}")
    _check_source(src)
    jobs = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(1) as hashing:  # reading and hashing release the GIL while LLVM's probes run
        digest = hashing.submit(tree_digest, src)
        tools = llvm.find_llvm()
        src_digest = digest.result()
    pads = pads or {}
    key = cache_key(src_digest, tools, policy, pads)
    base = {"source": str(src), "destination": str(dst), "source_digest": src_digest,
            "cache": {"dir": str(cache_dir) if cache_dir else None, "key": key,
                      "status": "miss" if cache_dir else "disabled"}}
    if cache_dir is not None:
        cached = from_cache(Path(cache_dir) / key, dst, base, progress)
        if cached is not None:
            cached["durations"] = {"total": round(time.monotonic() - started, 3)}
            progress(f"cache hit {key[:12]}: {dst} installed from {cache_dir}")
            return cached

    kernel_paths, others = _list_tree(src)
    staging = staging_for(dst)
    try:
        with workers.pool(jobs) as pool:
            analysis = _analyse(src, kernel_paths, tools, jobs, pool, progress, audit=False,
                                with_split=policy.int8_k32_split)
            staging.mkdir()
            unlocked = _kernels_the_split_unlocks(analysis) if policy.int8_k32_split else []
            audit_started = time.monotonic()
            routes, outcomes, moved, not_portable = _audit_write_and_move(
                src, staging, analysis, unlocked, policy, pads, tools, jobs, pool, progress,
                lambda: {r: report.kernel_entry(analysis, r) for r in kernel_paths if not analysis.is_portable(r)})
            # From the last audit's return: the writing and proving that had not finished by then.
            analysis.durations["write_and_prove"] = time.monotonic() - audit_started - analysis.durations["audit"]
        kernels = {relpath: not_portable.get(relpath) or report.kernel_entry(analysis, relpath)
                   for relpath in kernel_paths}
        for relpath, route in routes.items():
            if route == "withheld":
                entry = kernels[relpath]
                entry.update(status="withheld", reason=report.withheld_reason(entry["hazards"], policy.hazards))
        for relpath, (patched, error) in outcomes.items():
            if error:
                kernels[relpath].update(status="error", reason=f"proof failed: {error}")
            else:
                kernels[relpath].update(status="written", code="in place", patched_instructions=patched)
        for relpath, outcome in moved.items():
            kernels[relpath].update(report.moved_entry(outcome, kernels[relpath].get("hazards")))
            if outcome.outcome == "written" and not hazard_rules.installs(policy.hazards, outcome.audit["verdict"]):
                (staging / relpath).unlink()
                kernels[relpath].update(status="withheld", reason=report.withheld_reason(outcome.audit, policy.hazards))

        manifests_started = time.monotonic()
        written = {relpath for relpath, entry in kernels.items() if entry["status"] == "written"}
        manifests, carried = _write_manifests(src, staging, others, set(kernel_paths), written)
        _check_postcondition(staging, manifests, dst)
        if not policy.int8_k32_split:  # what it would unlock, found now: the blockers were listed meanwhile
            unlocked = _kernels_the_split_unlocks(analysis)
        split_report = {"enabled": policy.int8_k32_split, "kernels_unlocked": len(unlocked),
                        "written": len(set(unlocked) & written)}
        if not policy.int8_k32_split:
            split_report["manifest_rows_it_would_add"] = _rows_gained(src, others, set(kernel_paths), written,
                                                                      set(unlocked))
        analysis.durations["manifests"] = time.monotonic() - manifests_started

        translation = report.translation(tools, base, tree_digest(staging), len(analysis.chunks), kernels, manifests,
                                         carried, policy, split_report, list(moved))
        if cache_dir is not None:
            store_in_cache(Path(cache_dir) / key, staging, translation)
        move_into_place(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    translation["durations"] = {**{k: round(v, 3) for k, v in analysis.durations.items()},
                                "total": round(time.monotonic() - started, 3)}
    progress(f"{dst}: {len(written)} kernels written, {translation['manifest_rows']['kept']} manifest rows kept")
    return translation

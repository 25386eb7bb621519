"""Translate an AITER ``hsa/gfx942`` tree into an ``hsa/gfx90a`` tree, or only classify it.

Pipeline (whole tree at once, so LLVM sees each distinct instruction once):
1. scan: every .co is parsed and its .text cut into instructions (worker processes); distinct byte strings are
   collected across the tree;
2. decode and 3. judge (judge.py, worker processes, in batches queued as the scan finds new instructions): LLVM
   decodes each distinct instruction for gfx942 (it must consume exactly the bytes given); each text gets its
   gfx90a spelling (isa.RENAMES, checked against gfx942 as an alias) and is assembled for gfx90a; an instruction
   passes when it assembles to an encoding of the original length; each int8 K=32 MFMA gets its two gfx90a halves
   (split.py), assembled, and decoded back by LLVM when the split is on;
4. audit: each kernel whose every instruction passes gets its MFMA wait states audited under gfx90a's rules
   (cdna2.kernels.hazards, worker processes); the kernel hazard policy decides which of them are installed;
5. plan: a portable kernel with short MFMA edges (when pad_mfma_hazards) or with pads asked for, and a kernel whose
   only blockers are split MFMAs (when int8_k32_split), gets edits (edits.py); the others are patched in place;
6. write and prove in place: each kernel to install is patched in place (old bytes checked first), retargeted to
   gfx90a, then disassembled by llvm-objdump for gfx90a and compared instruction by instruction with the expected
   listing; any difference removes the file and reports an error;
7. re-assemble and prove: each kernel with edits is rebuilt through assembly source (reassemble.py), retargeted,
   proven against the original plus exactly its edits (relocation_proof.py) and audited again; the hazard policy
   then judges its new verdict. Stages 6 and 7 share a worker task per audit batch (_write_batch), so its kernels
   of both kinds are disassembled by one llvm-objdump call; once all are written, llvm-readelf (one call per
   worker) checks that every written kernel says gfx90a (_check_targets);
8. manifests are pruned to the written kernels, other files carried over, the post-condition checked, and the
   staging tree moved into place.

Stages 1-4 are ``_analyse`` (shared with classify), 5-8 the rest of ``translate_tree``, which runs stages 4 to 7
pipelined on the worker pool (``_audit_write_and_move``): a kernel is planned, written and proven as soon as its
audit batch is back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
import gc
import os
import shutil
import sys
import time
from array import array
from bisect import bisect_left
from collections import Counter, defaultdict
from itertools import accumulate, compress, count, zip_longest
from operator import itemgetter, ne
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator

from cdna2.cache import code_digest
from cdna2.host.probe import regular_files, tree_digest
from cdna2.host import elf, manifest
from cdna2.kernels import (edits, hazard_instructions, hazard_paths, hazard_report, hazard_rules, hazards,
                          isa, judge, llvm, reassemble, relocation_proof, split)
from cdna2.kernels.relocation_proof import Expected

# Bump whenever the bytes written for the same input may change (rename table, patching, manifest rules).
TRANSLATOR_VERSION = "2"
REPORT_FORMAT = 1
MAX_BLOCKERS_LISTED = 20
BRANCH_PREFIXES = ("s_branch", "s_cbranch_", "s_call_b64")  # objdump prints their targets as labels
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

Progress = Callable[[str], None]


class TranslationError(RuntimeError):
    """The input cannot be translated (missing SRC, bad manifest, failed post-condition); the message says why."""


def _family(relpath: str) -> str:
    head, sep, _ = relpath.partition("/")
    return head if sep else "(top-level)"


# --- stage 1: scan (runs in worker processes) -----------------------------------------------------------------------

def _scan_batch(src_root: str, relpaths: list[str]) -> tuple[list[bytes], list[tuple[str, str, object]]]:
    """Per file: ("ok", array of indices into the batch's table of distinct instructions) or ("error"/"skipped",
    why)."""
    # A chunk met for the first time gets the next index from the dict's own factory: no Python-level loop runs per
    # chunk, and the dict's order is the table's.
    index_of: defaultdict[bytes, int] = defaultdict(count().__next__)
    results = []
    # A .text met before in the batch has the same instructions: one file in six of the 0.1.7 tree repeats another's
    # code (mostly beside it), and cutting and indexing them again cost about a third of the scan.
    indices_of_text: dict[bytes, array] = {}
    for relpath in relpaths:
        data = Path(src_root, relpath).read_bytes()
        try:
            code_object = elf.read_code_object(data)
            if code_object.mach != elf.MACH_GFX942:
                results.append((relpath, "skipped", f"ELF machine is {code_object.mach_name}, not gfx942"))
                continue
            text = elf.text_of(data, code_object)
            indices = indices_of_text.get(text)
            if indices is None:
                unique = set(isa.split_instructions(text))
                indices = indices_of_text[text] = array("I", map(index_of.__getitem__, unique))
        except (elf.ElfError, isa.SplitError) as error:
            results.append((relpath, "error", str(error)))
            continue
        results.append((relpath, "ok", indices))
    return list(index_of), results


# --- stage 4: write and prove (runs in worker processes) ------------------------------------------------------------

def _patch(data: bytearray, code_object: elf.CodeObject,
           expected: dict[bytes, tuple[bytes, str, str]]) -> tuple[int, list[str]]:
    """Re-encode in place; returns the number of patched instructions and the expected gfx90a objdump lines."""
    chunks = isa.split_instructions(elf.text_of(bytes(data), code_object))
    rows = list(map(expected.__getitem__, chunks))  # (gfx90a bytes, objdump line head, tail)
    starts = isa.offsets(chunks)
    changed = list(compress(range(len(chunks)), map(ne, map(itemgetter(0), rows), chunks)))
    for index in changed:  # C-level maps find them: most instructions keep their bytes
        new, chunk, offset = rows[index][0], chunks[index], code_object.text_offset + starts[index]
        if bytes(data[offset:offset + len(chunk)]) != chunk or len(new) != len(chunk):
            raise elf.ElfError(f"byte mismatch at file offset {offset:#x}: refusing to patch")
        data[offset:offset + len(chunk)] = new
    address = code_object.text_address
    return len(changed), [f"{head}{address + start:012X}{tail}" for (_, head, tail), start in zip(rows, starts)]


def _same_branch(expected: str, actual: str) -> bool:
    """objdump names a branch target by its label where llvm-mc prints the offset, or appends it as
    ``<symbol+offset>``: same address, same bytes and the same branch mnemonic are the same instruction."""
    want, got = llvm.parse_objdump_line(expected), llvm.parse_objdump_line(actual)
    name = isa.mnemonic(want[1])
    return ((want[0], want[2]) == (got[0], got[2].split(" <", 1)[0]) and name == isa.mnemonic(got[1])
            and name.startswith(BRANCH_PREFIXES))


def _prove(expected: list[str], actual: list[str]) -> str | None:
    if expected != actual:
        for want, got in zip(expected, actual):
            if want != got and llvm.normalised(want) != llvm.normalised(got) and not _same_branch(want, got):
                return f"expected {want.strip()!r}, gfx90a disassembly says {got.strip()!r}"
    if len(expected) != len(actual):
        return f"gfx90a disassembly has {len(actual)} instructions, the gfx942 listing {len(expected)}"
    return None


def _write_in_place(src_root: str, staging_root: str, relpaths: list[str],
                    expected: dict[bytes, tuple[bytes, str, str]]
                    ) -> tuple[list[tuple[str, int, str]], list[tuple[str, Path, int, list[str]]]]:
    """Patch and retarget each kernel into staging: (relpath, 0, why) of those refused, and (relpath, target,
    patched instructions, expected objdump lines) of those written, to be proven (_prove_in_place)."""
    refused, written = [], []
    for relpath in relpaths:
        source = Path(src_root, relpath)
        data = bytearray(source.read_bytes())
        code_object = elf.read_code_object(bytes(data))
        try:
            patched, listing = _patch(data, code_object, expected)
        except elf.ElfError as error:
            refused.append((relpath, 0, str(error)))
            continue
        elf.retarget_to_gfx90a(data, code_object)
        target = Path(staging_root, relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, source.stat().st_mode & 0o777)
        written.append((relpath, target, patched, listing))
    return refused, written


def _prove_in_place(written: list[tuple[str, Path, int, list[str]]], disassembly: dict[str, list[str]]
                    ) -> list[tuple[str, int, str | None]]:
    """(relpath, patched instructions, error or None) of each kernel patched in place; one that fails is removed."""
    results = []
    for relpath, target, patched, listing in written:
        error = _prove(listing, disassembly.get(str(target), []))
        if error:
            target.unlink()  # a file that failed its proof is never left in the tree
        results.append((relpath, patched, error))
    return results


def _write_batch(tools: llvm.LlvmTools, src_root: str, staging_root: str, in_place: list[str],
                 expected: dict[bytes, tuple[bytes, str, str]], moves: edits.MoveBatch | None
                 ) -> tuple[list[tuple[str, int, str | None]], list[edits.Moved]]:
    """Stages 6 and 7 for one batch: write the kernels patched in place and those re-assembled (`moves`) into
    staging, then prove their code from one llvm-objdump call (each call's start costs about 20-30 ms, as much as
    disassembling a kernel); that each says gfx90a is checked for the whole tree at once (_check_targets). Returns
    the in-place outcomes and the re-assembled kernels."""
    in_place_results, written = _write_in_place(src_root, staging_root, in_place, expected)
    failed, staged = edits.rebuild_batch(tools, src_root, staging_root, moves) if moves else ([], [])
    paths = [target for _, target, _, _ in written] + [kernel.target for kernel in staged]
    disassembly = llvm.objdump_lines(tools, paths, "gfx90a") if paths else {}
    return in_place_results + _prove_in_place(written, disassembly), failed + edits.prove_staged(staged, disassembly)


def _check_targets(tools: llvm.LlvmTools, staging: Path, outcomes: dict[str, tuple[int, str | None]],
                   moved: dict[str, edits.Moved], pool: ProcessPoolExecutor, jobs: int) -> None:
    """The last step of every kernel's proof, once all are written: its ELF header and metadata must say gfx90a.
    One llvm-readelf call per worker, side by side: a call per write task (17 on the 0.1.7 tree) cost 0.3-0.4 CPU-s
    of a cold run, nearly all in starting the tool, and a single call took 0.11 s with the other core idle. A kernel
    that does not say gfx90a becomes an error, and its file is removed from staging."""
    written = [relpath for relpath, (_, error) in outcomes.items() if error is None]
    written += [relpath for relpath, kernel in moved.items() if kernel.outcome == "written"]
    shares = [share for k in range(jobs) if (share := [staging / relpath for relpath in written[k::jobs]])]
    wrong_target: dict[str, str] = {}
    for errors in pool.map(llvm.target_errors, [tools] * len(shares), shares, ["gfx90a"] * len(shares)):
        wrong_target.update(errors)
    for relpath in written:
        why = wrong_target.get(str(staging / relpath))
        if why is None:
            continue
        (staging / relpath).unlink()
        if relpath in moved:
            moved[relpath] = edits.Moved(relpath, "error", f"proof failed: {why}")
        else:
            outcomes[relpath] = (outcomes[relpath][0], why)


# --- the analysis shared by translate and classify ------------------------------------------------------------------

class Analysis:
    """Per-kernel verdicts for one source tree."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, object]] = {}  # relpath -> ("ok", gid array) | ("error"/"skipped", why)
        self.chunks: list[bytes] = []  # gid -> distinct instruction bytes
        self.texts: list[str | None] = []  # gid -> gfx942 text (None: LLVM does not decode it)
        self.gfx90a_texts: list[str | None] = []  # gid -> its gfx90a spelling (isa.rename of the text)
        self.reasons: dict[int, str] = {}  # gid -> why it blocks
        self.blocking: set[int] = set()  # the keys of reasons
        self.buckets: dict[int, str] = {}  # gid -> bucket of a blocking instruction
        self.encodings: dict[int, bytes] = {}  # gid -> its gfx90a bytes, when it passes
        self._expected: dict[int, Expected] = {}  # gid of a passing instruction -> it, once a written kernel asks
        self.halves: dict[int, tuple[Expected, Expected]] = {}  # gid of an int8 K=32 MFMA -> its gfx90a split
        self.splittable: set[int] = set()  # gids of the int8 K=32 MFMAs whose split assembles for gfx90a
        self.audits: dict[str, dict] = {}  # relpath of a portable kernel -> its hazard audit (KernelAudit.to_json)
        self.shortfalls: dict[str, dict[int, int]] = {}  # relpath of a short kernel -> KernelAudit.shortfalls
        self.durations: dict[str, float] = {}
        self._blocking_ids: dict[str, set[int]] = {}
        self._blocker_keys: list[int] | None = None  # gid -> its key, see blockers_by_bucket
        self._blockers_by_text: list[int] = []
        self._bucket_names: list[str] = []

    def blocking_ids(self, relpath: str) -> set[int]:
        """The ids of the kernel's blocking instructions, once judged (asked for several times per kernel)."""
        if relpath not in self._blocking_ids:
            # intersection() walks the file's ids in C; a Python loop over ~2M ids costs a noticeable part of a run.
            self._blocking_ids[relpath] = self.blocking.intersection(self.files[relpath][1])
        return self._blocking_ids[relpath]

    def blockers_by_bucket(self, relpath: str, limit: int) -> tuple[dict[str, int], dict[str, list[int]]]:
        """The kernel's blocking ids per bucket: how many, and the first `limit` of each in the order of their texts,
        the buckets in the order of their first id. 1,100 kernels hold 460,000 blockers between them, so each
        blocker gets one integer key once, bucket first and text rank second: a kernel's keys sort as plain
        integers and its buckets are runs of them, with no Python code per blocker."""
        if self._blocker_keys is None:
            by_text = sorted(self.blocking, key=lambda g: self.texts[g] or "")
            bucket_index = {bucket: index for index, bucket in enumerate(sorted(set(self.buckets.values())))}
            self._blocker_keys = [0] * len(self.chunks)  # a list: indexed faster than a dict
            for rank, gid in enumerate(by_text):
                self._blocker_keys[gid] = bucket_index[self.buckets[gid]] * len(by_text) + rank
            self._blockers_by_text, self._bucket_names = by_text, list(bucket_index)
        keys = sorted(map(self._blocker_keys.__getitem__, self.blocking_ids(relpath)))
        stride, by_text, runs = len(self._blockers_by_text), self._blockers_by_text, []
        for index, bucket in enumerate(self._bucket_names):
            base = index * stride
            start, end = bisect_left(keys, base), bisect_left(keys, base + stride)
            if end > start:
                runs.append((keys[start] - base, bucket, end - start,
                             [by_text[key - base] for key in keys[start:min(end, start + limit)]]))
        runs.sort()  # by the text rank of each bucket's first blocker
        return ({bucket: size for _, bucket, size, _ in runs}, {bucket: first for _, bucket, _, first in runs})

    def _expected_of(self, gids: set[int]) -> dict[bytes, Expected]:
        """Each passing instruction among `gids`, as gfx90a must print and encode it. Each is made, and its objdump
        line formatted (it is cached in the object and travels with it to the workers), when first asked for: two
        thirds of the passing instructions belong to no kernel that is written."""
        known, encodings = self._expected, self.encodings
        for gid in gids.difference(known).intersection(encodings):
            expected = known[gid] = Expected(self.gfx90a_texts[gid], encodings[gid])
            expected.line_around_address  # formatted here once, not again in every batch that sends it
        return {self.chunks[gid]: known[gid] for gid in gids.intersection(encodings)}

    def expected_for(self, relpaths: list[str]) -> dict[bytes, tuple[bytes, str, str]]:
        """What kernels patched in place need: each instruction's gfx90a bytes and objdump line around the address
        (tuples: they cross to the workers three times cheaper than Expected objects)."""
        gids = set().union(*(self.files[relpath][1] for relpath in relpaths))
        return {chunk: (expected.encoding, *expected.line_around_address)
                for chunk, expected in self._expected_of(gids).items()}

    def moves_for(self, relpaths: list[str]) -> tuple[dict[bytes, Expected], dict[bytes, tuple[Expected, Expected]]]:
        """What kernels whose code moves need: each instruction's gfx90a text and bytes, and the splits."""
        gids = set().union(*(self.files[relpath][1] for relpath in relpaths))
        return self._expected_of(gids), {self.chunks[g]: self.halves[g] for g in gids if g in self.halves}

    def split_unlocks(self, relpath: str) -> bool:
        """Every blocker of the kernel is an int8 K=32 MFMA the split rule handles."""
        blockers = self.blocking_ids(relpath)
        return bool(blockers) and blockers <= self.splittable

    def is_portable(self, relpath: str) -> bool:
        # isdisjoint stops at the file's first blocker, which a blocked file mostly has among its first ids
        return self.files[relpath][0] == "ok" and self.blocking.isdisjoint(self.files[relpath][1])

    def portable(self) -> list[str]:
        return [relpath for relpath in self.files if self.is_portable(relpath)]

    def add_audits(self, batch: list[tuple[str, dict, dict[int, int]]]) -> None:
        """What hazards.audit_batch found."""
        for relpath, audit, shortfalls in batch:
            self.audits[relpath] = audit
            if shortfalls:
                self.shortfalls[relpath] = shortfalls

    def add_verdicts(self, verdicts: judge.Verdicts) -> None:
        """What judge.judge_batch found for the next len(verdicts.texts) gids."""
        first = len(self.texts)

        def shifted(by_index: dict) -> Iterator:
            return zip(map(first.__add__, by_index), by_index.values())

        self.texts += verdicts.texts
        self.gfx90a_texts += verdicts.gfx90a_texts
        self.encodings.update(shifted(verdicts.encodings))
        self.reasons.update(shifted(verdicts.reasons))
        self.blocking.update(map(first.__add__, verdicts.reasons))
        self.buckets.update(shifted(verdicts.buckets))
        self.splittable.update(map(first.__add__, verdicts.splittable))
        self.halves.update(shifted(verdicts.halves))

    def gfx90a_texts_for(self, relpaths: list[str]) -> dict[bytes, str]:
        gids = set().union(*(self.files[relpath][1] for relpath in relpaths))
        return {self.chunks[gid]: self.gfx90a_texts[gid] for gid in gids}


def _sizes(root: Path, relpaths: list[str]) -> list[int]:
    return [os.stat(os.path.join(root, relpath)).st_size for relpath in relpaths]


def _balanced(root: Path, relpaths: list[str], count: int) -> list[list[str]]:
    """Deal files into `count` batches of about equal total size, largest first (each batch sorted)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(count, len(relpaths))))]
    loads = [0] * len(groups)
    for size, relpath in sorted(zip(_sizes(root, relpaths), relpaths), key=lambda pair: -pair[0]):
        lightest = loads.index(min(loads))
        groups[lightest].append(relpath)
        loads[lightest] += size
    return [sorted(group) for group in groups if group]


def _runs(root: Path, relpaths: list[str], count: int) -> list[list[str]]:
    """Cut files, in the order given, into `count` runs of about equal total size: neighbours stay together (the
    scan meets a .text it has already cut mostly in the same directory)."""
    ends = list(accumulate(_sizes(root, relpaths)))
    total = ends[-1] if ends else 0
    cuts = [0] + [min(bisect_left(ends, total * k / count) + 1, len(relpaths)) for k in range(1, count)]
    cuts.append(len(relpaths))
    return [relpaths[start:end] for start, end in zip(cuts, cuts[1:]) if end > start]


# A translation keeps millions of small objects alive until it ends (instruction tables, listings, audits), so with
# Python's default first-generation threshold (700) the cyclic collector ran about 1,700 times in a cold run of the
# 0.1.7 tree, for 0.55 CPU-s, and found next to nothing to free; at 100,000 it costs 0.17 CPU-s (gc.callbacks), most
# of it in the parent after the pool.
GC_THRESHOLD = 100_000
# Distinct instructions per judge task: 4 or 5 tasks for the 0.1.7 tree's 96,000, enough to keep both cores busy
# to the end; each task starts llvm-mc three times (about 20 ms each).
JUDGE_BATCH = 24_000


def _collect_less() -> None:
    """Raise the collector's first-generation threshold (also the workers' initializer)."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


@contextmanager
def _pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """The worker processes; while they are in use, this process collects less too (its threshold is restored)."""
    saved = gc.get_threshold()
    _collect_less()
    try:
        # spawn, not fork: the engine also runs inside pyinfra (gevent), where forking a live hub is unsafe.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_collect_less) as pool:
            yield pool
    finally:
        gc.set_threshold(*saved)


def _analyse(src: Path, kernels: list[str], tools: llvm.LlvmTools, jobs: int, pool: ProcessPoolExecutor,
             progress: Progress, audit: bool = True, decode_splits: bool = False) -> Analysis:
    """Stages 1-4 (without `audit`, 1-3: translate runs the audit pipelined with the writing); `decode_splits`
    when split kernels are to be written (their proof needs the halves' text as LLVM prints it). The judge's
    batches are queued as the scan finds new instructions, so they fill the scan's last moments."""
    analysis = Analysis()
    started = time.monotonic()
    progress(f"scanning {len(kernels)} code objects with {jobs} processes, judging their distinct instructions for "
             "gfx90a as they are found")
    gid_of: defaultdict[bytes, int] = defaultdict(count().__next__)  # as in _scan_batch: the order is the gids'
    groups = _runs(src, kernels, jobs * 4)
    judged: list[Future] = []
    pending: list[bytes] = []  # found, not yet queued to be judged

    def queue(at_least: int) -> None:
        while pending and len(pending) >= at_least:
            judged.append(pool.submit(judge.judge_batch, tools, pending[:JUDGE_BATCH], decode_splits))
            del pending[:JUDGE_BATCH]

    for table, results in pool.map(_scan_batch, [str(src)] * len(groups), groups):
        known = len(gid_of)
        local = list(map(gid_of.__getitem__, table))
        for relpath, kind, payload in results:
            analysis.files[relpath] = (kind, array("I", map(local.__getitem__, payload)) if kind == "ok" else payload)
        pending += compress(table, map(known.__le__, local))  # the new ones, in the order of their gids
        queue(JUDGE_BATCH)
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
    groups = _balanced(src, portable, jobs * 2)
    for batch in pool.map(hazards.audit_batch, [str(src)] * len(groups), groups,
                          [analysis.gfx90a_texts_for(group) for group in groups], ["gfx90a"] * len(groups)):
        analysis.add_audits(batch)


def _kernel_entry(analysis: Analysis, relpath: str) -> dict:
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


def _withheld_reason(audit: dict, policy: str) -> str:
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
    by_verdict = {verdict: [audit for audit in audits if audit["verdict"] == verdict] for verdict in hazard_rules.VERDICTS}

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


def classify_tree(src: Path, *, jobs: int | None = None, progress: Progress | None = None) -> dict:
    """Why each kernel of a gfx942 tree is or is not portable to gfx90a; writes nothing."""
    started = time.monotonic()
    progress = progress or (lambda message: None)
    _check_source(src)
    tools = llvm.find_llvm()
    kernel_paths, _ = _list_tree(src)
    jobs = jobs or os.cpu_count() or 1
    with _pool(jobs) as pool:
        analysis = _analyse(src, kernel_paths, tools, jobs, pool, progress)
    kernels = {relpath: _kernel_entry(analysis, relpath) for relpath in kernel_paths}
    for entry in kernels.values():  # what translate does with it under the default policy (refusals show only there)
        if entry["status"] == "portable":
            short = entry["hazards"]["verdict"] in (hazard_rules.SHORT_STRAIGHT, hazard_rules.SHORT_BRANCHES)
            entry["translation"] = "padded" if short else "in place"
        elif entry.get("unlocked_by") == "int8_k32_split":
            entry["translation"] = "split, with int8_k32_split"
    return {
        "format": REPORT_FORMAT, "command": "classify", "translator_version": TRANSLATOR_VERSION,
        "llvm": {"bin_dir": str(tools.bin_dir), "version": tools.version, "banner": tools.banner},
        "source": str(src), "distinct_instructions": len(analysis.chunks),
        "counts": _counts(kernels), "families": _family_table(kernels), "kernels": kernels,
        "hazards": _hazard_summary(kernels, None), "limitations": _limitations(None, kernels),
        "durations": {**{k: round(v, 3) for k, v in analysis.durations.items()},
                      "total": round(time.monotonic() - started, 3)},
    }


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


@dataclass(frozen=True)
class Policy:
    """What the translator may do beyond re-encoding in place, and which kernels it installs (host data
    `kernel_hazard_policy`, `pad_mfma_hazards`, `int8_k32_split`)."""
    hazards: str = hazard_rules.DEFAULT_POLICY  # which audit verdicts are installed: hazard_rules.POLICIES
    # Pad every short MFMA edge the audit finds with exactly the missing wait states (s_nop before the consumer),
    # so the kernel is clean under LLVM's gfx90a rules; the policy then judges the padded kernel.
    pad_mfma_hazards: bool = True
    # Off until measured on an MI210: each split MFMA costs 4x the gfx942 cycles, so an unlocked kernel is not
    # necessarily faster than AITER's fallback.
    int8_k32_split: bool = False

    @property
    def label(self) -> str:
        """A name for the policy, for directories: `default`, `strict-unpadded-int8-k32-split`, ..."""
        return (self.hazards + ("" if self.pad_mfma_hazards else "-unpadded")
                + ("-int8-k32-split" if self.int8_k32_split else ""))

    @classmethod
    def of_host_data(cls, data) -> "Policy":
        """The policy a host's data selects (deploy and verify read the same keys)."""
        return cls(hazards=data.kernel_hazard_policy, pad_mfma_hazards=data.pad_mfma_hazards,
                   int8_k32_split=data.int8_k32_split)

    def record(self, audit_version: str | None = None) -> dict[str, str | bool]:
        """The whole policy as the deployed record keeps it (`kernel_hazards`), with the version of the MFMA
        wait-state audit that judged the tree (this tool's when None); verify compares it with the record a deploy
        would write now."""
        return {"policy": self.hazards, "audit_version": audit_version or hazard_rules.AUDIT_VERSION,
                "pad_mfma_hazards": self.pad_mfma_hazards, "int8_k32_split": self.int8_k32_split}

    @staticmethod
    def read_record(record: dict) -> dict[str, str | bool]:
        """A recorded `kernel_hazards` in the form record() gives, whichever deploy wrote it. Records without the
        pad and split fields were written by deploys that ran with padding on and the split off (the defaults
        since the re-assembler came; records from before it, when nothing was padded, read as padded too)."""
        return {"pad_mfma_hazards": True, "int8_k32_split": False, **record}

    @property
    def cli_arguments(self) -> list[str]:
        """The `python -m cdna2 translate` options that select this policy."""
        return (["--hazard-policy", self.hazards] + ([] if self.pad_mfma_hazards else ["--no-mfma-padding"])
                + (["--int8-k32-split"] if self.int8_k32_split else []))


@lru_cache(maxsize=1)
def _engine_code_digest() -> str:
    return code_digest((sys.modules[__name__], edits, hazards, hazard_rules, hazard_instructions, hazard_paths,
                        hazard_report, isa, judge, llvm, split, reassemble, relocation_proof,
                        elf, manifest))


def cache_key(src_digest: str, tools: llvm.LlvmTools, policy: Policy = Policy(),
              pads: dict[str, list[edits.Pad]] | None = None) -> str:
    """What a translation depends on: the source tree, the translator, the LLVM that proves it, the hazard audit,
    the policy and the padding asked for."""
    asked = json.dumps({"policy": asdict(policy), "pads": {r: [asdict(p) for p in v] for r, v in (pads or {}).items()}},
                       sort_keys=True)
    parts = (src_digest, TRANSLATOR_VERSION, tools.banner, hazard_rules.AUDIT_VERSION, asked, _engine_code_digest())
    return hashlib.sha256("".join(f"{part}\n" for part in parts).encode()).hexdigest()


def _move_into_place(staging: Path, dst: Path) -> None:
    """Rename the finished tree onto DST; an existing DST is moved aside first and removed only afterwards."""
    previous = dst.with_name(f".{dst.name}.previous.{os.getpid()}")
    if dst.exists():
        dst.rename(previous)
    staging.rename(dst)
    if previous.exists():
        shutil.rmtree(previous)


def _staging_for(dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.staging.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _from_cache(entry: Path, dst: Path, report_base: dict, progress: Progress) -> dict | None:
    if not (entry / "report.json").is_file():
        return None
    report = json.loads((entry / "report.json").read_text())
    if tree_digest(entry / "tree") != report["output_digest"]:
        progress(f"cache entry {entry} does not match its recorded digest; translating again")
        # Renamed away first, so another process finding it corrupt too, or storing a good one, never meets half.
        discarded = entry.with_name(f"{entry.name}.corrupt.{os.getpid()}")
        try:
            entry.rename(discarded)
        except FileNotFoundError:
            pass  # another process removed it already
        shutil.rmtree(discarded, ignore_errors=True)
        report_base["cache"]["status"] = "miss: corrupt entry replaced"
        return None
    staging = _staging_for(dst)
    shutil.copytree(entry / "tree", staging)
    _move_into_place(staging, dst)
    return {**report, **report_base, "cache": {**report_base["cache"], "status": "hit"}}


def _store_in_cache(entry: Path, staging: Path, report: dict) -> None:
    """Copy the finished tree and its report into the cache, appearing in one rename."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    temporary = entry.with_name(f"{entry.name}.tmp.{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(staging, temporary / "tree")
    (temporary / "report.json").write_text(json.dumps(report, sort_keys=True))
    try:
        temporary.rename(entry)
    except OSError:
        # Another run stored the same key meanwhile: same inputs, same bytes, so its entry serves.
        shutil.rmtree(temporary)
        if not (entry / "report.json").is_file():
            raise


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
    _write_batch for its kernels to patch in place and to re-assemble, so no worker waits for the last audit.
    `meanwhile` is the parent's own work, done once the workers have their first tasks (it would otherwise run after
    the pool, with one core idle). Returns each portable kernel's route (_route), the in-place outcomes, the
    re-assembled kernels and what `meanwhile` returned."""
    started = time.monotonic()
    portable = analysis.portable()
    progress(f"auditing MFMA wait states of {len(portable)} portable kernels for gfx90a and writing and proving them "
             f"as their audits come back; re-assembling and proving {len(unlocked)} kernels the split unlocks")
    audits = [pool.submit(hazards.audit_batch, str(src), group, analysis.gfx90a_texts_for(group), "gfx90a")
              for group in _balanced(src, portable, jobs * 4)]

    def write(in_place: list[str], to_move: list[str]) -> Future:
        moves = edits.MoveBatch(to_move, *analysis.moves_for(to_move), {r: pads[r] for r in to_move if r in pads},
                                policy.pad_mfma_hazards,
                                {r: analysis.shortfalls[r] for r in to_move if r in analysis.shortfalls}
                                ) if to_move else None
        return pool.submit(_write_batch, tools, str(src), str(staging), in_place, analysis.expected_for(in_place),
                           moves)

    writes = [write([], group) for group in _balanced(src, unlocked, jobs * 4)]
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
            writes += [write([], single) for single in _balanced(src, to_move, len(to_move))]
    analysis.durations["audit"] = time.monotonic() - started
    results = [future.result() for future in writes]
    outcomes = {relpath: (patched, error) for in_place, _ in results for relpath, patched, error in in_place}
    moved = {result.relpath: result for _, batch in results for result in batch}
    _check_targets(tools, staging, outcomes, moved, pool, jobs)
    return routes, outcomes, moved, done_meanwhile


def _moved_entry(moved: edits.Moved, audit_before: dict | None) -> dict:
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
        cached = _from_cache(Path(cache_dir) / key, dst, base, progress)
        if cached is not None:
            cached["durations"] = {"total": round(time.monotonic() - started, 3)}
            progress(f"cache hit {key[:12]}: {dst} installed from {cache_dir}")
            return cached

    kernel_paths, others = _list_tree(src)
    staging = _staging_for(dst)
    try:
        with _pool(jobs) as pool:
            analysis = _analyse(src, kernel_paths, tools, jobs, pool, progress, audit=False,
                                decode_splits=policy.int8_k32_split)
            staging.mkdir()
            unlocked = _kernels_the_split_unlocks(analysis) if policy.int8_k32_split else []
            audit_started = time.monotonic()
            routes, outcomes, moved, not_portable = _audit_write_and_move(
                src, staging, analysis, unlocked, policy, pads, tools, jobs, pool,
                progress, lambda: {r: _kernel_entry(analysis, r) for r in kernel_paths if not analysis.is_portable(r)})
            # From the last audit's return: the writing and proving that had not finished by then.
            analysis.durations["write_and_prove"] = time.monotonic() - audit_started - analysis.durations["audit"]
        kernels = {relpath: not_portable.get(relpath) or _kernel_entry(analysis, relpath) for relpath in kernel_paths}
        for relpath, route in routes.items():
            if route == "withheld":
                entry = kernels[relpath]
                entry.update(status="withheld", reason=_withheld_reason(entry["hazards"], policy.hazards))
        for relpath, (patched, error) in outcomes.items():
            if error:
                kernels[relpath].update(status="error", reason=f"proof failed: {error}")
            else:
                kernels[relpath].update(status="written", code="in place", patched_instructions=patched)
        for relpath, outcome in moved.items():
            kernels[relpath].update(_moved_entry(outcome, kernels[relpath].get("hazards")))
            if outcome.outcome == "written" and not hazard_rules.installs(policy.hazards, outcome.audit["verdict"]):
                (staging / relpath).unlink()
                kernels[relpath].update(status="withheld", reason=_withheld_reason(outcome.audit, policy.hazards))

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

        report = {
            "format": REPORT_FORMAT, "command": "translate", "translator_version": TRANSLATOR_VERSION,
            "llvm": {"bin_dir": str(tools.bin_dir), "version": tools.version, "banner": tools.banner},
            **base, "output_digest": tree_digest(staging), "distinct_instructions": len(analysis.chunks),
            "counts": _counts(kernels), "families": _family_table(kernels), "kernels": kernels,
            "manifests": manifests,
            "manifest_rows": {"kept": sum(m["kept"] for m in manifests.values()),
                              "dropped": sum(m["dropped"] for m in manifests.values())},
            "carried_files": carried, "hazards": _hazard_summary(kernels, policy.hazards),
            "limitations": _limitations(policy.hazards, kernels), "int8_k32_split": split_report,
            "padding": {"enabled": policy.pad_mfma_hazards, "kernels": sum(1 for r in moved if kernels[r].get("nops")),
                        "nops": sum(kernels[r].get("nops", 0) for r in moved)},
        }
        if cache_dir is not None:
            _store_in_cache(Path(cache_dir) / key, staging, report)
        _move_into_place(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report["durations"] = {**{k: round(v, 3) for k, v in analysis.durations.items()},
                           "total": round(time.monotonic() - started, 3)}
    progress(f"{dst}: {len(written)} kernels written, {report['manifest_rows']['kept']} manifest rows kept")
    return report

"""What the analysis stages learn about one source tree, and what the later stages ask of it: per kernel its
instructions (by id into the tree's table of distinct instructions), per instruction the judge's verdict, its gfx90a
spelling and bytes, per portable kernel its MFMA wait-state audit. Entry point: ``Analysis``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterator

from cdna2.kernels import judge
from cdna2.kernels.relocation_proof import Expected


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

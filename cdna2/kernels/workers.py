"""The translation engine's worker processes, and the garbage collector's setting in them and in the parent while they
run. Entry point: ``pool(jobs)``.
"""

from __future__ import annotations

import gc
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Iterator

# A translation keeps millions of small objects alive until it ends (instruction tables, listings, audits), so with
# Python's default first-generation threshold (700) the cyclic collector ran about 1,700 times in a cold run of the
# 0.1.7 tree, for 0.55 CPU-s, and found next to nothing to free; at 100,000 it costs 0.17 CPU-s (gc.callbacks), most
# of it in the parent after the pool.
GC_THRESHOLD = 100_000


def _collect_less() -> None:
    """Raise the collector's first-generation threshold (also the workers' initializer)."""
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


@contextmanager
def pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """The worker processes; while they are in use, this process collects less too (its threshold is restored)."""
    saved = gc.get_threshold()
    _collect_less()
    try:
        # spawn, not fork: the engine also runs inside pyinfra (gevent), where forking a live hub is unsafe.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_collect_less) as pool:
            yield pool
    finally:
        gc.set_threshold(*saved)

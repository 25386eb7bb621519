"""Two real processes racing for one cache entry, for the tests of the cache's concurrency safety."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

SPAWN = multiprocessing.get_context("spawn")


def append_line(log: Path, line: str) -> None:
    with open(log, "a") as stream:  # O_APPEND: whole lines from several processes
        stream.write(line + "\n")


def race(target, *args, while_running=lambda: None) -> None:
    """Run ``target(*args, barrier)`` (a module-level function) in two spawned processes that pass the barrier
    together; ``while_running`` is called over and over until both have ended, each of which must exit 0."""
    barrier = SPAWN.Barrier(2)
    racers = [SPAWN.Process(target=target, args=(*args, barrier)) for _ in range(2)]
    for racer in racers:
        racer.start()
    while any(racer.is_alive() for racer in racers):
        while_running()
        time.sleep(0.01)
    for racer in racers:
        racer.join()
        assert racer.exitcode == 0, f"a racing process failed (exit {racer.exitcode})"

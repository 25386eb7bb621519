"""Two processes building the same cache entry at once (two test sessions on one cold cache): one waits for the other,
and nothing half-built is ever seen. Real processes race here; only pip's download is stood in for, slowed down.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import time
import zipfile
from pathlib import Path

from cdna2.cache import cache_lock
from tests.unit.racing import SPAWN, append_line, race

HELD_SECONDS = 0.3
DEMO_WHEEL = "demo-1.0-py3-none-any.whl"
DEMO_MODULE = b"VALUE = 1\n" * 1000


def _hold_the_lock(root: str, log: str, barrier) -> None:
    barrier.wait()
    with cache_lock("entry", Path(root)):
        append_line(Path(log), f"in {os.getpid()}")
        time.sleep(HELD_SECONDS)
        append_line(Path(log), f"out {os.getpid()}")


def test_the_cache_lock_lets_one_process_in_at_a_time(tmp_path):
    log = tmp_path / "log"
    started = time.monotonic()
    race(_hold_the_lock, str(tmp_path), str(log))
    lines = log.read_text().splitlines()
    first, second = lines[0].split()[1], lines[2].split()[1]
    assert first != second
    assert lines == [f"in {first}", f"out {first}", f"in {second}", f"out {second}"]
    assert time.monotonic() - started >= 2 * HELD_SECONDS


def _take_the_lock_and_die(root: str, taken) -> None:
    with cache_lock("entry", Path(root)):
        taken.set()
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    taken = SPAWN.Event()
    holder = SPAWN.Process(target=_take_the_lock_and_die, args=(str(tmp_path), taken))
    holder.start()
    assert taken.wait(timeout=60)
    holder.join(timeout=60)
    assert holder.exitcode == -signal.SIGKILL
    with open(tmp_path / "locks" / "entry.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if the lock were still held


def _demo_wheel_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("demo.py", DEMO_MODULE)
    return buffer.getvalue()


def _slow_pip_download(calls: Path, *args: str) -> None:
    """Stands in for ``pip download`` (no registry call in a unit test): writes the wheel into the download
    directory in place and slowly, as pip's copy does, so a reader could meet half of it."""
    append_line(calls, " ".join(args))
    data = _demo_wheel_bytes()
    with open(Path(args[args.index("-d") + 1]) / DEMO_WHEEL, "wb") as stream:
        stream.write(data[:len(data) // 2])
        stream.flush()
        time.sleep(HELD_SECONDS)
        stream.write(data[len(data) // 2:])


def _fetch_the_demo_wheel(cache: str, calls: str, results: str, barrier) -> None:
    os.environ["CDNA2_CACHE"] = cache
    from lab import wheelhouse

    wheelhouse._pip = lambda *args: _slow_pip_download(Path(calls), *args)
    barrier.wait()
    append_line(Path(results), str(wheelhouse.wheel("demo==1.0")))


def test_two_processes_fetching_one_wheel_download_it_once_and_no_reader_sees_half(tmp_path):
    cache, calls, results = tmp_path / "cache", tmp_path / "calls", tmp_path / "results"

    def read_the_wheels() -> None:  # as a reader of wheels/ outside the lock does (pip install --find-links)
        for found in (cache / "wheels").glob("*.whl"):
            with zipfile.ZipFile(found) as archive:  # BadZipFile on half a wheel
                assert archive.read("demo.py") == DEMO_MODULE

    race(_fetch_the_demo_wheel, str(cache), str(calls), str(results), while_running=read_the_wheels)
    wheel = cache / "wheels" / DEMO_WHEEL
    assert results.read_text().splitlines() == [str(wheel), str(wheel)]
    assert len(calls.read_text().splitlines()) == 1, "the second process waited and took the first one's wheel"
    read_the_wheels()
    assert sorted(path.name for path in cache.iterdir()) == ["locks", "wheels"], "no download staging left behind"

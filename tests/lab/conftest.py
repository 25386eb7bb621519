"""Fixtures for tests against the simulated lab (docs/maintainers/test-lab.md).

``lab``: the default three-host lab, shared by the whole session. A lab that is already up is reused as it is;
one this session had to start is stopped again at the end (set CDNA2_LAB_KEEP=1 to keep it running).
``scratch_lab``: a throwaway one-host lab with its own state directory and loopback subnet, for tests that stop or
change a host without disturbing the shared lab.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path

import pytest

from lab import kinds, wheelhouse
from lab.labctl import host_alive
from lab.labstate import REPO, LabPaths, load_lab

LAB_COMMANDS = REPO / "lab"
DEFAULT_HOSTS = 3
# Subnets for scratch labs: away from the shared lab's 127.0.10, one per scratch lab in a session.
_scratch_subnets = (f"{kinds.LAB_NET}.{octet}" for octet in itertools.count(20))
_scratch_subnets_lock = threading.Lock()


def run_lab_command(command: str, *args: str, lab_dir: Path | None = None,
                    check: bool = True) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    if lab_dir is not None:
        environment["CDNA2_LAB_DIR"] = str(lab_dir)
    result = subprocess.run([str(LAB_COMMANDS / command), *args], capture_output=True, text=True, env=environment,
                            timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"./lab/{command} {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def _running(paths: LabPaths) -> bool:
    lab = load_lab(paths)
    return lab is not None and len(lab["hosts"]) >= DEFAULT_HOSTS and all(host_alive(h) for h in lab["hosts"])


@pytest.fixture(scope="session", name="run_lab_command")
def run_lab_command_fixture():
    """Run ./lab/COMMAND ARGS... (optionally on another lab directory); fails the test on a non-zero exit."""
    return run_lab_command


@pytest.fixture(scope="session")
def in_background() -> Iterator[ThreadPoolExecutor]:
    """A thread for work no test waits on, done by the session's end: stopping a module's own lab and removing its
    files (the 10-host cluster's took 34 s, mostly unlinking its venvs) while the next module's tests run."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="in-background") as pool:
        yield pool


@pytest.fixture(scope="session")
def lab() -> dict:
    paths = LabPaths.default()
    was_running = _running(paths)
    run_lab_command("up", str(DEFAULT_HOSTS))
    yield load_lab(paths)
    if not was_running and not os.environ.get("CDNA2_LAB_KEEP"):
        run_lab_command("down")


# Labs brought up as the session's lab tests start (see early_labs): fixture -> (a name for the lab's scratch
# directory, the function that brings it up there and returns its lab.json), registered with early_lab.
EARLY_LABS: dict[str, tuple[str, Callable[[Path], dict]]] = {}


def early_lab(fixture: str, name: str) -> Callable:
    """Registers the decorated ``bring_up(lab_dir) -> lab`` as the early start of ``fixture``'s lab."""
    def register(bring_up: Callable[[Path], dict]) -> Callable[[Path], dict]:
        EARLY_LABS[fixture] = name, bring_up
        return bring_up
    return register


def _scratch_lab_dir(name: str) -> Path:
    # Not under /tmp (each host mounts its own /tmp) and on the filesystem of the venv templates (hard links).
    return wheelhouse.cache_root() / "scratch-labs" / f"{name}-{uuid.uuid4().hex[:12]}"


def up_one_host(lab_dir: Path, *up_options: str) -> dict:
    """``./lab/up 1 UP_OPTIONS`` in ``lab_dir``, on the session's next scratch subnet."""
    with _scratch_subnets_lock:
        subnet = next(_scratch_subnets)
    run_lab_command("up", "1", *up_options, "--subnet", subnet, lab_dir=lab_dir)
    return json.loads((lab_dir / "lab.json").read_text())


def _down_if_up(lab_dir: Path) -> None:
    if (lab_dir / "lab.json").exists():
        run_lab_command("down", lab_dir=lab_dir, check=False)


@pytest.fixture(scope="session", autouse=True)
def early_labs(request: pytest.FixtureRequest) -> Iterator[dict[str, tuple[Path, Future]]]:
    """The labs of EARLY_LABS whose fixture a selected test uses, each brought up in a thread of its own as the
    session's lab tests start, so that its bring-up overlaps the tests before its own: a --login user lab copies a
    1.4 GB venv for its user (about a minute, mostly waiting on the disk); the Slurm lab's time-limit run waits 60
    to 90 s on slurmctld. Yields fixture -> (lab directory, the bring-up's future); any lab still up at the end is
    stopped."""
    wanted = sorted({name for item in request.session.items for name in item.fixturenames} & EARLY_LABS.keys())
    started = {}
    with ThreadPoolExecutor(max_workers=max(len(wanted), 1), thread_name_prefix="early-labs") as pool:
        try:
            for fixture in wanted:
                name, bring_up = EARLY_LABS[fixture]
                lab_dir = _scratch_lab_dir(name)
                started[fixture] = lab_dir, pool.submit(bring_up, lab_dir)
            yield started
        finally:
            for lab_dir, bring_up in started.values():
                wait([bring_up])
                _down_if_up(lab_dir)


@contextmanager
def one_host_lab(name: str, *up_options: str, monkeypatch: pytest.MonkeyPatch | None = None,
                 early: tuple[Path, Future] | None = None) -> Iterator[dict]:
    """``./lab/up 1 UP_OPTIONS`` in a state directory and subnet of its own, stopped at the end if still running.
    With ``monkeypatch``, CDNA2_LAB_DIR names it for the test (inventory/sim.py, the lab commands). With ``early``
    (an early_labs entry), the lab that one brought up instead."""
    lab_dir = early[0] if early is not None else _scratch_lab_dir(name)
    if monkeypatch is not None:
        monkeypatch.setenv("CDNA2_LAB_DIR", str(lab_dir))
    try:
        yield early[1].result() if early is not None else up_one_host(lab_dir, *up_options)
    finally:
        _down_if_up(lab_dir)


@pytest.fixture()
def scratch_lab() -> dict:
    """One host in its own state directory and subnet."""
    with one_host_lab("scratch") as lab:
        yield lab

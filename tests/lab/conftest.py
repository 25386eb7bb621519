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
import uuid
from collections.abc import Iterator
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
def lab() -> dict:
    paths = LabPaths.default()
    was_running = _running(paths)
    run_lab_command("up", str(DEFAULT_HOSTS))
    yield load_lab(paths)
    if not was_running and not os.environ.get("CDNA2_LAB_KEEP"):
        run_lab_command("down")


@contextmanager
def one_host_lab(name: str, *up_options: str, monkeypatch: pytest.MonkeyPatch | None = None) -> Iterator[dict]:
    """``./lab/up 1 UP_OPTIONS`` in a state directory and subnet of its own, stopped at the end if still running.
    With ``monkeypatch``, CDNA2_LAB_DIR names it for the test (inventory/sim.py, the lab commands)."""
    # Not under /tmp (each host mounts its own /tmp) and on the filesystem of the venv templates (hard links).
    lab_dir = wheelhouse.cache_root() / "scratch-labs" / f"{name}-{uuid.uuid4().hex[:12]}"
    if monkeypatch is not None:
        monkeypatch.setenv("CDNA2_LAB_DIR", str(lab_dir))
    run_lab_command("up", "1", *up_options, "--subnet", next(_scratch_subnets), lab_dir=lab_dir)
    try:
        yield json.loads((lab_dir / "lab.json").read_text())
    finally:
        if (lab_dir / "lab.json").exists():
            run_lab_command("down", lab_dir=lab_dir, check=False)


@pytest.fixture()
def scratch_lab() -> dict:
    """One host in its own state directory and subnet."""
    with one_host_lab("scratch") as lab:
        yield lab

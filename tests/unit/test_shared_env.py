"""A shared environment's identity, lock and checks (cdna2/host/shared_env.py, cdna2/host/env_lock.py), with real
processes on a local disk. What a local disk cannot show: NFS attribute caching and Lustre's mount options; the
lab's shared environments (tests/lab/test_shared_environment.py) are bind mounts, a local disk too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdna2.host import env_lock, txn
from cdna2.host.digests import file_sha256, tree_digest
from cdna2.host.env_lock import EnvLock, SharedEnvironmentBusy, check, claim_identity, mark_writer, read_writer
from cdna2.host.shared_env import read_identity, shared_environment_of, shared_state_dir
from cdna2.host.state import host_lock, read_lease
from tests.unit.racing import SPAWN

REPO = Path(__file__).resolve().parents[2]


def _claim(prefix: str, identity_id: str, barrier, results) -> None:
    barrier.wait()
    results.put(claim_identity(prefix, identity_id)["id"])


def test_racing_claims_agree_on_one_whole_identity(tmp_path: Path) -> None:
    barrier, results = SPAWN.Barrier(6), SPAWN.Queue()
    racers = [SPAWN.Process(target=_claim, args=(str(tmp_path), f"id-{n}", barrier, results)) for n in range(6)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
        assert racer.exitcode == 0
    ids = {results.get(timeout=5) for _ in racers}
    assert len(ids) == 1 and ids <= {f"id-{n}" for n in range(6)}, ids
    assert read_identity(tmp_path)["id"] in ids
    assert sorted(path.name for path in (tmp_path / ".cdna2").iterdir()) == ["identity.json"], "no staged file left"


def _count_under_lock(env_dir: str, barrier) -> None:
    barrier.wait()
    counter = Path(env_dir) / "counter"
    for _ in range(15):
        with EnvLock(Path(env_dir), heartbeat_s=0.05):
            value = int(counter.read_text()) if counter.exists() else 0
            time.sleep(0.002)  # a read-modify-write that loses updates unless the lock excludes the others
            counter.write_text(str(value + 1))


def test_the_lock_lets_one_process_in_at_a_time(tmp_path: Path) -> None:
    barrier = SPAWN.Barrier(4)
    racers = [SPAWN.Process(target=_count_under_lock, args=(str(tmp_path), barrier)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
        assert racer.exitcode == 0
    assert (tmp_path / "counter").read_text() == "60"
    assert not (tmp_path / "lock").exists(), "released"
    assert not list(tmp_path.glob("lock.*")), "nothing set aside is left"


def _hold_forever(env_dir: str, ready) -> None:
    with EnvLock(Path(env_dir)):
        ready.set()
        time.sleep(600)


def test_a_killed_holder_on_this_node_is_taken_over_at_once(tmp_path: Path) -> None:
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=_hold_forever, args=(str(tmp_path), ready))
    holder.start()
    assert ready.wait(30)
    with pytest.raises(SharedEnvironmentBusy, match=f"pid {holder.pid} on node {os.uname().nodename}"):
        with EnvLock(tmp_path, wait_s=0.5):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    started = time.monotonic()
    with EnvLock(tmp_path, wait_s=5, stale_s=60) as lock:
        assert lock.held()
    assert time.monotonic() - started < 5, "its process is gone: no wait for the heartbeat"


def another_node_holds(env_dir: Path, pid: int = 4242) -> Path:
    """The lock as a command on another node leaves it: an owner file naming that node."""
    (env_dir / "lock").mkdir()
    owner = env_dir / "lock" / "owner.json"
    owner.write_text(json.dumps({"name": "nid001007", "boot_id": "other", "pid": pid, "start": "1",
                                 "token": "theirs", "since": "2026-12-05T10:00:00Z"}))
    return owner


def test_another_nodes_holder_is_waited_for_while_its_heartbeat_goes_on_and_taken_over_when_it_stops(
        tmp_path: Path) -> None:
    owner = another_node_holds(tmp_path)
    beating = subprocess.Popen([sys.executable, "-c", f"import os, time\nwhile True: os.utime({str(owner)!r}); "
                                                      "time.sleep(0.1)"])
    try:
        with pytest.raises(SharedEnvironmentBusy, match="pid 4242 on node nid001007 since 2026-12-05T10:00:00Z"):
            with EnvLock(tmp_path, wait_s=1.5, stale_s=1.0):
                pass
    finally:
        beating.kill()
        beating.wait()
    started = time.monotonic()
    with EnvLock(tmp_path, wait_s=10, stale_s=1.0) as lock:
        assert lock.held()
    assert 1.0 <= time.monotonic() - started < 5


def test_a_waiter_that_decided_on_a_dead_holder_puts_back_a_lock_taken_meanwhile(tmp_path: Path) -> None:
    """Two waiters saw the same dead holder; the first broke its lock and took a new one. The second's rename then
    catches the first's live lock: it must put it back, not take it."""
    another_node_holds(tmp_path)  # the live holder's token: "theirs"
    EnvLock(tmp_path)._break(dead_token="the dead holder's")
    assert json.loads((tmp_path / "lock" / "owner.json").read_text())["token"] == "theirs"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lock"]
    EnvLock(tmp_path)._break(dead_token="theirs")
    assert list(tmp_path.iterdir()) == [], "the dead holder's lock is gone, set-aside copy and all"


def test_a_holder_that_lost_the_lock_ends_its_process_at_its_next_heartbeat(tmp_path: Path) -> None:
    """A holder paused past the stale time (here: its lock taken over under it) must not write on beside the new
    holder: its heartbeat ends the process, as a kill would."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom cdna2.host.env_lock import EnvLock\n"
        f"with EnvLock(Path({str(tmp_path)!r}), heartbeat_s=0.05):\n"
        "    print('held', flush=True)\n    time.sleep(30)\n    print('wrote on', flush=True)\n")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    os.rename(tmp_path / "lock", tmp_path / "lock.broken-by-test")  # what a waiter's takeover does
    another_node_holds(tmp_path)
    out, err = holder.communicate(timeout=10)
    assert holder.returncode == env_lock.LOST_LOCK_EXIT and "wrote on" not in out
    assert "was taken over by pid 4242 on node nid001007" in err, err
    assert (tmp_path / "lock" / "owner.json").exists(), "the new holder's lock is left alone"


def test_a_shared_state_directory_is_locked_across_nodes_and_takes_no_run_lease(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    state_dir = Path(shared_state_dir(tmp_path))
    assert shared_environment_of(state_dir) == str(tmp_path / ".cdna2")
    assert shared_environment_of(tmp_path / "state") is None
    monkeypatch.setenv("CDNA2_RUN", "run-1")
    with host_lock(state_dir):
        assert (tmp_path / ".cdna2" / "lock" / "owner.json").exists()
    assert read_lease(state_dir) is None, "the run lease is one node's: not in a shared environment"
    assert not (tmp_path / ".cdna2" / "lock").exists()


def test_a_transaction_in_a_shared_environment_holds_its_lock_and_leaves_no_empty_backups(tmp_path: Path) -> None:
    root = tmp_path / "site-packages"
    (root / "aiter").mkdir(parents=True)
    target = root / "aiter" / "core.py"
    target.write_text("stock\n")
    staged = root / "aiter" / ".core.py.staged"
    staged.write_text("patched\n")
    backup_dir = Path(shared_state_dir(tmp_path)) / "backups" / "amd-aiter"
    seen = []
    real_rename = txn._rename

    def watched_rename(source, destination):
        seen.append((tmp_path / ".cdna2" / "lock" / "owner.json").exists())
        real_rename(source, destination)

    txn._rename = watched_rename
    try:
        txn.apply({"package": "amd-aiter", "root": str(root), "backup_dir": str(backup_dir),
                   "changes": [{"path": "aiter/core.py", "staged": str(staged), "expected_sha256": file_sha256(target),
                                "new_sha256": file_sha256(staged)}]})
    finally:
        txn._rename = real_rename
    assert seen == [True] and target.read_text() == "patched\n"
    txn.revert(backup_dir, root)
    assert target.read_text() == "stock\n"
    assert not backup_dir.exists() and not (tmp_path / ".cdna2" / "lock").exists()


def test_the_check_of_a_non_writing_node_names_every_difference(tmp_path: Path) -> None:
    claim_identity(tmp_path, "env-1")
    mark_writer(tmp_path, "run-1")
    hsa = tmp_path / "hsa"
    (hsa / "gfx90a").mkdir(parents=True)
    (hsa / "gfx90a" / "fmha.co").write_bytes(b"kernel")
    patched = tmp_path / "core.py"
    patched.write_text("patched\n")
    expected = {"identity": "env-1", "writer": "mi210-a", "run": "run-1",
                "kernels": {"hsa_root": str(hsa), "digest": tree_digest(hsa / "gfx90a")},
                "files": {str(patched): file_sha256(patched)}}
    assert check(tmp_path, expected) == {"ok": True, "problems": [], "identity": "env-1", "written_by": "run-1",
                                         "checked_files": 1, "checked_kernels": True}
    mark_writer(tmp_path, "run-2")  # another controller's run wrote it since: what this run's plan leaves is there
    assert check(tmp_path, expected)["written_by"] == "another run: run-2" and check(tmp_path, expected)["ok"]

    patched.write_text("half\n")
    (hsa / "gfx90a" / "fmha.co").write_bytes(b"other")
    journal = Path(shared_state_dir(tmp_path)) / "backups" / "vllm" / "journal.json"
    journal.parent.mkdir(parents=True)
    journal.write_text("{}")
    (tmp_path / ".cdna2" / "writer.json").unlink()
    problems = check(tmp_path, expected)["problems"]
    assert [problem.split(":")[0] for problem in problems] == [
        f"{tmp_path}/.cdna2/writer.json is missing", str(journal), f"{hsa}/gfx90a", str(patched)], problems

    assert check(tmp_path, {**expected, "identity": "env-2"})["problems"] == [
        f"{tmp_path}/.cdna2/identity.json holds env-1, not the identity env-2 its writer mi210-a wrote: this node "
        "does not see the shared environment (a local disk at the same path?); give the host its own "
        "shared_environment: false, or mount the shared one"]
    assert check(tmp_path, {**expected, "identity": None})["identity"] == "env-1", \
        "an environment without identity at the probe: the one its writer (or a concurrent one) wrote"
    (tmp_path / ".cdna2" / "identity.json").unlink()
    assert check(tmp_path, {**expected, "identity": None})["problems"][0].startswith(
        f"{tmp_path}/.cdna2/identity.json holds None, not the identity (any) its writer mi210-a wrote")


def test_the_commands_print_json_and_fail_by_exit_status(tmp_path: Path) -> None:
    def run(*args: str) -> tuple[int, dict, str]:
        done = subprocess.run([sys.executable, "-m", "cdna2.host.env_lock", *args], cwd=REPO, capture_output=True,
                              text=True)
        return done.returncode, json.loads(done.stdout), done.stderr

    assert run("claim", "--prefix", str(tmp_path), "--id", "env-1", "--run", "run-1")[:2] == (
        0, {"result": "claimed", "identity": read_identity(tmp_path), "writer": read_writer(tmp_path)})
    assert read_writer(tmp_path)["run"] == "run-1"
    assert run("claim", "--prefix", str(tmp_path), "--id", "env-2", "--run", "run-2")[1]["result"] == "unchanged"
    assert read_identity(tmp_path)["id"] == "env-1" and read_writer(tmp_path)["run"] == "run-2"
    code, result, stderr = run("check", "--prefix", str(tmp_path), "--expect",
                               json.dumps({"identity": "env-2", "writer": "mi210-a"}))
    assert code == 1 and not result["ok"] and stderr.startswith("shared environment check failed: ")
    assert run("forget", "--prefix", str(tmp_path))[:2] == (0, {"result": "removed",
                                                                 "path": f"{tmp_path}/.cdna2"})
    assert not (tmp_path / ".cdna2").exists() and run("forget", "--prefix", str(tmp_path))[1] == {
        "result": "unchanged"}


def test_hold_runs_its_command_holding_the_lock_and_passes_its_exit_status(tmp_path: Path) -> None:
    state_dir = shared_state_dir(tmp_path)
    probe = f"import os, sys; sys.exit(0 if os.path.isdir({str(tmp_path / '.cdna2' / 'lock')!r}) else 7)"
    held = subprocess.run([sys.executable, "-m", "cdna2.host.env_lock", "hold", "--state-dir", state_dir, "--",
                           sys.executable, "-c", probe], cwd=REPO)
    assert held.returncode == 0, "the lock was held while the command ran"
    failing = subprocess.run([sys.executable, "-m", "cdna2.host.env_lock", "hold", "--state-dir", state_dir, "--",
                              sys.executable, "-c", "raise SystemExit(3)"], cwd=REPO)
    assert failing.returncode == 3 and not (tmp_path / ".cdna2" / "lock").exists()


def test_a_few_late_heartbeats_never_look_like_a_dead_node() -> None:
    assert env_lock.STALE_S >= 10 * env_lock.HEARTBEAT_S


# --- the controller's side: grouping by identity, the checker's expectation, per-node records ---------------------

def test_hosts_are_grouped_by_the_identity_once_written_and_get_one_new_identity_before() -> None:
    from pyinfra.api import Config, Inventory, State

    from operations.preflight import environment_claimed_by, environment_identity, probe_announced

    inventory = Inventory((["node1", "node2", "node3", "node4"], {}))
    State(inventory, Config())
    unwritten = {"python": {"prefix": "/project/venv", "fingerprint": "12:34:56", "identity": None}}
    written = {"python": {"prefix": "/project/venv", "fingerprint": "12:34:56", "identity": {"id": "env-1"}}}
    clone = {"python": {"prefix": "/project/venv", "fingerprint": "12:34:56", "identity": {"id": "env-2"}}}
    found = {"node1": unwritten, "node2": unwritten, "node3": written, "node4": clone}
    for name, probe in found.items():
        probe_announced(inventory, name, lambda probe=probe: probe)
    assert {name: environment_claimed_by(inventory, name) for name in found} == {
        "node1": None, "node2": "node1", "node3": None, "node4": None}, \
        "one fingerprint and no identity yet: one environment; different identities: different environments"
    new_identity = environment_identity(inventory, unwritten)
    assert new_identity == environment_identity(inventory, dict(unwritten)) and len(new_identity) == 32
    assert environment_identity(inventory, written) == "env-1"


def test_a_checker_expects_each_planned_file_at_its_new_hash_under_its_site_packages() -> None:
    from cdna2.patches.planner import FileChange
    from cdna2.shared_environments import checker_expectation

    class Plan:
        changes = [FileChange("aiter/jit/core.py", "0" * 64, b"x", "1" * 64, "")]

        @staticmethod
        def host_path(path: str) -> str:
            return path

    expectation = checker_expectation("env-1", "mi210-a", "run-1", {"hsa_root": "/v/hsa", "digest": "d"},
                                      [("/v/lib/python3.11/site-packages", Plan)])
    assert expectation == {"identity": "env-1", "writer": "mi210-a", "run": "run-1",
                           "kernels": {"hsa_root": "/v/hsa", "digest": "d"},
                           "files": {"/v/lib/python3.11/site-packages/aiter/jit/core.py": "1" * 64}}


def test_each_node_reads_its_own_smoke_record_from_a_shared_state_directory(tmp_path: Path, monkeypatch) -> None:
    from cdna2.host import state as host_state
    from cdna2.host.shared_env import node_view

    state_dir = Path(shared_state_dir(tmp_path))
    monkeypatch.setattr(host_state, "this_node", lambda: {"name": "nid001", "boot_id": "b"})
    with host_lock(state_dir):
        host_state.update_state(state_dir, "smoke", {"proves": "k1"})
        host_state.update_state(state_dir, "deployed", {"tree": "t"})
    monkeypatch.setattr(host_state, "this_node", lambda: {"name": "nid002", "boot_id": "b"})
    with host_lock(state_dir):
        host_state.update_state(state_dir, "smoke", {"proves": "k2"})
    recorded = host_state.read_state(state_dir)
    assert set(recorded) == {"format", "deployed", "smoke@nid001", "smoke@nid002"}
    assert node_view(recorded, "nid001") == {"format": 1, "deployed": {"tree": "t"}, "smoke": {"proves": "k1"}}
    assert node_view(recorded, "nid003") == {"format": 1, "deployed": {"tree": "t"}}, "no pass of its own yet"

"""Eight lab hosts on one shared environment and two with their own (``./lab/up 10 --shared 8``): hosts mi210-a to
mi210-h bind mi210-a's venv at /opt/venv, a stand-in for an environment on NFS or Lustre that every node mounts at
the same path (a bind mount is a local disk: its locking and rename guarantees are stronger than NFS's and
Lustre's, which the design does not rely on; see cdna2/host/shared_env.py). Each host keeps its own mount
namespace, sshd and GPU stand-in; host data ``shared_environment`` is set for the eight (inventory/sim.py).

What is checked: one writer and eight verifications; the environment's files equal a single-host deploy's
(mi210-j, the same kind with its own venv); a re-run changes nothing; verify; the writer killed at seeded points
mid-swap and mid-patch leaves the environment as it was or recoverable, and the next run from another node (or the
same one) finishes it; two controllers at once. The lab is its own (a scratch subnet under the cache's
scratch-labs/), stopped at the end (in the background: tests/lab/conftest.py, in_background).
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import threading
import time
import uuid
from pathlib import Path

import pytest

from cdna2.host.digests import file_sha256, tree_digest
from lab import kinds, wheelhouse
from tests.lab.conftest import run_lab_command
from tests.lab.deploy_runner import Controller, TreeWatcher, run_pyinfra, site_packages, tree_files

pytestmark = [pytest.mark.lab, pytest.mark.slow]

CLUSTER_SUBNET = f"{kinds.LAB_NET}.72"
SHARED = [f"mi210-{letter}" for letter in "abcdefgh"]
OWN = ["mi210-i", "mi210-j"]
REFERENCE = "mi210-j"  # the shared hosts' kind (kinds.SHARED_KIND), with a venv of its own


@pytest.fixture(scope="module")
def cluster(in_background):
    """The 8 + 2 lab, deployed once; yields lab.json with the reference host's deployed files."""
    lab_dir = wheelhouse.cache_root() / "scratch-labs" / f"cluster-{uuid.uuid4().hex[:12]}"
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("CDNA2_LAB_DIR", str(lab_dir))
        run_lab_command("up", "10", "--subnet", CLUSTER_SUBNET, "--shared", "8", lab_dir=lab_dir)
        try:
            lab = json.loads((lab_dir / "lab.json").read_text())
            lab["by_name"] = {host["name"]: host for host in lab["hosts"]}
            lab["pristine"] = environment_files(lab["by_name"]["mi210-a"])
            yield lab
        finally:
            in_background.submit(run_lab_command, "down", lab_dir=lab_dir, check=False)


def limited_to(names: list[str]) -> list[str]:
    """pyinfra's --limit, once per host (it takes no comma-separated list)."""
    return [argument for name in names for argument in ("--limit", name)]


def venv(lab_host: dict) -> Path:
    return Path(lab_host["binds"]["/opt/venv"])


# sha256 by (device, inode, size, mtime, ctime): the environments are hard-linked copies of their kinds' templates
# (the shared one and the reference one of the same), and a run changes few of their files, so each of the
# module's dozen reads (1.8 GB each) hashes only what no earlier read has seen; a write changes a file's ctime.
_digests: dict[tuple[int, ...], str] = {}


def environment_files(lab_host: dict) -> dict[str, str]:
    """sha256 of every file of the host's environment, the tool's own directory (.cdna2) and bytecode left out."""
    root = venv(lab_host)
    files = {}
    for top, directories, names in os.walk(root):
        directories[:] = [d for d in directories if d not in (".cdna2", "__pycache__")]
        for name in names:
            path = Path(top) / name
            status = path.lstat()
            if not stat.S_ISREG(status.st_mode):
                continue
            key = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
            if key not in _digests:
                _digests[key] = file_sha256(path)
            files[str(path.relative_to(root))] = _digests[key]
    return files


def patch_records(lab_host: dict) -> dict[str, dict]:
    """The reference host's patch backups: per package, its files' original and patched sha256."""
    backups = Path(lab_host["binds"]["/var/lib/cdna2"]) / "backups"
    return {record.parent.name: json.loads(record.read_text())["files"] for record in backups.glob("*/state.json")}


def test_one_writer_eight_verified_files_as_a_single_host_deploy_and_a_rerun_changes_nothing(cluster, tmp_path):
    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path, timeout=1200)
    assert deployed.returncode == 0, deployed.output[-4000:]
    (environment,) = deployed.report["shared_environments"]
    assert (environment["writer"], environment["hosts"], environment["verified_by"]) == ("mi210-a", SHARED, SHARED)
    assert deployed.row("mi210-a")["steps"]["kernels"]["status"] == "changed"
    for name in SHARED[1:]:
        steps = deployed.row(name)["steps"]
        assert steps["kernels"]["status"] == "by writer" and steps["patches amd-aiter"]["status"] == "by writer"
        assert steps["shared environment"]["status"] == "changed" and steps["smoke"]["status"] == "ok", steps
        assert not any(Path(cluster["by_name"][name]["binds"]["/var/lib/cdna2"]).iterdir()), \
            "a shared host keeps its state in the environment"
    for name in OWN:
        assert deployed.row(name)["steps"]["kernels"]["status"] == "changed", "its own environment, its own deploy"
    shared_venv = venv(cluster["by_name"]["mi210-a"])
    assert all(venv(cluster["by_name"][name]) == shared_venv for name in SHARED)
    assert environment_files(cluster["by_name"]["mi210-a"]) == environment_files(cluster["by_name"][REFERENCE])
    state = json.loads((shared_venv / ".cdna2" / "state" / "state.json").read_text())
    assert {key for key in state if key.startswith("smoke@")} == {f"smoke@{name}" for name in SHARED}

    again = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert again.returncode == 0 and all(row["changes"] == [] for row in again.report["hosts"]), again.output[-3000:]
    verified = run_pyinfra("-y", "verify.py", report_dir=tmp_path)
    assert verified.returncode == 0 and all(row["steps"]["verify"]["status"] == "ok"
                                            for row in verified.report["hosts"]), verified.output[-3000:]

    # Rolled back once, by its first host, triton included; the others check its files against RECORD.
    rolled_back = run_pyinfra("-y", "rollback.py", "--data", "rollback_restore_triton=true", *limited_to(SHARED),
                              report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    assert rolled_back.row("mi210-a")["steps"]["rollback"]["status"] == "changed"
    for name in SHARED[1:]:
        steps = rolled_back.row(name)["steps"]
        assert steps["rollback"]["detail"] == "rolled back once, by mi210-a (shared environment /opt/venv)", steps
        assert steps["record"]["status"] == "ok", steps
    assert environment_files(cluster["by_name"]["mi210-a"]) == cluster["pristine"], "stock again, file for file"
    assert not (shared_venv / ".cdna2").exists()


class Killer(threading.Thread):
    """SIGSTOPs, then SIGKILLs, the first process on the machine whose command line holds ``marker`` once
    ``ready(pid)`` says so: a host command of the lab's writer at a chosen point of its work."""

    def __init__(self, marker: list[bytes], ready):
        super().__init__(daemon=True)
        self.marker, self.ready, self.done, self.killed = marker, ready, threading.Event(), None

    def run(self) -> None:
        while not self.done.is_set() and self.killed is None:
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    command = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if not all(part in command for part in self.marker):
                    continue
                try:
                    if not self.ready(int(entry.name)):
                        continue
                    os.kill(int(entry.name), signal.SIGSTOP)  # frozen where it is, then killed there
                    os.kill(int(entry.name), signal.SIGKILL)
                    self.killed = int(entry.name)
                except ProcessLookupError:  # it ended before its point
                    continue
                return
            time.sleep(0.001)


def kernel_point(hsa: Path, seed: int):
    """Mid-swap: once the staging tree holds a seeded number of the kernel files (1 to 170 of 178+)."""
    wanted = random.Random(seed).randint(1, 170)

    def ready(pid: int) -> bool:
        staging = hsa / f".gfx90a.staging-{pid}"
        return staging.is_dir() and sum(len(files) for _, _, files in os.walk(staging)) >= wanted
    return ready, f"after {wanted} files unpacked"


def patch_point(backups: Path, seed: int):
    """Mid-patch. For even seeds, while the first package's journal exists (its renames in flight): the transaction
    is stopped (SIGSTOP) at first sight and then run in slices of a seeded 50-150 us, and looked at between two
    slices, when it cannot move, so the kill lands while the journal is there. For odd seeds, as soon as the
    transaction holds the environment's lock (before any rename)."""
    slice_s = random.Random(seed).uniform(0.00005, 0.00015)
    lock = backups.parent.parent / "lock"
    journal = backups / "amd-aiter" / "journal.json"

    def ready(pid: int) -> bool:
        if seed % 2:
            return lock.is_dir()
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 120
        while not journal.exists():
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGCONT)
                return False
            os.kill(pid, signal.SIGCONT)
            time.sleep(slice_s)
            os.kill(pid, signal.SIGSTOP)
        return True
    return ready, ("holding the lock" if seed % 2 else f"with its journal there (slices of {slice_s * 1e6:.0f} us)")


def assert_as_it_was_or_recoverable(shared_venv: Path, reference: dict, expected_kernels: str) -> list[str]:
    """The environment after the kill: the kernel tree whole (absent, as before the deploy, or the new one), each
    package all pristine or all patched unless its journal lets the next run finish it. Returns what it found."""
    found = []
    site = next(shared_venv.glob("lib/python3*/site-packages"))
    tree = site / "aiter_meta" / "hsa" / "gfx90a"
    digest = tree_digest(tree) if tree.exists() else None
    assert digest in (None, expected_kernels), f"{tree}: a tree that is neither the old nor the new one"
    found.append(f"kernels {'new' if digest else 'absent'}")
    backups = shared_venv / ".cdna2" / "state" / "backups"
    for package, files in reference.items():
        states = {("patched" if file_sha256(site / path) == hashes["patched_sha256"] else
                   "pristine" if file_sha256(site / path) == hashes["original_sha256"] else "other")
                  for path, hashes in files.items()}
        journal = (backups / package / "journal.json").exists()
        assert "other" not in states and (len(states) == 1 or journal), (package, states, journal)
        found.append(f"{package} {'/'.join(sorted(states))}{' + journal' if journal else ''}")
    return found


@pytest.mark.parametrize("point,seed,recovered_from", [
    ("kernels", 2701, "mi210-b"), ("patches", 2704, "mi210-b"), ("patches", 2705, "mi210-a"),
], ids=["mid-swap-2701-next-node", "mid-patch-2704-next-node", "mid-patch-2705-same-node"])
def test_a_writer_killed_mid_swap_or_mid_patch_leaves_no_torn_state_and_any_node_finishes(
        cluster, tmp_path, point, seed, recovered_from):
    hosts = cluster["by_name"]
    rolled_back = run_pyinfra("-y", "rollback.py", *limited_to(SHARED), report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    shared_venv = venv(hosts["mi210-a"])
    assert not (shared_venv / ".cdna2").exists(), "rolled back: the environment holds nothing of the tool"
    reference = patch_records(hosts[REFERENCE])
    site = site_packages(hosts["mi210-a"])
    expected_kernels = tree_digest(site_packages(hosts[REFERENCE]) / "aiter_meta" / "hsa" / "gfx90a")

    if point == "kernels":
        ready, where = kernel_point(site / "aiter_meta" / "hsa", seed)
        killer = Killer([b"cdna2.host.kernels", b"install"], ready)
    else:
        ready, where = patch_point(shared_venv / ".cdna2" / "state" / "backups", seed)
        killer = Killer([b"cdna2.host.txn", b"apply"], ready)
    watcher = TreeWatcher(site / "aiter_meta" / "hsa" / "gfx90a")
    killer.start()
    watcher.start()
    run = Controller("-y", "deploy.py", *limited_to(SHARED), report_dir=tmp_path / "killed")
    run.finish()
    killer.done.set()
    killer.join()
    seen = watcher.stop()
    assert killer.killed, f"seed {seed}: the writer's {point} command was never killed ({where})"
    assert run.process.returncode != 0
    assert seen <= {None, tree_files(site_packages(hosts[REFERENCE]) / "aiter_meta" / "hsa" / "gfx90a")}, \
        "a reader of hsa/gfx90a saw a tree that was neither absent nor whole"
    found = assert_as_it_was_or_recoverable(shared_venv, reference, expected_kernels)
    print(f"seed {seed}: the writer's {point} command killed {where}: {', '.join(found)}")  # -s shows each point

    # The next run's writer is the first of its hosts in inventory order: mi210-b once mi210-a is left out (a later
    # allocation without the node that was killed), else mi210-a again.
    hosts_now = SHARED[SHARED.index(recovered_from):]
    finished = run_pyinfra("-y", "deploy.py", *limited_to(hosts_now), report_dir=tmp_path / "finished")
    assert finished.returncode == 0, f"seed {seed}, killed {where} ({found}):\n{finished.output[-4000:]}"
    (environment,) = finished.report["shared_environments"]
    assert (environment["writer"], environment["verified_by"]) == (recovered_from, hosts_now), environment
    assert environment_files(hosts["mi210-a"]) == environment_files(hosts[REFERENCE]), \
        f"seed {seed}, killed {where} ({found}): the finished environment differs from a single-host deploy"
    assert not list((site / "aiter_meta" / "hsa").glob(".gfx90a.staging-*")), "no killed staging left"


def test_two_controllers_deploying_the_environment_at_once_leave_it_whole_and_both_verified(cluster, tmp_path):
    """Two deploys of the same hosts started together (two operators, or two Slurm jobs of one user): every write
    to the environment is whole under its lock, each writer's second look finds the other's work done, and both
    runs' checkers find what their plan leaves."""
    hosts = cluster["by_name"]
    rolled_back = run_pyinfra("-y", "rollback.py", *limited_to(SHARED), report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    site = site_packages(hosts["mi210-a"])
    watcher = TreeWatcher(site / "aiter_meta" / "hsa" / "gfx90a")
    watcher.start()
    runs = [Controller("-y", "deploy.py", *limited_to(SHARED), report_dir=tmp_path / name) for name in ("1", "2")]
    codes = [run.finish() for run in runs]
    seen = watcher.stop()
    assert codes == [0, 0], "\n\n".join(run.output()[-3000:] for run in runs)
    for name in ("1", "2"):
        (environment,) = json.loads((tmp_path / name / "latest.json").read_text())["shared_environments"]
        assert environment["verified_by"] == SHARED, (name, environment)
    assert seen <= {None, tree_files(site_packages(hosts[REFERENCE]) / "aiter_meta" / "hsa" / "gfx90a")}
    assert environment_files(hosts["mi210-a"]) == environment_files(hosts[REFERENCE])
    assert not list(site.rglob("*.cdna2-staged*")), "every staged file was applied or dropped"

"""Faults on the simulated lab: a host dying mid-upload, a full disk, a killed controller, two controllers at once,
a GPU that does not show on a host whose data names its arch.

The invariant every test checks: no host is ever left neither old nor new. AITER's ``hsa/gfx90a`` is the old tree
or the new one, each patched package is all-pristine or all-patched, and a re-run finishes the job.

The tests run on a lab of their own (two MI210 hosts on FAULT_SUBNET, under the cache's scratch-labs/), so the
shared lab is never disturbed; it is stopped at the end.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from cdna2.host.digests import file_sha256, tree_digest
from lab import kinds, wheelhouse
from lab.processes import descendants, stop_host
from tests.lab.conftest import run_lab_command
from tests.lab.deploy_runner import (Controller, TreeWatcher, host_snapshot, run_pyinfra, site_packages, ssh, tree_files,
                                     wait_sessions_gone)

pytestmark = pytest.mark.lab

FAULT_SUBNET = f"{kinds.LAB_NET}.60"  # away from the shared lab (127.0.10) and the scratch labs (127.0.20 upwards)
PACKAGES = ("amd-aiter", "vllm")


@pytest.fixture(scope="module")
def fault_lab():
    """Two MI210 hosts, deployed once; yields the lab with, per host, what a full deploy leaves behind."""
    lab_dir = wheelhouse.cache_root() / "scratch-labs" / f"faults-{uuid.uuid4().hex[:12]}"
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("CDNA2_LAB_DIR", str(lab_dir))
        run_lab_command("up", "2", "--subnet", FAULT_SUBNET, lab_dir=lab_dir)
        try:
            lab = json.loads((lab_dir / "lab.json").read_text())
            first = run_pyinfra("-y", "deploy.py", report_dir=lab_dir / "reports")
            assert first.returncode == 0, first.output[-4000:]
            lab["deployed"] = {host["name"]: deployed_facts(host) for host in lab["hosts"]}
            yield lab
        finally:
            run_lab_command("down", lab_dir=lab_dir, check=False)


def running_hosts(lab: dict) -> list[dict]:
    """The lab's hosts as lab.json has them now (a host restarted by an earlier test has a new sshd pid)."""
    return json.loads((Path(lab["lab_dir"]) / "lab.json").read_text())["hosts"]


def state_dir(lab_host: dict) -> Path:
    return Path(lab_host["binds"]["/var/lib/cdna2"])


def hsa(lab_host: dict) -> Path:
    return site_packages(lab_host) / "aiter_meta" / "hsa"


def deployed_facts(lab_host: dict) -> dict:
    """The translated tree's digest and file list, each package's original and patched file hashes, and both texts
    of each file (the pristine one from the backups, the patched one as the deploy left it) for failure reports."""
    state = json.loads((state_dir(lab_host) / "state.json").read_text())
    backups = recorded_patches(lab_host)
    texts = {package: {path: (read_if_file(state_dir(lab_host) / "backups" / package / "originals" / path),
                              read_if_file(site_packages(lab_host) / path)) for path in files}
             for package, files in backups.items()}
    return {"digest": state["kernels"]["digest"], "files": tree_files(hsa(lab_host) / "gfx90a"), "patches": backups,
            "texts": texts}


def recorded_patches(lab_host: dict) -> dict[str, dict]:
    """Per package, each target's original and patched sha256 as the host's patch transactions recorded them."""
    return {package: json.loads((state_dir(lab_host) / "backups" / package / "state.json").read_text())["files"]
            for package in PACKAGES}


def read_if_file(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def patch_status(lab_host: dict, package: str, facts: dict) -> set[str]:
    """For each target file of ``package``: pristine, patched or neither."""
    site = site_packages(lab_host)
    statuses = set()
    for path, hashes in facts["patches"][package].items():
        current = hashlib.sha256((site / path).read_bytes()).hexdigest()
        statuses.add({hashes["original_sha256"]: "pristine", hashes["patched_sha256"]: "patched"}.get(current,
                                                                                                     "neither"))
    return statuses


def uploaded_manifest(lab_host: dict, package: str) -> dict | None:
    """The change manifest a controller uploaded for ``package`` before it ran ``txn apply`` (operations/patches.py);
    None when there is none, or only the start of one (a kill during its upload: apply never ran on it)."""
    try:
        return json.loads((state_dir(lab_host) / "staging" / f"patch-{package}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def transaction_status(lab_host: dict, package: str, facts: dict, manifest: dict | None) -> dict[str, str]:
    """For each target file of ``package``: pristine (its text before any patch, as the first deploy kept it),
    patched (the text the transaction of ``manifest`` writes), left alone (pristine, and ``manifest`` does not
    change it) or neither.

    Patched is what the plan of the run being judged writes, read from the manifest that run uploaded, not what
    the fixture's first deploy wrote: the controller plans from the patch catalog it loads when it starts, and the
    catalog of a checkout can change between the two (an edit to cdna2/data/patchsets/ while the suite runs)."""
    site = site_packages(lab_host)
    pristine = {path: hashes["original_sha256"] for path, hashes in facts["patches"][package].items()}
    patched = {}
    for change in (manifest or {"changes": []})["changes"]:
        # The plan was made from the pristine files (the test reverted them): a file the first deploy did not
        # patch (a target a changed catalog added) is pristine at the hash the plan expected.
        pristine.setdefault(change["path"], change["expected_sha256"])
        patched[change["path"]] = change["new_sha256"]
    statuses = {}
    for path in sorted(pristine):
        current = file_sha256(site / path)
        if path not in patched and manifest is not None:
            statuses[path] = "left alone" if current == pristine[path] else "neither"
        else:
            statuses[path] = ("pristine" if current == pristine[path] else
                              "patched" if current == patched.get(path) else "neither")
    return statuses


def describe_files(lab_host: dict, package: str, facts: dict, statuses: dict[str, str]) -> str:
    """Each file of ``package`` that is neither pristine nor patched: its hash, size, and its diff against the
    pristine text, the text the first deploy patched it to, and the staged text if it is still staged."""
    site = site_packages(lab_host)
    lines = []
    for path, status in statuses.items():
        if status != "neither":
            continue
        current = read_if_file(site / path)
        lines.append(f"{lab_host['name']} {package} {path}: " + (
            "absent" if current is None else
            f"sha256 {hashlib.sha256(current).hexdigest()}, {len(current)} bytes"))
        original, patched = facts["texts"][package].get(path, (None, None))
        others = {"pristine": original, "patched by the fixture's deploy": patched,
                  **{f"staged ({staged.name})": read_if_file(staged) for staged in site.glob(f"{path}.cdna2-staged*")}}
        for label, text in others.items():
            if text is None:
                lines.append(f"  (no {label} text to compare with)")
                continue
            diff = list(difflib.unified_diff(text.decode(errors="replace").splitlines(),
                                             (current or b"").decode(errors="replace").splitlines(),
                                             f"{path} ({label})", f"{path} (on the host)", lineterm="", n=1))
            lines.append(f"  against the {label} text: {len(diff)} diff lines" + ("" if diff else " (identical)"))
            lines.extend(f"    {line}" for line in diff[:80])
    return "\n".join(lines)


def rollback(report_dir: Path) -> None:
    result = run_pyinfra("-y", "rollback.py", report_dir=report_dir)
    assert result.returncode == 0, result.output[-4000:]


def upload_blocked(lab_host: dict) -> bool:
    """Whether a process of the host's SSH sessions (its SFTP server) is blocked opening a FIFO for writing: the
    upload has started and cannot finish."""
    for pid in descendants(lab_host["pid"]):
        try:
            if Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner":
                return True
        except (FileNotFoundError, ProcessLookupError):
            continue
    return False


def test_host_dying_during_the_kernel_upload(fault_lab: dict, tmp_path: Path) -> None:
    victim, survivor = running_hosts(fault_lab)
    expected = fault_lab["deployed"][victim["name"]]
    rollback(tmp_path)
    # An old tree for the swap to replace; afterwards AITER must only ever see it or the new one, whole.
    old_tree = hsa(victim) / "gfx90a"
    (old_tree / "fam").mkdir(parents=True)
    (old_tree / "fam" / "old.co").write_bytes(b"the previous tree's kernel")
    old_files = tree_files(old_tree)
    # The fault: the upload's target is a FIFO no one reads, so the host's SFTP server blocks inside the upload
    # until the host is stopped (deterministic, where a 1 MB upload over loopback is over in milliseconds).
    staging = state_dir(victim) / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    upload_name = f"gfx90a-{expected['digest'][:16]}.tar.gz"
    os.mkfifo(staging / upload_name)

    watcher = TreeWatcher(old_tree)
    watcher.start()
    run = Controller("-y", "deploy.py", report_dir=tmp_path)
    run.wait_until(lambda: upload_blocked(victim), "kernel upload")
    assert stop_host(victim).startswith("stopped"), "the host dies mid-upload"
    assert run.finish() != 0
    report = json.loads((tmp_path / "latest.json").read_text())
    (tmp_path / "latest.json").unlink()
    rows = {row["host"]: row for row in report["hosts"]}
    assert rows[victim["name"]]["status"] == "failed", rows[victim["name"]]
    assert rows[survivor["name"]]["status"] == "ok", run.output()[-4000:]
    assert tree_files(hsa(survivor) / "gfx90a") == expected["files"]
    assert tree_files(old_tree) == old_files, "the dead host kept its old tree"

    # The host comes back (its state and files as it left them); the injected FIFO is the fault, not host state.
    (staging / upload_name).unlink()
    run_lab_command("up", "2", lab_dir=Path(fault_lab["lab_dir"]))
    victim = next(h for h in json.loads((Path(fault_lab["lab_dir"]) / "lab.json").read_text())["hosts"]
                  if h["name"] == victim["name"])
    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    seen = watcher.stop()
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert tree_files(old_tree) == expected["files"]
    assert seen <= {old_files, expected["files"]}, f"AITER saw a tree that was neither: {len(seen)} variants"
    assert old_files in seen and expected["files"] in seen and watcher.samples > 100
    assert tree_digest(old_tree) == expected["digest"]


def deploy_on_small_staging(lab: dict, victim: dict, tmpfs_options: str, check_command: str, report_dir: Path):
    """Deploy while the victim's ``<state_dir>/staging`` is a tmpfs mounted with ``tmpfs_options``, inside the host's
    own mount namespace (a mount made on the controller does not reach it: private propagation). Returns the output
    of ``check_command`` run there first, the run, the victim's snapshots before and after, and what staging held."""
    (state_dir(victim) / "staging").mkdir(parents=True, exist_ok=True)
    mount = ["nsenter", "-t", str(victim["pid"]), "-m"]
    subprocess.run([*mount, "mount", "-t", "tmpfs", "-o", tmpfs_options, "tmpfs", "/var/lib/cdna2/staging"],
                   check=True)
    try:
        checked = ssh(lab, victim, check_command).stdout
        before = host_snapshot(victim)
        run = run_pyinfra("-y", "deploy.py", report_dir=report_dir)
        after = host_snapshot(victim)
        leftovers = ssh(lab, victim, "ls -A /var/lib/cdna2/staging").stdout.split()
    finally:
        subprocess.run([*mount, "umount", "/var/lib/cdna2/staging"], check=True)
    return checked, run, before, after, leftovers


def test_full_disk_in_staging_fails_cleanly_and_keeps_the_old_state(fault_lab: dict, tmp_path: Path) -> None:
    victim, survivor = running_hosts(fault_lab)
    rollback(tmp_path)
    checked, run, before, after, leftovers = deploy_on_small_staging(
        fault_lab, victim, "size=64k", "df --output=size /var/lib/cdna2/staging", tmp_path)
    assert checked.split()[-1] == "64"
    assert run.returncode != 0
    row = run.row(victim["name"])
    # The probe measured the free space: the host is refused before anything is uploaded, with the sizes.
    assert row["status"] == "failed" and row["steps"]["preflight"]["status"] == "failed", row
    assert "bytes free for <state_dir>/staging, the kernel archive needs" in row["steps"]["preflight"]["detail"]
    assert leftovers == [], "nothing was uploaded into the full staging area"
    assert run.row(survivor["name"])["status"] == "ok"
    assert {key: after[key] for key in ("hsa", "aiter", "dist-info")} == \
        {key: before[key] for key in ("hsa", "aiter", "dist-info")}, "nothing outside staging changed"
    assert not (hsa(victim) / "gfx90a").exists()
    assert all(patch_status(victim, package, fault_lab["deployed"][victim["name"]]) == {"pristine"}
               for package in PACKAGES), "the later steps did not run on the failed host"
    assert not any(name.startswith(".gfx90a.staging") for name in os.listdir(hsa(victim)))

    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert tree_digest(hsa(victim) / "gfx90a") == fault_lab["deployed"][victim["name"]]["digest"]


def test_disk_full_during_the_upload_names_the_place_and_removes_the_partial_archive(fault_lab: dict,
                                                                                        tmp_path: Path) -> None:
    victim, survivor = running_hosts(fault_lab)
    rollback(tmp_path)
    # A tmpfs with megabytes free but no inode left: the probe sees room for the archive (bytes), the upload itself
    # then fails with ENOSPC when it creates the file.
    checked, run, before, after, leftovers = deploy_on_small_staging(
        fault_lab, victim, "size=4m,nr_inodes=2",
        "touch /var/lib/cdna2/staging/filler && stat -f -c %d /var/lib/cdna2/staging", tmp_path)
    assert checked.split() == ["0"], "no inode left"
    assert run.returncode != 0
    row = run.row(victim["name"])
    assert row["status"] == "failed" and row["steps"]["kernels"]["status"] == "failed", row
    detail = row["steps"]["kernels"]["detail"]
    assert detail.startswith(f"no space left on /var/lib/cdna2/staging on {victim['name']}: the kernel archive "
                             f"needs "), detail
    assert "bytes and 0 inodes are free now" in detail and "was removed and nothing else changed" in detail
    assert f"{victim['name']}: no space left on /var/lib/cdna2/staging" in run.output
    assert leftovers == ["filler"], "no partial archive is left"
    assert run.row(survivor["name"])["status"] == "ok"
    assert {key: after[key] for key in ("hsa", "aiter", "dist-info")} == \
        {key: before[key] for key in ("hsa", "aiter", "dist-info")}, "nothing outside staging changed"
    assert all(patch_status(victim, package, fault_lab["deployed"][victim["name"]]) == {"pristine"}
               for package in PACKAGES), "the later steps did not run on the failed host"

    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert tree_digest(hsa(victim) / "gfx90a") == fault_lab["deployed"][victim["name"]]["digest"]
    verified = run_pyinfra("-y", "verify.py", report_dir=tmp_path)
    assert verified.returncode == 0, verified.output[-4000:]


def revert_patches(lab: dict, lab_host: dict) -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    for package in PACKAGES:
        result = ssh(lab, lab_host, f"PYTHONPATH=/var/lib/cdna2/agent /opt/venv/bin/python -B -m cdna2.host.txn "
                                    f"revert --backup-dir /var/lib/cdna2/backups/{package} --root {site}")
        assert result.returncode == 0, result.stdout + result.stderr


def test_controller_killed_during_patching_leaves_every_package_whole(fault_lab: dict, tmp_path: Path) -> None:
    hosts = running_hosts(fault_lab)
    seed = int(os.environ.get("CDNA2_FAULT_SEED") or time.time())
    chooser = random.Random(seed)
    print(f"kill points from seed {seed} (CDNA2_FAULT_SEED={seed} repeats them)")
    deploy = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)  # a clean start, whatever the tests before did
    assert deploy.returncode == 0, deploy.output[-4000:]
    outcomes = []
    for attempt in range(3):
        for lab_host in hosts:
            revert_patches(fault_lab, lab_host)
            for package in PACKAGES:  # the manifest found after the kill is then this attempt's, or there is none
                (state_dir(lab_host) / "staging" / f"patch-{package}.json").unlink(missing_ok=True)
        run = Controller("-y", "deploy.py", report_dir=tmp_path)
        run.wait_until(lambda: "Starting operation: patches" in run.output(), "patching")
        delay = chooser.uniform(0.0, 1.5)
        time.sleep(delay)
        run.process.send_signal(signal.SIGKILL)
        run.finish()
        for lab_host in hosts:
            wait_sessions_gone(lab_host)
            facts = fault_lab["deployed"][lab_host["name"]]
            statuses = {package: transaction_status(lab_host, package, facts, uploaded_manifest(lab_host, package))
                        for package in PACKAGES}
            found = {package: set(files.values()) - {"left alone"} for package, files in statuses.items()}
            outcomes.append((attempt, round(delay, 2), lab_host["name"], found))
            broken = [package for package, seen in found.items() if len(seen) != 1 or seen == {"neither"}]
            assert not broken, (
                f"attempt {attempt}, killed {delay:.2f} s into patching: {lab_host['name']} half-patched: {found}\n"
                + "\n".join(f"{package}: {statuses[package]}\n"
                            f"{describe_files(lab_host, package, facts, statuses[package])}" for package in broken))
            # The transaction on the host does not depend on the controller's connection: it ran to its end.
            assert not any((state_dir(lab_host) / "backups" / package / "journal.json").exists()
                           for package in PACKAGES), f"attempt {attempt}: {lab_host['name']} kept a journal"
    print("\n".join(map(str, outcomes)))
    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert rerun.returncode == 0, rerun.output[-4000:]
    for lab_host in hosts:
        # As the transactions recorded them: this test's runs may plan from another catalog than the fixture's.
        recorded = recorded_patches(lab_host)
        assert all(patch_status(lab_host, package, {"patches": recorded}) == {"patched"} for package in PACKAGES), \
            f"{lab_host['name']}: {recorded}"
    verified = run_pyinfra("-y", "verify.py", report_dir=tmp_path)  # and the current catalog's plan agrees
    assert verified.returncode == 0, verified.output[-4000:]


def pip_processes(lab_host: dict) -> list[int]:
    """The host's pip processes (below its sshd: the deploy's sessions)."""
    found = []
    for pid in descendants(lab_host["pid"]):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pip" in words and b"install" in words:
            found.append(pid)
    return found


def triton_left(lab_host: dict) -> list[str]:
    """What pip left of triton: each dist-info, and whether it has its RECORD."""
    return sorted(f"{path.name}{'' if (path / 'RECORD').exists() else ' (no RECORD)'}"
                  for path in site_packages(lab_host).glob("triton-*.dist-info"))


@pytest.mark.parametrize("killed", ["host pip", "controller"])
def test_killed_while_the_wheels_step_replaces_triton_then_a_rerun_repairs(fault_lab: dict, tmp_path: Path,
                                                                          killed: str) -> None:
    victim = running_hosts(fault_lab)[0]
    seed = int(os.environ.get("CDNA2_FAULT_SEED") or time.time())
    delay = random.Random(seed).uniform(0.3, 4.0)  # pip took 5-9 s to replace triton here, and under 4 s at times
    wheels = Path(fault_lab["lab_dir"]) / "mirror" / "wheels"
    for _ in range(4):
        print(f"{killed} killed {delay:.2f} s into pip (seed {seed}; CDNA2_FAULT_SEED={seed} repeats it)")
        # triton 3.7.0 back, from the lab's mirror (a rollback restores the baseline, which earlier tests may have
        # moved, and so does a run that ended before the kill).
        restored = ssh(fault_lab, victim, f"/opt/venv/bin/python -m pip install -q --no-deps --no-index "
                                          f"--find-links {wheels} triton==3.7.0")
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert triton_left(victim) == ["triton-3.7.0.dist-info"], "the deploy has triton 3.7.0 to replace"

        run = Controller("-y", "deploy.py", report_dir=tmp_path)
        run.wait_until(lambda: pip_processes(victim), "pip replacing triton")
        time.sleep(delay)  # pip removes 3.7.0's files, then writes 3.7.1's, RECORD last
        running = pip_processes(victim)
        if running:
            break
        # pip was quicker than the delay drawn: no fault was injected, so the same point is tried sooner.
        assert run.finish() == 0, "the run that pip finished undisturbed"
        for lab_host in running_hosts(fault_lab):
            wait_sessions_gone(lab_host)
        delay /= 2
    else:
        pytest.fail(f"pip finished within {delay * 2:.2f} s four times: no fault injected (seed {seed})")
    if killed == "host pip":
        for pid in running:
            os.kill(pid, signal.SIGKILL)
    else:
        run.process.send_signal(signal.SIGKILL)
    assert run.finish() != 0
    for lab_host in running_hosts(fault_lab):
        wait_sessions_gone(lab_host)
    print(f"after the kill: {triton_left(victim)}")

    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert triton_left(victim) == ["triton-3.7.1.dist-info"], "one whole triton 3.7.1"
    assert rerun.row(victim["name"])["steps"]["smoke"]["status"] == "ok", rerun.row(victim["name"])["steps"]
    verified = run_pyinfra("-y", "verify.py", report_dir=tmp_path)
    assert verified.returncode == 0, verified.output[-4000:]


def release_fifo(fifo: Path) -> None:
    """Let a writer blocked opening ``fifo`` through (it then dies of SIGPIPE), and remove the FIFO."""
    descriptor = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    time.sleep(0.5)
    os.close(descriptor)
    fifo.unlink()


def test_second_controller_is_refused_while_the_first_runs(fault_lab: dict, tmp_path: Path) -> None:
    victim = running_hosts(fault_lab)[0]
    expected = fault_lab["deployed"][victim["name"]]
    rollback(tmp_path)
    # Hold the first controller inside its kernel upload (a FIFO no one reads), with the host's run lease taken.
    staging = state_dir(victim) / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    upload_name = f"gfx90a-{expected['digest'][:16]}.tar.gz"
    os.mkfifo(staging / upload_name)
    first = Controller("-y", "deploy.py", "--limit", victim["name"], report_dir=tmp_path / "first")
    try:
        first.wait_until(lambda: upload_blocked(victim), "kernel upload")
        before = host_snapshot(victim)
        second = run_pyinfra("-y", "deploy.py", "--limit", victim["name"], report_dir=tmp_path / "second")
        assert second.returncode != 0
        assert f"is being provisioned by root@{os.uname().nodename} pid {first.process.pid}" in second.output
        assert "wait for that run to finish" in second.output
        assert second.row(victim["name"])["status"] == "failed"
        assert host_snapshot(victim) == before, "the second controller changed nothing"
    finally:
        first.process.send_signal(signal.SIGKILL)  # the first controller dies: its lease ends with its connection
        first.finish()
        release_fifo(staging / upload_name)
    wait_sessions_gone(victim)
    rerun = run_pyinfra("-y", "deploy.py", report_dir=tmp_path / "second")
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert tree_digest(hsa(victim) / "gfx90a") == expected["digest"]


@contextmanager
def gpu_driver_not_loaded(lab_host: dict, pci_devices: dict[str, str] | None = None) -> Iterator[None]:
    """The host's rocminfo fails as the real one does when the amdgpu driver did not load (the lab has no KFD); with
    `pci_devices` ({address: device id}), AMD display controllers of those ids show on its PCI bus (a directory
    mounted over /sys/bus/pci/devices inside the host's mount namespace)."""
    rocminfo = Path(lab_host["binds"]["/opt/rocm"]) / "bin" / "rocminfo"
    working = rocminfo.read_bytes()
    mount = ["nsenter", "-t", str(lab_host["pid"]), "-m"]
    # Outside the host's binds (its /tmp is its own), so the host sees it at the same path.
    devices = Path(lab_host["binds"]["/opt/rocm"]).with_name(f"pci-{uuid.uuid4().hex[:8]}")
    mounted = False
    try:
        rocminfo.write_text("#!/bin/sh\necho 'hsa api call failure at: rocminfo.cc:1306' >&2\nexit 1\n")
        for address, device in (pci_devices or {}).items():
            (devices / address).mkdir(parents=True)
            for name, value in (("vendor", "0x1002"), ("device", device), ("class", "0x038000")):
                (devices / address / name).write_text(f"{value}\n")
        if pci_devices:
            subprocess.run([*mount, "mount", "--bind", str(devices), "/sys/bus/pci/devices"], check=True)
            mounted = True
        yield
    finally:
        if mounted:
            subprocess.run([*mount, "umount", "/sys/bus/pci/devices"], check=True)
        rocminfo.write_bytes(working)
        shutil.rmtree(devices, ignore_errors=True)


def test_a_host_whose_gpu_does_not_show_is_refused_though_its_data_names_the_arch(fault_lab: dict,
                                                                                   tmp_path: Path) -> None:
    # gpu_arch stands in for a GPU only on container targets: on an SSH host, provisioning from the data's arch
    # would report every GPU check of a broken GPU as skipped.
    victim = running_hosts(fault_lab)[0]
    before = host_snapshot(victim)
    with gpu_driver_not_loaded(victim):
        run = run_pyinfra("-y", "deploy.py", "--limit", victim["name"], "--data", "gpu_arch=gfx90a",
                          report_dir=tmp_path)
    assert run.returncode != 0
    row = run.row(victim["name"])
    assert row["status"] == "failed" and "smoke" not in row["steps"], row
    detail = row["steps"]["preflight"]["detail"]
    assert detail.startswith("the probe found no GPU (rocminfo, KFD topology), yet the host data sets gpu_arch "
                             "gfx90a") and detail.endswith("remove gpu_arch from this host's data"), detail
    assert f"{victim['name']}: the probe found no GPU" in run.output
    assert host_snapshot(victim) == before, "the refused host changed"


def test_gfx90a_gpus_on_the_pci_bus_without_an_agent_fail_the_host_instead_of_leaving_it_alone(
        fault_lab: dict, tmp_path: Path) -> None:
    victim = running_hosts(fault_lab)[0]
    before = host_snapshot(victim)
    with gpu_driver_not_loaded(victim, {"0000:87:00.0": "0x740f", "0000:c3:00.0": "0x740f"}):
        listed = ssh(fault_lab, victim, "cat /sys/bus/pci/devices/0000:87:00.0/device").stdout.strip()
        run = run_pyinfra("-y", "deploy.py", "--limit", victim["name"], report_dir=tmp_path)
    assert listed == "0x740f", "the host sees the PCI devices mounted in its namespace"
    assert run.returncode != 0
    row = run.row(victim["name"])
    assert row["status"] == "failed" and "smoke" not in row["steps"], row
    assert row["steps"]["preflight"]["detail"] == (
        "2 gfx90a GPUs on the PCI bus (0000:87:00.0 [1002:740f], 0000:c3:00.0 [1002:740f]), yet neither rocminfo "
        "nor the KFD topology lists a GPU agent (/opt/rocm/bin/rocminfo exited 1: hsa api call failure at: "
        "rocminfo.cc:1306): the amdgpu driver is not loaded or /dev/kfd is not open to this login. Fix that (dmesg "
        "| grep amdgpu; ls -l /dev/kfd), then run the deploy again")
    assert "1 failed" in run.report["summary"]["text"] and "left alone" not in run.report["summary"]["text"]
    assert host_snapshot(victim) == before, "the refused host changed"


def test_verify_reports_a_deployed_host_whose_gfx90a_gpus_no_longer_show(fault_lab: dict, tmp_path: Path) -> None:
    victim = running_hosts(fault_lab)[0]
    clean = run_pyinfra("-y", "verify.py", "--limit", victim["name"], report_dir=tmp_path)
    assert clean.returncode == 0, clean.output[-4000:]  # as deployed: what follows is the GPU's doing alone
    with gpu_driver_not_loaded(victim, {"0000:87:00.0": "0x740f"}):
        run = run_pyinfra("-y", "verify.py", "--limit", victim["name"], report_dir=tmp_path)
    assert run.returncode != 0
    verify = run.row(victim["name"])["steps"]["verify"]
    assert verify["status"] == "failed", verify
    assert "1 gfx90a GPU on the PCI bus (0000:87:00.0 [1002:740f]), yet neither rocminfo nor the KFD topology " \
           "lists a GPU agent" in verify["detail"], verify["detail"]


def test_a_package_whose_patches_cannot_be_planned_fails_the_host_before_anything_changes(fault_lab: dict,
                                                                                          tmp_path: Path) -> None:
    # A vLLM file edited outside the patch sites refuses the vLLM plan; the host is failed in its preflight, with
    # the file and the fix, and keeps what it had: no translated kernels are uploaded and AITER stays pristine.
    victim = running_hosts(fault_lab)[0]
    rolled_back = run_pyinfra("-y", "rollback.py", "--limit", victim["name"], report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    edited = site_packages(victim) / "vllm/_aiter_ops.py"  # vllm-attention-gate changes it in every variant
    pristine = edited.read_bytes()
    edited.write_bytes(pristine + b"\n# a local edit\n")
    try:
        before = host_snapshot(victim)
        run = run_pyinfra("-y", "deploy.py", "--limit", victim["name"], report_dir=tmp_path)
        row = run.row(victim["name"])
        assert run.returncode != 0 and "preflight" in row["steps"], row
        detail = row["steps"]["preflight"]["detail"]
        assert row["status"] == "failed" and "kernels" not in row["steps"], row
        assert detail.startswith("patches vllm: vllm/_aiter_ops.py: edited outside our patch sites"), detail
        assert "reinstall the package or restore the file" in detail
        assert host_snapshot(victim) == before, "the refused host changed"
    finally:
        edited.write_bytes(pristine)
    redeployed = run_pyinfra("-y", "deploy.py", "--limit", victim["name"], report_dir=tmp_path)
    assert redeployed.returncode == 0, redeployed.output[-4000:]

"""The cluster report, step decisions from a probe, deterministic archives and the host lock."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import multiprocessing
import time
from pathlib import Path

import pytest

from cdna2.archive import tree_archive
from cdna2.host.state import HostLockedError, host_lock, read_state, update_state
from cdna2.plan import (FAIL, PROCEED, SKIP, arch_skip_reason, disk_space_problem, hidden_gpu_refusal,
                        kernels_decision, target_env_error, upload_space_problem)
from cdna2.reports.run import CHANGED, FAILED, SKIPPED, UNCHANGED, RunReport, summarise_probe
from cdna2.rollback import plan_rollback
from lab.kinds import plan_hosts

MI210 = {"arch": "gfx90a", "marketing_name": "AMD Instinct MI210", "compute_units": 104, "chip_id": "0x740f"}
MI300X = {"arch": "gfx942", "marketing_name": "AMD Instinct MI300X", "compute_units": 304, "chip_id": "0x74a1"}


def probe_of(agents: list[dict]) -> dict:
    arches = sorted({agent["arch"] for agent in agents})
    probe = {
        "os": {"hostname": "node01"},
        "python": {"path": "/opt/venv/bin/python", "target": "/opt/venv/bin/python", "version": "3.11.7",
                   "is_target": True},
        "rocm": {"version": "6.4.3", "source": "/opt/rocm/.info/version"},
        "gpu": {"agents": agents, "arches": arches, "arch": arches[0] if len(arches) == 1 else None,
                "pci_without_agent": []},
        "distributions": {"amd-aiter": {"version": "0.1.7.post2.dev18", "location": "/opt/venv/site"}, "torch": None,
                          "triton": {"version": "3.7.0"}, "vllm": None},
        "aiter": {"hsa_root": "/x/aiter_meta/hsa", "gfx942_record_digest": "ab" * 32, "gfx942_record_files": 1326,
                  "gfx942_on_disk": True, "gfx90a_digest": None},
        "errors": [],
    }
    return probe


def test_gfx90a_host_proceeds_and_others_are_left_alone_with_reason() -> None:
    assert kernels_decision(probe_of([MI210, MI210]), True)[0] == PROCEED
    decision, why = kernels_decision(probe_of([MI300X]), True)
    assert decision == SKIP and "gfx942 (AMD Instinct MI300X)" in why and "left alone" in why
    assert "mixed GPU arches gfx90a, gfx942" in arch_skip_reason(probe_of([MI210, MI300X]))
    assert "no GPU agent" in arch_skip_reason(probe_of([]))
    assert kernels_decision(probe_of([MI210]), False) == (SKIP, "translate_kernels is off for this host")


def test_gfx90a_gpus_on_the_pci_bus_without_an_agent_refuse_the_host_but_not_a_container() -> None:
    probe = probe_of([])
    assert hidden_gpu_refusal(probe, container=False) is None  # no GPU at all: left alone, as before
    probe["gpu"]["pci_without_agent"] = [{"address": "0000:05:00.0", "device": "0x74a1", "class": "0x120000"}]
    assert hidden_gpu_refusal(probe, container=False) is None  # not a gfx90a part: this tool leaves it alone
    probe["gpu"]["pci_without_agent"] += [{"address": f"0000:{bus}:00.0", "device": "0x740f", "class": "0x038000"}
                                          for bus in ("87", "c3")]
    probe["errors"] = ["/opt/rocm/bin/rocminfo exited 1: hsa api call failure at: rocminfo.cc:1306"]
    assert hidden_gpu_refusal(probe, container=False) == (
        "2 gfx90a GPUs on the PCI bus (0000:87:00.0 [1002:740f], 0000:c3:00.0 [1002:740f]), yet neither rocminfo nor "
        "the KFD topology lists a GPU agent (/opt/rocm/bin/rocminfo exited 1: hsa api call failure at: "
        "rocminfo.cc:1306): the amdgpu driver is not loaded or /dev/kfd is not open to this login. Fix that (dmesg | "
        "grep amdgpu; ls -l /dev/kfd), then run the deploy again")
    assert hidden_gpu_refusal(probe, container=True) is None  # an image is built without /dev/kfd


def test_kernels_fail_without_aiter_or_with_missing_tree() -> None:
    decision, why = kernels_decision(_without_aiter(probe_of([MI210])), True)
    assert decision == FAIL and "amd-aiter is not installed" in why
    # Unless this run's wheels step installs it (an image without AITER): translated on the next run.
    assert kernels_decision(_without_aiter(probe_of([MI210])), True, installs_aiter=True)[0] == PROCEED
    probe = probe_of([MI210])
    probe["aiter"]["gfx942_on_disk"] = False
    decision, why = kernels_decision(probe, True)
    assert decision == FAIL and "reinstall amd-aiter" in why


def _without_aiter(probe: dict) -> dict:
    probe = copy.deepcopy(probe)
    probe["distributions"]["amd-aiter"] = None
    return probe


def test_missing_target_env_is_an_error_naming_the_key() -> None:
    probe = probe_of([MI210])
    assert target_env_error(probe) is None
    probe["python"]["is_target"] = False
    assert "`target_python`" in target_env_error(probe)


def test_report_rows_json_and_markdown(tmp_path: Path) -> None:
    report = RunReport(mode="deploy", inventory="inventory/sim.py")
    summarise_probe(report.host("mi210-a"), probe_of([MI210, MI210]))
    report.step("mi210-a", "kernels", "changed", "112 kernels")
    report.host("mi210-a").changes.append("kernels: hsa/gfx90a holds the translated tree")
    summarise_probe(report.host("mi300x-c"), probe_of([MI300X]))
    report.host("mi300x-c").left_alone = arch_skip_reason(probe_of([MI300X]))
    report.step("mi300x-c", "kernels", "skipped", "GPU arch gfx942 | MI300X")
    report.host("dead").connected = False
    json_path, markdown_path = report.write(tmp_path)
    written = json.loads(json_path.read_text())
    assert written["failed_hosts"] == ["dead"]
    assert [(row["host"], row["status"], row["outcome"]) for row in written["hosts"]] == [
        ("dead", FAILED, FAILED), ("mi210-a", "ok", "provisioned"), ("mi300x-c", "ok", "left alone")], \
        "rows by host name, not by when a host was seen"
    assert written["hosts"][1]["gpus"] == ["AMD Instinct MI210 (104 CU, 0x740f)"] * 2
    assert written["summary"]["text"] == "3 hosts: 1 gfx90a provisioned, 1 left alone (gfx942), 1 failed"
    markdown = markdown_path.read_text()
    assert "| mi210-a | ok | gfx90a | 6.4.3 | B | changed | 1 |" in markdown
    assert "- B (2 hosts): amd-aiter 0.1.7.post2.dev18, torch -, triton 3.7.0, vllm -" in markdown
    assert "\n- GPU arch gfx942 | MI300X: kernels on mi300x-c\n" in markdown, "skip reasons are grouped, by host"
    assert "| mi300x-c | ok | gfx942 | 6.4.3 | B | skipped | 0 |" in markdown
    assert "- kernels changed: 112 kernels" in markdown
    assert (tmp_path / "latest.md").read_text() == markdown
    hosts_file = markdown_path.with_name(markdown_path.stem + "-hosts.md")
    assert f"- every host, one row each: {hosts_file.name}\n" in markdown
    assert hosts_file.read_text() == (tmp_path / "latest-hosts.md").read_text() == report.to_markdown(per_host=True)


def _cluster_report(mode: str = "deploy", noop: bool = False) -> RunReport:
    """A deploy of the 16-host lab as the deploy reports it: 11 gfx90a hosts, 5 gfx942 ones, one gfx90a failing."""
    report = RunReport(mode=mode, inventory="inventory/sim.py")
    for planned in plan_hosts(16, "127.0.10"):
        name, mi210 = planned.name, planned.kind.gpu.arch == "gfx90a"
        probe = probe_of([MI210, MI210] if mi210 else [MI300X] * 8)
        probe["rocm"]["version"] = planned.kind.rocm_version
        vllm = [package.partition("==")[2] for package in planned.kind.extra_packages if package.startswith("vllm")]
        probe["distributions"]["vllm"] = {"version": vllm[0]} if vllm else None
        row = report.host(name)
        summarise_probe(row, probe)
        row.left_alone = arch_skip_reason(probe)
        if name == "mi210-g":
            report.step(name, "preflight", FAILED, "ROCm 6.1.0 is not in the wheel matrix: add it or pin the wheels")
            continue
        done = UNCHANGED if noop else CHANGED
        report.step(name, "wheels", done, "triton==3.7.1")
        row.package_changes([] if noop else ["triton==3.7.1"])
        for step in ("kernels", "patches amd-aiter", "patches vllm", "fp8 configs", "smoke"):
            report.step(name, step, done if mi210 else SKIPPED, "as planned" if mi210 else row.left_alone)
        if not noop:
            row.changes += ["agent: host-side modules are current", "wheels: ROCm-matched wheels, triton 3.7.1 last"]
    return report


def test_a_16_host_report_fits_one_screen_and_starts_with_the_cluster_summary() -> None:
    report = _cluster_report()
    markdown = report.to_markdown()
    lines = markdown.splitlines()
    assert lines[2] == "**16 hosts: 10 gfx90a provisioned, 5 left alone (gfx942), 1 failed**"
    assert lines[4:8] == ["- status: 15 ok, 1 failed", "- role: 16 own environment", "- wheels: 15 changed, 1 not run",
                          "- kernels, patches amd-aiter, patches vllm, fp8 configs, smoke: 10 changed, 5 skipped, "
                          "1 not run"]
    # One row per kind of host: the lab's two gfx90a kinds, the failing host, the gfx942 kind.
    table = [line for line in lines if line.startswith("|")]
    assert table[2:] == [
        "| mi210-a,mi210-d,mi210-j,mi210-m,mi210-p (5) | ok | gfx90a | 6.4.3 | A | changed | changed | changed | "
        "changed | changed | changed | 2 |",
        "| mi210-b,mi210-e,mi210-h,mi210-k,mi210-n (5) | ok | gfx90a | 7.14.0 | B | changed | changed | changed | "
        "changed | changed | changed | 2 |",
        "| mi210-g | failed | gfx90a | 6.4.3 | C | - | - | - | - | - | - | 0 |",
        "| mi300x-c,mi300x-f,mi300x-i,mi300x-l,mi300x-o (5) | ok | gfx942 | 7.14.0 | D | changed | skipped | skipped | "
        "skipped | skipped | skipped | 2 |"]
    per_host = [line for line in report.to_markdown(per_host=True).splitlines() if line.startswith("|")]
    assert len(per_host) == 2 + 16
    assert max(len(line) for line in per_host) <= 120, max(per_host, key=len)
    assert "| mi300x-c | ok | gfx942 | 7.14.0 | D | changed | skipped | skipped | skipped | skipped | skipped | 2 |" \
        in per_host
    # The left-alone reason once, for all five hosts; the failure under its host.
    assert markdown.count("AITER has native kernels for it") == 1
    assert "kernels, patches amd-aiter, patches vllm, fp8 configs, smoke on mi300x-c,mi300x-f,mi300x-i,mi300x-l," \
        "mi300x-o (5)\n" in markdown
    assert "### mi210-g: failed\n\n- preflight failed: ROCm 6.1.0 is not in the wheel matrix" in markdown
    assert "### mi300x-c,mi300x-f,mi300x-i,mi300x-l,mi300x-o (5): left alone\n\n- wheels changed" in markdown
    # The ten provisioned hosts by the six they leave out, the shorter list.
    assert "### all but mi210-g,mi300x-c,mi300x-f,mi300x-i,mi300x-l,mi300x-o (10): provisioned\n" in markdown
    summary = report.to_json()["summary"]
    step_counts = {"changed": 10, "skipped": 5, "not run": 1}
    assert summary == {"hosts": 16, "failed": 1, "text": lines[2].strip("*"), "outcomes": {
        "provisioned": {"gfx90a": 10}, "left alone": {"gfx942": 5}, "failed": {"gfx90a": 1}},
        "statuses": {"ok": 15, "failed": 1}, "roles": {"own environment": 16}, "transport": None,
        "steps": {"wheels": {"changed": 15, "not run": 1}, **dict.fromkeys(
            ["kernels", "patches amd-aiter", "patches vllm", "fp8 configs", "smoke"], step_counts)}}


def test_a_no_op_report_has_detail_only_for_what_failed() -> None:
    markdown = _cluster_report(noop=True).to_markdown()
    details = markdown.partition("## Hosts where something happened or failed")[2]
    assert details.count("### ") == 1 and "### mi210-g: failed" in details, details
    assert "| mi210-a,mi210-d,mi210-j,mi210-m,mi210-p (5) | ok | gfx90a | 6.4.3 | A | unchanged | unchanged | " \
        "unchanged | unchanged | unchanged | unchanged | 0 |" in markdown


def test_summary_words_follow_the_mode_and_the_dry_run() -> None:
    verify = _cluster_report(mode="verify", noop=True)
    for row in verify.rows.values():
        row.left_alone = None  # verify and rollback check every host; only the deploy leaves hosts alone
    assert verify.summary()["text"] == "16 hosts: 10 gfx90a, 5 gfx942 as deployed, 1 failed"
    dry = _cluster_report()
    dry.executed = False
    assert dry.summary()["text"].startswith("16 hosts: 10 gfx90a to be provisioned, 5 left alone (gfx942)")


def test_tree_archive_is_deterministic(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.co").write_bytes(b"a")
    (tree / "run.sh").write_bytes(b"#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    first = hashlib.sha256(tree_archive(tree, tmp_path / "1.tar.gz").read_bytes()).hexdigest()
    time.sleep(1.1)
    (tree / "sub" / "a.co").touch()  # a new mtime must not change the archive
    second = hashlib.sha256(tree_archive(tree, tmp_path / "2.tar.gz").read_bytes()).hexdigest()
    assert first == second


def test_tree_archive_cut_short_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.co").write_bytes(b"a" * 4096)
    out = tmp_path / "out"

    def full_disk(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gzip.GzipFile, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        tree_archive(tree, out / "tree.tar.gz")
    assert list(out.iterdir()) == []


def _hold_lock(state_dir: str, ready, release) -> None:
    with host_lock(Path(state_dir)):
        ready.set()
        release.wait(10)


def test_host_lock_refuses_a_second_holder_and_names_the_first(tmp_path: Path) -> None:
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(HostLockedError, match=rf"held by pid {holder.pid} since"):
            with host_lock(tmp_path, wait_seconds=0.3):
                pass
    finally:
        release.set()
        holder.join(10)
    with host_lock(tmp_path):
        update_state(tmp_path, "kernels", {"digest": "d"})
    assert read_state(tmp_path)["kernels"] == {"digest": "d"}


def _rollback_probe(baseline_triton: str | None, triton_now: str) -> dict:
    probe = probe_of([MI210])
    probe["distributions"]["triton"] = {"version": triton_now}
    probe["aiter"]["gfx90a_previous"] = False
    probe["backups"] = {}
    probe["state"] = {"baseline": {"triton": baseline_triton}} if baseline_triton else None
    return probe


def test_rollback_plans_triton_restore_only_from_a_recorded_baseline() -> None:
    assert plan_rollback(_rollback_probe("3.7.0", "3.7.1"), True, True, []).restore_triton == "3.7.0"
    assert plan_rollback(_rollback_probe("3.7.1", "3.7.1"), True, True, []).restore_triton is None
    assert plan_rollback(_rollback_probe("3.7.0", "3.7.1"), True, False, []).restore_triton is None
    deployed_without_baseline = plan_rollback(_rollback_probe(None, "3.7.1"), True, True, [])
    assert deployed_without_baseline.problems and "records no pre-deploy triton" in deployed_without_baseline.problems[0]
    never_deployed = plan_rollback(_rollback_probe(None, "3.7.1"), False, True, [])
    assert never_deployed.empty and not never_deployed.problems


def test_rollback_plan_for_a_half_provisioned_host() -> None:
    probe = _rollback_probe(None, "3.7.1")
    probe["aiter"]["gfx90a_digest"] = "cd" * 32  # kernels installed, no patch backups, no state record
    plan = plan_rollback(probe, True, False, ["aiter/jit/module_fmha_v3_fwd.so"])
    assert plan.remove_kernels and plan.jit_patterns == ["aiter/jit/module_fmha_v3_fwd.so"] and plan.clear_state
    assert plan.reverts == [] and not plan.problems


def test_rollback_plan_names_the_directories_a_patch_created() -> None:
    probe = _rollback_probe(None, "3.7.1")
    probe["backups"] = {"amd-aiter": {"backup_dir": "/s/backups/amd-aiter", "root": "/site", "journal": False,
                                      "files": {"a/c/g/D.json": {}}, "jit_invalidations": [],
                                      "created_directories": ["a/c/g"]}}
    assert plan_rollback(probe, True, False, []).describe()[0] == (
        "restore the pristine amd-aiter files kept in /s/backups/amd-aiter, then remove the directories the patch "
        "created, each if empty: a/c/g")


def test_disk_space_problem_names_where_and_both_sizes() -> None:
    probe = probe_of([MI210])
    probe["state_dir_free_bytes"], probe["aiter"]["free_bytes"] = 10_000, 10**9
    assert disk_space_problem(probe, 20_000, 50_000) == (
        "10000 bytes free for <state_dir>/staging, the kernel archive needs 20000: free space there or point "
        "state_dir elsewhere")
    probe["state_dir_free_bytes"], probe["aiter"]["free_bytes"] = 10**9, 1_000
    assert "1000 bytes free beside /x/aiter_meta/hsa, the translated tree needs 50000" in \
        disk_space_problem(probe, 20_000, 50_000)
    probe["aiter"]["free_bytes"] = 10**9
    assert disk_space_problem(probe, 20_000, 50_000) is None


def test_upload_space_problem_tells_a_full_disk_from_another_failure() -> None:
    assert upload_space_problem("10 4096 100\n", 918473, "/var/lib/cdna2/staging", "mi210-a") == (
        "no space left on /var/lib/cdna2/staging on mi210-a: the kernel archive needs 918473 bytes, 40960 bytes and "
        "100 inodes are free now (the disk filled up during the upload)")
    assert "0 inodes are free" in upload_space_problem("1000 4096 0", 918473, "/s", "h")
    assert upload_space_problem("1000 4096 7", 918473, "/s", "h") is None, "room enough: the upload failed otherwise"
    assert upload_space_problem("", 918473, "/s", "h") is None, "no answer from stat: another failure"

"""End-to-end on the simulated lab: the deploy reaches every host over real SSH, validates before touching any,
probes each in one round trip, and a second run changes nothing."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from cdna2.families import host_families
from cdna2.host.families import installed_families
from tests.lab.deploy_runner import REPO, host_snapshot, lab_hosts, run_pyinfra

pytestmark = pytest.mark.lab


def accepted_logins(lab_host: dict) -> int:
    return Path(lab_host["sshd_log"]).read_text().count("Accepted publickey for root")


@pytest.fixture(scope="module")
def deployed(lab: dict, tmp_path_factory: pytest.TempPathFactory):
    """One real deploy of the whole lab, then a second one; both runs' reports. A rollback first: the shared lab
    may hold an earlier test's deploy, and the first run here must provision."""
    reports = tmp_path_factory.mktemp("reports")
    rollback = run_pyinfra("-y", "rollback.py", report_dir=reports)
    assert rollback.returncode == 0, rollback.output[-4000:]
    logins_before = {host["name"]: accepted_logins(host) for host in lab["hosts"]}
    first = run_pyinfra("-y", "deploy.py", report_dir=reports)
    second = run_pyinfra("-y", "deploy.py", report_dir=reports)
    logins_after = {host["name"]: accepted_logins(host) for host in lab["hosts"]}
    return first, second, logins_before, logins_after


def test_deploy_completes_on_every_lab_host(lab: dict, deployed) -> None:
    first, _, _, _ = deployed
    assert first.returncode == 0, first.output[-4000:]
    assert sorted(row["host"] for row in first.report["hosts"]) == sorted(h["name"] for h in lab["hosts"])
    for lab_host in lab_hosts(lab):
        row = first.row(lab_host["name"])
        assert row["status"] == "ok", row
        assert row["hostname"] == lab_host["name"], "each host answers from its own UTS namespace"
        assert row["rocm"] == lab_host["rocm_version"] and row["arch"] == lab_host["arch"]


def test_each_host_sshd_accepted_the_lab_key(lab: dict, deployed) -> None:
    _, _, before, after = deployed
    for name in before:
        # One authenticated connection per host per run (pyinfra keeps it open), two runs.
        assert after[name] - before[name] == 2, f"{name}: sshd log shows {after[name] - before[name]} logins"


def test_second_run_changes_nothing(deployed) -> None:
    _, second, _, _ = deployed
    assert second.returncode == 0, second.output[-4000:]
    changed = {row["host"]: row["changes"] for row in second.report["hosts"] if row["changes"]}
    assert changed == {}, f"the second run changed {changed}"


# An operation row of pyinfra's results table: the deploy names each operation "<step>: <desired state>".
OPERATION_ROW = re.compile(r"^\s+(agent|state|wheels|kernels|patches [\w-]+|smoke|preflight):", re.MULTILINE)


def results_table(output: str) -> str:
    return output.split("--> Results:", 1)[1].split("Grand total", 1)[0]


def test_second_run_issues_no_operation(deployed) -> None:
    """Operations are issued only where the probe shows work: provisioned hosts get none (bench/deploy)."""
    first, second, _, _ = deployed
    assert OPERATION_ROW.search(results_table(first.output)), "the first run's operations are listed"
    assert not OPERATION_ROW.search(results_table(second.output)), results_table(second.output)
    smoke = {row["host"]: row["steps"]["smoke"] for row in second.report["hosts"] if row["arch"] == "gfx90a"}
    assert smoke and all(step["status"] == "ok" and "for this same state" in step["detail"]
                         for step in smoke.values()), smoke


def test_every_installed_kernel_family_is_in_the_report_unproven_without_gpu_checks(lab: dict, deployed) -> None:
    """The lab's GPUs are stand-ins (smoke_gpu_checks off): every family the tree holds is reported unproven, with
    the reason, by the run that judged it and by the re-run that reuses its proof; none is withheld."""
    first, second, _, _ = deployed
    for lab_host in lab_hosts(lab, "gfx90a"):
        tree = next(Path(lab_host["binds"]["/opt/venv"]).glob("lib/python3*/site-packages/aiter_meta/hsa/gfx90a"))
        installed = set(installed_families(tree, host_families()))
        assert {"fmha_v3_fwd", "pa", "fmha_v3_bwd"} <= installed, installed
        for run in (first, second):
            families = run.row(lab_host["name"])["details"]["families"]
            assert set(families) == installed
            assert all(entry["verdict"] == "unproven" and entry["reason"].startswith("GPU checks did not run: GPU "
                                                                                      "checks are off for this host")
                       for entry in families.values()), families
        assert f"families: {len(installed)} unproven" in first.row(lab_host["name"])["steps"]["smoke"]["detail"]


def test_translation_runs_once_per_distinct_source_tree(deployed) -> None:
    first, second, _, _ = deployed
    # Both MI210 hosts hold the same amd-aiter: one translation (or cache look-up) serves them both.
    for run in (first, second):
        lines = [line for line in run.output.splitlines() if re.search(r"translat(ing|ed) gfx942 tree", line)]
        assert len(lines) == 1, lines
    assert "taken from the controller cache" in second.output, "a re-run needs no translator process"


def test_gfx942_host_is_left_alone_and_the_report_says_why(lab: dict, deployed) -> None:
    first, _, _, _ = deployed
    for lab_host in lab_hosts(lab, "gfx942"):
        kernels = first.row(lab_host["name"])["steps"]["kernels"]
        assert kernels["status"] == "skipped" and "gfx942" in kernels["detail"] and "left alone" in kernels["detail"]
        assert host_snapshot(lab_host)["hsa"] is not None
        venv_hsa = next(Path(lab_host["binds"]["/opt/venv"]).glob("lib/python3*/site-packages/aiter_meta/hsa"))
        assert not (venv_hsa / "gfx90a").exists()


def test_misspelt_key_on_one_host_stops_the_run_before_any_host_changes(lab: dict, tmp_path: Path) -> None:
    victim = lab["hosts"][1]["name"]
    inventory = tmp_path / "typo_inventory.py"
    inventory.write_text(
        "import runpy\n"
        f"lab = runpy.run_path({str(REPO / 'inventory/sim.py')!r})\n"
        "mi210 = [(name, dict(data, targt_python='/opt/venv/bin/python') if name == "
        f"{victim!r} else data) for name, data in lab['mi210']]\n"
        "mi300x = lab['mi300x']\n")
    before = {host["name"]: host_snapshot(host) for host in lab["hosts"]}
    run = run_pyinfra("-y", "deploy.py", inventory=str(inventory), report_dir=tmp_path / "reports")
    assert run.returncode != 0
    assert f"host {victim}: data key `targt_python`: unknown data key (did you mean `target_python`?)" in run.output
    assert "no host was changed" in run.output
    assert {host["name"]: host_snapshot(host) for host in lab["hosts"]} == before


def test_probe_fact_over_ssh_matches_each_host(lab: dict) -> None:
    import subprocess
    import sys
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "inventory/sim.py", "fact", "operations.facts.HostProbe",
         "target_python=/opt/venv/bin/python", "rocm_root=/opt/rocm", "state_dir=/var/lib/cdna2",
         "agent_dir=/var/lib/cdna2/agent", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    (facts,) = json.loads(result.stdout).values()
    for lab_host in lab_hosts(lab):
        probe = facts[lab_host["name"]]
        assert probe["os"]["hostname"] == lab_host["name"]
        assert probe["python"]["is_target"] and probe["python"]["path"] == "/opt/venv/bin/python"
        assert probe["rocm"] == {"version": lab_host["rocm_version"], "raw": probe["rocm"]["raw"],
                                 "source": "/opt/rocm/.info/version"}
        assert probe["gpu"]["arch"] == lab_host["arch"] and len(probe["gpu"]["agents"]) == lab_host["gpu_count"]
        assert probe["distributions"]["amd-aiter"]["version"] == "0.1.7.post2.dev18"
        assert probe["aiter"]["gfx942_record_files"] == 1326
        assert probe["errors"] == []


def test_report_names_each_hosts_kernel_verdicts_and_policy_and_verify_checks_the_policy(
        lab: dict, deployed, tmp_path: Path) -> None:
    first, _, _, _ = deployed
    for lab_host in lab_hosts(lab):  # the probe runs the agent's copy from bytecode (operations/facts.py)
        agent = Path(lab_host["binds"]["/var/lib/cdna2"]) / "agent" / "cdna2" / "host"
        assert list((agent / "__pycache__").glob("probe.cpython-*.pyc")), f"{lab_host['name']}: no agent bytecode"
    for lab_host in lab_hosts(lab, "gfx90a"):
        row = first.row(lab_host["name"])
        assert "kernel_hazard_policy default (MFMA wait-state audit" in row["steps"]["kernels"]["detail"]
        details = row["details"]["kernels"]
        # Padding (on by default) makes every short kernel clean: none is withheld, the padded ones are counted.
        assert details["hazard_policy"] == "default" and details["withheld"] == 0, details
        assert details["hazard_verdicts"]["short-straight-line"] == details["hazard_verdicts"]["unaudited"] == 0
        assert details["code_changes"].get("padded", 0) > 0 and "padded" in row["steps"]["kernels"]["detail"]
    # The installed trees were made under the default policy: verify with another one names each field that differs,
    # changes nothing.
    strict = run_pyinfra("-y", "verify.py", "--data", "kernel_hazard_policy=strict", "--data", "int8_k32_split=true",
                         report_dir=tmp_path)
    assert strict.returncode != 0
    for lab_host in lab_hosts(lab, "gfx90a"):
        detail = strict.row(lab_host["name"])["steps"]["verify"]["detail"]
        assert "kernel_hazard_policy: recorded default, host data strict: run the deploy" in detail, detail
        assert "int8_k32_split: recorded off, host data on: run the deploy" in detail, detail
        assert "pad_mfma_hazards" not in detail, detail


@pytest.mark.parametrize("model, backend, prefill", [
    ("llama-full-attention", "ROCM_ATTN", "vLLM's ROCm attention"),
    ("gemma3-interleaved-sliding", "ROCM_ATTN", "vLLM's ROCm attention")])
def test_explain_names_what_vllm_runs_on_a_deployed_host(lab: dict, deployed, tmp_path: Path, model, backend,
                                                          prefill) -> None:
    """explain --host mi210-a: the host's vLLM 0.23.0 as the deploy report recorded it (the required set only, as
    inventory/sim.py deploys), asked through vLLM's own selector. Llama: AITER FA is admitted but ROCM_ATTN comes
    first without the prefer set; Gemma: the sliding-window guard refuses AITER FA for every layer."""
    _, second, _, _ = deployed
    report = tmp_path / "deploy.json"
    report.write_text(json.dumps(second.report))
    command = [str(REPO / ".venv/bin/python"), "-m", "releases", "explain", "--config",
               str(REPO / "releases/vllm_gates/models" / f"{model}.json"), "--host", "mi210-a", "--report", str(report)]
    result = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    explanation = json.loads(result.stdout)
    assert explanation["target"]["version"] == "0.23.0" and explanation["arch"] == "gfx90a"
    assert explanation["patch_sets"] == ["vllm-attention-gate"]
    assert {layer["backend"] for layer in explanation["attention"]} == {backend}
    assert all(layer["prefill"]["kernel"].startswith(prefill) for layer in explanation["attention"])
    decided = [line for layer in explanation["attention"] for line in layer["decided_by"]]
    if model.startswith("gemma"):
        assert all("is served wrong by ROCM_AITER_FA on gfx90a" in
                   next(line for line in layer["decided_by"] if "refused" in line)
                   for layer in explanation["attention"])
    else:
        assert any("ROCM_AITER_FA is valid, but ROCM_ATTN comes first" in line for line in decided)
    text = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    assert text.returncode == 0 and f"attention backend {backend}" in text.stdout
    assert "mi210-a (gfx90a, vLLM 0.23.0" in text.stdout

"""End-to-end tests of the simulated lab: real sshd hosts on loopback, reached over real SSH with host-key checking."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from lab import kinds, venvs, wheelhouse
from lab.hosts import HOST_BASHRC
from lab.labctl import host_alive, ssh_argv
from lab.labstate import REPO
from lab.processes import process_state

pytestmark = pytest.mark.lab

PYINFRA = REPO / ".venv" / "bin" / "pyinfra"


def ssh(lab: dict, host: dict, command: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(ssh_argv(lab, host, command), capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"ssh {host['name']} {command!r} exited {result.returncode}: {result.stderr}")
    return result


def pids(lab: dict) -> dict[str, int]:
    return {host["name"]: host["pid"] for host in lab["hosts"]}


def test_up_again_leaves_running_hosts_alone(lab, run_lab_command):
    again = run_lab_command("up", "3", "--json")
    assert pids(json.loads(again.stdout)) == pids(lab)
    assert again.stderr.count("left alone") == 3


def test_default_lab_has_one_host_of_each_kind(lab):
    assert [(h["name"], h["arch"], h["rocm_version"]) for h in lab["hosts"]] == [
        ("mi210-a", "gfx90a", "6.4.3"), ("mi210-b", "gfx90a", "7.14.0"), ("mi300x-c", "gfx942", "7.14.0")]
    assert len({h["address"] for h in lab["hosts"]}) == 3


# The identity each host reports about itself, asked over SSH: a fixed script.
IDENTITY_SCRIPT = """hostname
cat /opt/rocm/.info/version
/opt/rocm/bin/rocminfo
/opt/venv/bin/python -c 'import sys, importlib.metadata as m; print(sys.prefix, m.version("amd-aiter"), m.version("triton"))'
/opt/venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || echo absent
"""


def installed_version(venv: Path, distribution: str) -> str:
    """The version of a distribution in a venv, read from its dist-info directory name on the controller."""
    found = list((venv / "lib" / "python3.11" / "site-packages").glob(f"{distribution}-*.dist-info"))
    return found[0].name.removesuffix(".dist-info").split("-")[1] if found else "absent"


@pytest.mark.parametrize("index", range(3))
def test_host_answers_as_itself_over_ssh(lab, index):
    host = lab["hosts"][index]
    kind = kinds.kind_by_key(host["kind"])
    lines = ssh(lab, host, IDENTITY_SCRIPT).stdout.splitlines()
    assert lines[0] == host["name"]
    assert lines[1] == host["rocm_version"]
    rocminfo = "\n".join(lines[2:-2])
    # aiter's get_gfx takes the first "gfx..." word of rocminfo's output (aiter/jit/utils/chip_info.py).
    assert re.search(r"\b(gfx\w+)\b", rocminfo).group(1) == host["arch"]
    gpu_agents = rocminfo.count("Device Type:             GPU")
    assert gpu_agents == host["gpu_count"] == len(kind.gpu.bdfids)
    assert f"Marketing Name:          {kind.gpu.marketing_name}" in rocminfo
    assert f"Compute Unit:            {kind.gpu.compute_units}" in rocminfo
    assert f"Chip ID:                 {kind.gpu.chip_id}(0x{kind.gpu.chip_id:x})" in rocminfo
    # /opt/venv on the host is that host's own directory (a deploy may have upgraded packages since `up`).
    own_venv = Path(host["binds"]["/opt/venv"])
    prefix, aiter_version, triton_version = lines[-2].split()
    assert prefix == "/opt/venv"
    assert aiter_version == installed_version(own_venv, "amd_aiter") == "0.1.7.post2.dev18"
    assert triton_version == installed_version(own_venv, "triton")
    assert lines[-1] == installed_version(own_venv, "vllm")
    assert (lines[-1] == "absent") == (not kind.extra_packages)


def test_hosts_have_their_own_tmp_and_state_dir(lab):
    first, second = lab["hosts"][0], lab["hosts"][1]
    marker = f"lab-test-{uuid.uuid4().hex}"
    ssh(lab, first, f"touch /tmp/{marker} /var/lib/cdna2/{marker}")
    try:
        seen = ssh(lab, second, f"ls /tmp/{marker} /var/lib/cdna2/{marker}", check=False)
        assert seen.returncode != 0
        assert not Path("/tmp", marker).exists() and not Path("/var/lib/cdna2", marker).exists()
        assert (Path(first["binds"]["/tmp"]) / marker).exists()
    finally:
        ssh(lab, first, f"rm -f /tmp/{marker} /var/lib/cdna2/{marker}")


def test_hosts_shell_reads_their_own_bashrc(lab):
    """sshd runs each command through root's bash, which reads ~/.bashrc: the host's own, not this machine's."""
    if not Path("/root/.bashrc").is_file():
        pytest.skip("this machine has no /root/.bashrc, so lab hosts bind none over it")
    host = lab["hosts"][0]
    seen = ssh(lab, host, "cat ~/.bashrc").stdout
    assert seen == HOST_BASHRC == Path(host["binds"]["/root/.bashrc"]).read_text()


def test_host_key_checking_is_on(lab, tmp_path):
    host = lab["hosts"][0]
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    # The same host entry, but holding another host's key: a man in the middle, as far as ssh can tell.
    impostor = tmp_path / "impostor_known_hosts"
    impostor.write_text(f"[{host['address']}]:{host['port']} {lab['hosts'][1]['host_key_pub']}\n")
    for known_hosts in (empty_known_hosts, impostor):
        refused = ssh({**lab, "ssh": {**lab["ssh"], "known_hosts": str(known_hosts)}}, host, "true", check=False)
        assert refused.returncode == 255
        assert "Host key verification failed" in refused.stderr


def _accepted_logins(host: dict) -> int:
    return Path(host["sshd_log"]).read_text().count("Accepted publickey for root")


def test_pyinfra_inventory_reaches_each_host_by_name(lab):
    logins_before = {h["name"]: _accepted_logins(h) for h in lab["hosts"]}
    result = subprocess.run(
        [str(PYINFRA), "-y", "inventory/sim.py", "exec", "--", "hostname; cat /opt/rocm/.info/version"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    for host in lab["hosts"]:
        answers = re.findall(rf"^\[{re.escape(host['name'])}\]\s+(\S+)$", output, re.MULTILINE)
        assert answers == [host["name"], host["rocm_version"]]
        assert _accepted_logins(host) > logins_before[host["name"]]


def test_inventory_without_a_lab_says_to_run_lab_up(tmp_path):
    result = subprocess.run([str(PYINFRA), "-y", "inventory/sim.py", "exec", "--", "true"], cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CDNA2_LAB_DIR": str(tmp_path / "no-lab")})
    assert result.returncode != 0
    assert "run ./lab/up" in result.stdout + result.stderr


def test_status_reports_what_each_host_says(lab, run_lab_command):
    report = json.loads(run_lab_command("status", "--json").stdout)
    assert report["up"] is True
    for row, host in zip(report["hosts"], lab["hosts"]):
        assert row["ssh"]["ok"] and row["running"]
        assert (row["ssh"]["hostname"], row["ssh"]["arch"], row["ssh"]["rocm_version"]) == (
            host["name"], host["arch"], host["rocm_version"])
        assert row["ssh"]["python_prefix"] == "/opt/venv"
        assert row["ssh"]["packages"]["amd-aiter"] == "0.1.7.post2.dev18"


def test_down_stops_exactly_the_recorded_pids(lab, scratch_lab, run_lab_command):
    host = scratch_lab["hosts"][0]
    shared_lab_pids = pids(lab)
    # An open session: down must end the host's session processes too, not only its listener.
    session = subprocess.Popen(ssh_argv(scratch_lab, host, "sleep 600"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ssh(scratch_lab, host, "true")  # the session above is accepted by now
        result = run_lab_command("down", "--json", lab_dir=Path(scratch_lab["lab_dir"]))
        assert process_state(host["pid"]) in (None, "Z")
        assert session.wait(timeout=30) != 0
    finally:
        session.kill()
        session.wait()
    assert f'"pid": {host["pid"]}' in result.stdout
    assert not Path(scratch_lab["lab_dir"]).exists()
    assert all(host_alive(h) for h in lab["hosts"])
    assert pids(lab) == shared_lab_pids


def test_changing_one_host_leaves_the_shared_template_alone(scratch_lab):
    """Host venvs are hard-linked copies of one template: an upgrade on a host must not show through the links."""
    host = scratch_lab["hosts"][0]
    kind = kinds.kind_by_key(host["kind"])
    fresh = ssh(scratch_lab, host, "/opt/venv/bin/python -m pip list --format=freeze").stdout.splitlines()
    assert set(kind.packages) <= set(fresh)  # a new host has exactly its kind's packages, the broken triton too
    wheels = wheelhouse.cache_root() / "wheels"
    ssh(scratch_lab, host, f"PIP_CONFIG_FILE=/dev/null /opt/venv/bin/python -m pip install -q --no-index "
                           f"--find-links {wheels} triton==3.7.1")
    upgraded = ssh(scratch_lab, host, "/opt/venv/bin/python -c 'import triton; print(triton.__version__)'")
    assert upgraded.stdout.strip() == "3.7.1"
    template = venvs.template_for(kind, progress=lambda message: None)
    template_init = template / "lib" / "python3.11" / "site-packages" / "triton" / "__init__.py"
    assert "__version__ = '3.7.0'" in template_init.read_text()


def test_up_restarts_dead_hosts_with_their_state_and_creates_missing_ones(scratch_lab, run_lab_command):
    lab_dir = Path(scratch_lab["lab_dir"])
    host = scratch_lab["hosts"][0]
    ssh(scratch_lab, host, "echo kept > /var/lib/cdna2/marker")
    os.kill(host["pid"], 15)  # the host dies (by its recorded pid; init reaps it)
    after = json.loads(run_lab_command("up", "2", "--json", lab_dir=lab_dir).stdout)
    restarted, created = after["hosts"]
    assert restarted["name"] == host["name"] and restarted["pid"] != host["pid"] and host_alive(restarted)
    assert created["name"] == "mi210-b" and host_alive(created)
    assert ssh(after, restarted, "cat /var/lib/cdna2/marker").stdout == "kept\n"
    assert ssh(after, created, "hostname").stdout == "mi210-b\n"

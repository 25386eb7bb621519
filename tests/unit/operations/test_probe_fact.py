"""The HostProbe fact's command runs the installed agent's probe when it is the controller's own, else the inline
copy: both on this machine's Python, through a real shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cdna2.probe_payload import PROBE_PAYLOAD, probe_modules
from operations.facts import HostProbe


def run_fact_command(tmp_path: Path, agent: Path) -> dict:
    command = HostProbe().command(target_python=sys.executable, rocm_root=str(tmp_path / "rocm"),
                                  state_dir=str(tmp_path / "state"), agent_dir=str(agent))
    result = subprocess.run(["/bin/sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    return json.loads(result.stdout)


def install_agent_probe(agent: Path, texts: dict[str, str]) -> None:
    """An agent holding the probe's modules with these texts (module name -> text)."""
    (agent / "cdna2" / "host").mkdir(parents=True)
    for package in ("cdna2", "cdna2/host"):
        (agent / package / "__init__.py").write_text("")
    for name, text in texts.items():
        (agent / (name.replace(".", "/") + ".py")).write_text(text)


def test_the_installed_probe_runs_from_cached_bytecode_when_it_is_the_controllers(tmp_path: Path) -> None:
    agent = tmp_path / "state" / "agent"
    install_agent_probe(agent, dict(probe_modules()))
    first, second = run_fact_command(tmp_path, agent), run_fact_command(tmp_path, agent)
    assert first["format"] == second["format"] and first["agent"]["digest"] == second["agent"]["digest"]
    # Written although PYTHONDONTWRITEBYTECODE is set: the cache lives in the tool's own agent directory.
    assert list((agent / "cdna2" / "host" / "__pycache__").glob("probe.*.pyc"))


def test_a_stale_or_unreadable_agent_probe_is_not_run(tmp_path: Path) -> None:
    agent = tmp_path / "state" / "agent"
    # An older agent's probe module: it would print this instead of probing (every other module is current).
    modules = dict(probe_modules())
    modules["cdna2.host.gpus"] = 'print(\'{"stale": true}\')\n' + modules["cdna2.host.gpus"]
    install_agent_probe(agent, modules)
    found = run_fact_command(tmp_path, agent)
    assert "stale" not in found and found["errors"] is not None
    assert not (agent / "cdna2" / "host" / "__pycache__").exists()
    assert "stale" not in run_fact_command(tmp_path, tmp_path / "no-agent")


STAND_IN_SUDO = """#!/bin/sh
# STAND-IN for sudo (tests/unit/operations/test_probe_fact.py): refuses like sudo -n without NOPASSWD, or runs the
# command as this same user, as passwordless sudo would as root.
[ -e "$(dirname "$0")/refuse" ] && { echo "sudo: a password is required" >&2; exit 1; }
while [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""


def run_sudo_fact_command(tmp_path: Path, refuse: bool) -> dict:
    bin_dir = tmp_path / "sudo-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sudo").write_text(STAND_IN_SUDO)
    (bin_dir / "sudo").chmod(0o755)
    (bin_dir / "refuse").unlink(missing_ok=True)
    if refuse:
        (bin_dir / "refuse").touch()
    command = HostProbe().command(target_python=sys.executable, rocm_root=str(tmp_path / "rocm"),
                                  state_dir=str(tmp_path / "state"), agent_dir=None, sudo=True).get_raw_value()
    assert command.count(PROBE_PAYLOAD) == 1, "the probe's modules are sent once"
    assert len(command) < 128 * 1024, "one argument of sh -c holds at most MAX_ARG_STRLEN (128 KiB)"
    assert len(command.encode()) < 128 * 1024, "sshd's shell gets the command as one argument: 128 KiB at most"
    result = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return json.loads(result.stdout)


def test_through_sudo_the_probe_runs_as_root_or_says_what_sudo_refused(tmp_path: Path) -> None:
    assert run_sudo_fact_command(tmp_path, refuse=False)["sudo_refused"] is None
    refused = run_sudo_fact_command(tmp_path, refuse=True)["sudo_refused"]
    assert refused["error"] == "sudo: a password is required", refused

"""The HostProbe fact's command runs the installed agent's probe when it is the controller's own, else the inline
copy: both on this machine's Python, through a real shell."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from operations.facts import PROBE_SOURCE, HostProbe

PROBE_FILE = Path(__file__).resolve().parents[3] / "cdna2" / "host" / "probe.py"


def run_fact_command(tmp_path: Path, agent: Path) -> dict:
    command = HostProbe().command(target_python=sys.executable, rocm_root=str(tmp_path / "rocm"),
                                  state_dir=str(tmp_path / "state"), agent_dir=str(agent))
    result = subprocess.run(["/bin/sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    return json.loads(result.stdout)


def install_agent_probe(agent: Path, text: str) -> Path:
    (agent / "cdna2" / "host").mkdir(parents=True)
    for package in ("cdna2", "cdna2/host"):
        (agent / package / "__init__.py").write_text("")
    probe = agent / "cdna2" / "host" / "probe.py"
    probe.write_text(text)
    return probe


def test_the_installed_probe_runs_from_cached_bytecode_when_it_is_the_controllers(tmp_path: Path) -> None:
    agent = tmp_path / "state" / "agent"
    shutil.copyfile(PROBE_FILE, install_agent_probe(agent, ""))
    first, second = run_fact_command(tmp_path, agent), run_fact_command(tmp_path, agent)
    assert first["format"] == second["format"] and first["agent"]["digest"] == second["agent"]["digest"]
    # Written although PYTHONDONTWRITEBYTECODE is set: the cache lives in the tool's own agent directory.
    assert list((agent / "cdna2" / "host" / "__pycache__").glob("probe.*.pyc"))


def test_a_stale_or_unreadable_agent_probe_is_not_run(tmp_path: Path) -> None:
    agent = tmp_path / "state" / "agent"
    # An older agent's probe: it would print this instead of probing.
    install_agent_probe(agent, 'print(\'{"stale": true}\')\n' + PROBE_SOURCE)
    found = run_fact_command(tmp_path, agent)
    assert "stale" not in found and found["errors"] is not None
    assert not (agent / "cdna2" / "host" / "__pycache__").exists()
    assert "stale" not in run_fact_command(tmp_path, tmp_path / "no-agent")

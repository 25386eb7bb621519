"""operations.agent.agent_installed: the commands it issues to an @fake host, then its install command run by a real
shell in a directory standing in for the host's state directory (a shared environment's, where two controllers may
install the same agent at once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from cdna2.agent import build_agent_bundle
from cdna2.host.digests import tree_digest
from operations import agent


def install_command(state_dir: Path, bundle) -> tuple[str, Path]:
    """The shell command that installs the agent, and where it expects the uploaded archive."""
    state = State(Inventory(([("@fake/a", {"fake_delay": 0, "fake_delay_jitter": 0})], {})), Config())
    connect_all(state)
    fake = state.inventory.get_host("@fake/a")
    add_op(state, agent.agent_installed, bundle=bundle, state_dir=str(state_dir), installed_digest=None,
           target_python=sys.executable, host=[fake])
    run_ops(state)
    commands = fake.connector.executed_commands
    return commands[-1], state_dir / f"agent-{bundle.digest[:16]}-{agent.RUN_ID}.tar.gz"


def run_install(command: str, archive: Path, bundle) -> None:
    archive.write_bytes(bundle.archive.read_bytes())  # what the upload leaves there
    subprocess.run(["sh", "-c", command], check=True)
    assert not archive.exists(), "the uploaded archive is removed"


def test_the_agent_goes_in_whole_and_an_identical_one_in_place_is_kept(tmp_path: Path) -> None:
    bundle = build_agent_bundle(tmp_path / "cache")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    command, archive = install_command(state_dir, bundle)
    run_install(command, archive, bundle)
    installed = state_dir / "agent"
    assert tree_digest(installed) == bundle.digest
    inode = installed.stat().st_ino
    run_install(command, archive, bundle)  # another controller's install of the same agent, just after
    assert installed.stat().st_ino == inode, "the identical agent in place was kept, not swapped under its users"
    assert sorted(path.name for path in state_dir.iterdir()) == ["agent"], "no staging or old copy left"


def test_a_different_agent_in_place_is_replaced(tmp_path: Path) -> None:
    bundle = build_agent_bundle(tmp_path / "cache")
    state_dir = tmp_path / "state"
    (state_dir / "agent" / "cdna2").mkdir(parents=True)
    (state_dir / "agent" / "cdna2" / "stale.py").write_text("an older agent\n")
    command, archive = install_command(state_dir, bundle)
    run_install(command, archive, bundle)
    assert tree_digest(state_dir / "agent") == bundle.digest
    assert sorted(path.name for path in state_dir.iterdir()) == ["agent"]

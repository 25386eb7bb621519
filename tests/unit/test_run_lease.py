"""The host's run lease (cdna2/host/state.py): one controller run at a time, bound to that run's SSH connection.

There is no SSH connection in a unit test: a ``sleep`` process stands in for the sshd serving a run's connection
(CONNECTION_STAND_IN); killing it is the connection ending.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cdna2.host import state


@pytest.fixture
def connections(monkeypatch):
    """connections(name) starts a stand-in connection and makes it the current command's connection."""
    started = []

    def connect() -> subprocess.Popen:
        process = subprocess.Popen(["sleep", "600"])  # CONNECTION_STAND_IN
        started.append(process)
        monkeypatch.setattr(state, "ssh_connection",
                            lambda: {"pid": process.pid, "start": state._process_stat(process.pid)[1]})
        return process

    yield connect
    for process in started:
        process.kill()
        process.wait()


def locked_command(state_dir: Path, run: str, monkeypatch) -> None:
    monkeypatch.setenv(state.RUN_ENVIRONMENT, run)
    with state.host_lock(state_dir):
        pass


def test_second_run_is_refused_while_the_first_runs_connection_lives(tmp_path, connections, monkeypatch):
    first = connections()
    locked_command(tmp_path, "alice@ctl pid 1 (run a)", monkeypatch)
    locked_command(tmp_path, "alice@ctl pid 1 (run a)", monkeypatch)  # the same run keeps it
    connections()
    with pytest.raises(state.HostLockedError, match=r"is being provisioned by alice@ctl pid 1 \(run a\) since "
                                                    r"\d{4}-.*Z: wait for that run to finish"):
        locked_command(tmp_path, "bob@ctl2 pid 2 (run b)", monkeypatch)
    first.kill()
    first.wait()
    locked_command(tmp_path, "bob@ctl2 pid 2 (run b)", monkeypatch)  # the first connection ended: lease free
    assert state.read_lease(tmp_path)["run"] == "bob@ctl2 pid 2 (run b)"


def test_a_recycled_pid_does_not_keep_a_dead_lease(tmp_path, connections, monkeypatch):
    live = connections()
    lease = {"run": "old run", "since": "2026-01-01T00:00:00Z",
             "connection": {"pid": live.pid, "start": "1"}}  # same pid, another start time: another process
    (tmp_path / state.LEASE).write_text(json.dumps(lease))
    locked_command(tmp_path, "new run", monkeypatch)
    assert state.read_lease(tmp_path)["run"] == "new run"


def test_commands_run_by_hand_take_no_lease(tmp_path, monkeypatch):
    monkeypatch.delenv(state.RUN_ENVIRONMENT, raising=False)
    with state.host_lock(tmp_path):
        pass
    assert state.read_lease(tmp_path) is None


def test_a_controller_run_without_an_ssh_connection_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(state.RUN_ENVIRONMENT, "run")
    with pytest.raises(state.HostLockedError, match="no sshd serves this command"):
        with state.host_lock(tmp_path):
            pass


def test_lease_cli_refuses_with_one_json_object(tmp_path, connections, monkeypatch, capsys):
    connections()
    locked_command(tmp_path, "first", monkeypatch)
    connections()
    monkeypatch.setenv(state.RUN_ENVIRONMENT, "second")
    assert state.main(["lease", "--state-dir", str(tmp_path)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["result"] == "refused" and "is being provisioned by first" in result["error"]


def test_state_cli_takes_key_and_value_after_the_state_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(state.RUN_ENVIRONMENT, raising=False)
    assert state.main(["set-once", "--state-dir", str(tmp_path), "baseline", '{"triton": "3.7.0"}']) == 0
    assert json.loads(capsys.readouterr().out) == {"key": "baseline", "result": "recorded"}
    assert state.read_state(tmp_path)["baseline"] == {"triton": "3.7.0"}

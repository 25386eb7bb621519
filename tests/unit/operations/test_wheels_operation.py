"""operations.wheels.packages, run by real pyinfra (API mode) against @fake hosts that record every command.

@fake stands in for SSH hosts: no host here has ROCm or a GPU, and the commands' effect on a real environment is
proven by the lab test; what these tests pin down is which commands the operation issues, in which order, and how
a host fails.
"""

from __future__ import annotations

import logging
import re
import shlex

import pytest
from pyinfra.api import Config, Inventory, OperationTypeError, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops

from cdna2.wheels import WheelPlanError, load_matrix, plan_wheels
from operations import wheels

PYTHON = "/opt/venv/bin/python"
IMPORT_CHECK = re.compile(r"^/opt/venv/bin/python -I -c ")


def probe(**versions: str) -> dict:
    return {"python": {"path": PYTHON, "target": PYTHON, "target_exists": True, "version": "3.11.2"},
            "rocm": {"version": "6.4.3", "source": "/opt/rocm/.info/version"},
            "distributions": {name.replace("_", "-"): {"name": name.replace("_", "-"), "version": version}
                              for name, version in versions.items()}}


STATE_DIR = "/var/lib/cdna2"
MATCHING = {"torch": "2.9.0+rocm6.4", "amd_aiter": "0.1.7.post2.dev18", "triton": "3.7.1"}


@pytest.fixture
def lab():
    """Real pyinfra state over three @fake hosts (a, b, c) that run nothing; the import check can be made to fail."""
    def make(fake_responses_for: dict[str, dict] | None = None) -> tuple[State, dict]:
        names = ["@fake/a", "@fake/b", "@fake/c"]
        hosts = [(name, {"fake_delay": 0, "fake_delay_jitter": 0,
                         "fake_responses": (fake_responses_for or {}).get(name, {})}) for name in names]
        state = State(Inventory((hosts, {})), Config())
        connect_all(state)
        return state, {name.split("/")[1]: state.inventory.get_host(name) for name in names}
    return make


def test_triton_370_host_gets_one_pip_command_then_the_import_check(lab):
    state, hosts = lab()
    plan = plan_wheels(load_matrix(), probe(**MATCHING | {"triton": "3.7.0"}))
    meta = add_op(state, wheels.packages, plan=plan, state_dir=STATE_DIR, host=[hosts["a"]])[hosts["a"]]
    assert meta.will_change
    run_ops(state)
    commands = hosts["a"].connector.executed_commands
    assert len(commands) == 4, commands
    assert "cdna2.host.state lease --state-dir /var/lib/cdna2" in commands[0], "the run lease comes before pip"
    assert shlex.split(commands[1]) == ["mkdir", "-p", "/var/lib/cdna2/tmp"], "pip's temporary directory"
    assert shlex.split(commands[2]) == ["env", "TMPDIR=/var/lib/cdna2/tmp", *plan.actions[0].argv]
    assert "--no-cache-dir" in plan.actions[0].argv and plan.actions[0].argv[-1] == "triton==3.7.1"
    assert IMPORT_CHECK.match(commands[3]) and "Prove that triton" in commands[3]
    assert meta.did_change() and not state.failed_hosts


def test_matching_host_issues_no_command_and_says_why(lab, caplog):
    state, hosts = lab()
    plan = plan_wheels(load_matrix(), probe(**MATCHING))
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        meta = add_op(state, wheels.packages, plan=plan, state_dir=STATE_DIR, host=[hosts["a"]])[hosts["a"]]
        run_ops(state)
    assert hosts["a"].connector.executed_commands == []
    assert not meta.will_change and not meta.did_change()
    assert any("already match" in record.getMessage() and "ROCm 6.4" in record.getMessage()
               for record in caplog.records), [record.getMessage() for record in caplog.records]


def test_failed_import_check_fails_the_host(lab):
    death = "importcheck: failed: SIGSEGV, exit 139, while importing triton.runtime.autotuner"
    state, hosts = lab({"@fake/a": {IMPORT_CHECK: {"success": False, "stderr": death}}})
    plan = plan_wheels(load_matrix(), probe(**MATCHING | {"triton": "3.7.0"}))
    add_op(state, wheels.packages, plan=plan, state_dir=STATE_DIR, host=[hosts["a"]])
    run_ops(state)
    assert hosts["a"] in state.failed_hosts
    assert len(hosts["a"].connector.executed_commands) == 4


def test_dry_run_logs_exactly_the_pip_commands_of_each_host(lab, caplog):
    state, hosts = lab()
    matrix = load_matrix()
    plans = {"a": plan_wheels(matrix, probe(triton="3.7.0")),
             "b": plan_wheels(matrix, probe(**MATCHING | {"triton": "3.7.0"})),
             "c": plan_wheels(matrix, probe(**MATCHING))}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        for name, plan in plans.items():
            add_op(state, wheels.packages, plan=plan, state_dir=STATE_DIR, host=[hosts[name]])
    # Only the prepare pass ran (as with --dry): nothing was executed anywhere.
    assert all(host.connector.executed_commands == [] for host in hosts.values())
    for name, plan in plans.items():
        logged = [shlex.split(record.getMessage().split("wheels:", 1)[1])
                  for record in caplog.records
                  if f"@fake/{name}]" in record.getMessage() and "wheels:    " in record.getMessage()]
        assert logged == [list(action.argv) for action in plan.actions], (name, logged)
    assert [action.package for action in plans["a"].actions] == ["torch", "amd-aiter", "triton"]


def test_plan_of_the_wrong_type_is_refused(lab):
    state, hosts = lab()
    for wrong in ({"actions": []}, WheelPlanError("ROCm 5.7.1 is not in the wheel matrix")):
        with pytest.raises(OperationTypeError, match="`plan` must be a WheelPlan, not"):
            add_op(state, wheels.packages, plan=wrong, state_dir=STATE_DIR, host=[hosts["a"]])

"""A Python environment several hosts share (host data ``shared_environment``): one writes it, the others check it."""

from __future__ import annotations

import json
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from operations.agent import RUN, agent_command


@operation()
def environment_claimed(writer: str | None, identity_id: str, prefix: str, target_python: str, state_dir: str):
    """
    Write the shared environment's identity (when it has none yet) and this run's writer mark into it, last of
    the writer's changes to it (``cdna2.host.env_lock claim``, under the environment's lock).

    + writer: None on the host that writes the environment; on the others, that host: nothing is done there, and
      the operation orders their check after the writer's work (pyinfra orders operations by each host's
      sequence of them, so a host must pass through this one to wait for it)
    + identity_id: the identity the environment has, or the one this run gives it
    + prefix: the environment's directory (``sys.prefix`` of target_python)
    + target_python, state_dir: run the host agent (the state directory is the environment's own)

    **Example:**

    .. code:: python

        environment_claimed(name="shared environment: this run writes it", writer=None, identity_id="4f0c...",
                            prefix="/project/venv", target_python="/project/venv/bin/python",
                            state_dir="/project/venv/.cdna2/state")
    """
    if writer is not None:
        host.noop(f"{prefix} is written by {writer}")
        return
    yield agent_command(target_python, state_dir, "env_lock", "claim", "--prefix", prefix, "--id", identity_id,
                        "--run", RUN)


def _writer_has_not_failed(state, host, writer: str) -> bool:
    if any(failed.name == writer for failed in state.failed_hosts):
        raise RuntimeError(f"{host.name}: the writer of its shared environment, host {writer}, failed in this run: "
                           f"nothing to check here; see {writer}'s row, fix it, run again")
    return True


@operation()
def environment_checked(writer: str, expectation: dict[str, Any], prefix: str, target_python: str, state_dir: str):
    """
    On a host that shares its environment and does not write it: once the writer is done (this operation comes
    after ``environment_claimed``, which comes after the writer's changes), check through this host's own
    mount that the environment holds the writer's identity and mark of this run, no unfinished transaction, and
    the kernel tree and patched files the writer's plan leaves (``cdna2.host.env_lock check``, which waits for
    the environment's lock). Issued only when the writer has changes to make in this run.

    + writer: the host that writes the environment in this run
    + expectation: ``cdna2.shared_environments.checker_expectation(...)``
    + prefix, target_python, state_dir: as for ``environment_claimed``

    **Example:**

    .. code:: python

        environment_checked(name="shared environment: written by mi210-a, checked here", writer="mi210-a",
                            expectation=checker_expectation(...), prefix="/project/venv",
                            target_python="/project/venv/bin/python", state_dir="/project/venv/.cdna2/state")
    """
    yield FunctionCommand(_writer_has_not_failed, (writer,), {})
    yield agent_command(target_python, state_dir, "env_lock", "check", "--prefix", prefix, "--expect",
                        json.dumps(expectation, sort_keys=True))


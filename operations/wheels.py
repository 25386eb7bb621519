"""Install ROCm-matched torch, amd-aiter and vLLM, pin triton last, and prove the result imports."""

from __future__ import annotations

from importlib import resources

from pyinfra import host, logger
from pyinfra.api import OperationTypeError, QuoteString, StringCommand, operation

from cdna2.host.shared_env import shared_environment_of
from cdna2.wheels import PipAction, WheelPlan
from operations.agent import agent_command, lease_command
from operations.util import first_pass

IMPORTCHECK_SOURCE = resources.files("cdna2").joinpath("host", "importcheck.py").read_text()


def import_check_command(python: str) -> StringCommand:
    """Run cdna2/host/importcheck.py under ``python`` in a fresh, isolated process (-I: no PYTHONPATH, no cwd)."""
    return StringCommand(QuoteString(python), "-I", "-c", QuoteString(IMPORTCHECK_SOURCE))


@operation()
def packages(plan: WheelPlan, state_dir: str):
    """
    Install the wheels a host's plan names, in order, then prove triton (and AITER) import.

    + plan: the host's ``cdna2.wheels.plan_wheels(...)`` result (a host it cannot plan for is failed in preflight)
    + state_dir: the tool's state directory on the host (its run lease is taken before pip runs)

    Order:
        torch, amd-aiter, vLLM, and ``triton==3.7.1`` last: the plan lists only what differs from the probe's
        installed distributions, and triton whenever another triton is present or anything else is installed
        before it. Each pip command runs with ``PIP_CONFIG_FILE=/dev/null --isolated``, so the host's own pip
        configuration cannot add a source (a mirror host installs from the mirror and from nowhere else), with
        ``--no-cache-dir`` and its temporary files in ``<state_dir>/tmp``: nothing is written outside the
        environment and the state directory (an unprivileged login's home stays as it was).

    Proof:
        after the installs, ``cdna2/host/importcheck.py`` imports ``triton``, ``triton.runtime.autotuner`` and,
        where torch is a ROCm build, ``aiter``, each in its own process; a death by signal ("SIGSEGV, exit 139,
        while importing ...") or any failed import exits non-zero and fails the host. It runs only when something
        was installed, so a second run changes nothing.

    Dry run:
        the exact pip commands of each host are logged (``[host] wheels: ...`` lines) when the operation is
        first evaluated, which is during ``--dry``; pyinfra's own table shows only which hosts change.

    **Example:**

    .. code:: python

        plan = plan_wheels(load_matrix(host.data.wheel_matrix), probe, install_vllm=host.data.install_vllm)
        wheels.packages(
            name="Ensure ROCm-matched wheels, triton 3.7.1 last",
            plan=plan,
            state_dir="/var/lib/cdna2",
        )
    """
    if not isinstance(plan, WheelPlan):
        raise OperationTypeError(f"`plan` must be a WheelPlan, not {type(plan).__name__}")

    if not plan.actions:
        host.noop(f"wheels of {plan.python} already match {plan.matrix_path} (ROCm {plan.entry_version})")
        return

    if first_pass():
        for number, action in enumerate(plan.actions, 1):
            logger.info(f"{host.print_prefix}wheels: {number}. {action.description}")
            logger.info(f"{host.print_prefix}wheels:    {StringCommand(*map(QuoteString, action.argv))}")
    yield lease_command(plan.python, state_dir)
    yield StringCommand("mkdir", "-p", QuoteString(pip_temporary_dir(state_dir)))
    for action in plan.actions:
        yield pip_command(action, state_dir, plan.python)
    yield import_check_command(plan.python)


def pip_temporary_dir(state_dir: str) -> str:
    return f"{state_dir}/tmp"


def pip_command(action: PipAction, state_dir: str, target_python: str) -> StringCommand:
    """``action``'s pip command with its temporary files in ``<state_dir>/tmp`` (pip keeps no cache: the argv says
    --no-cache-dir), so pip writes nothing outside the environment and the state directory; that directory must
    exist. In a shared environment pip runs holding the environment's lock, like every other write to it."""
    argv = ("env", f"TMPDIR={pip_temporary_dir(state_dir)}", *action.argv)
    if shared_environment_of(state_dir) is not None:
        return agent_command(target_python, state_dir, "env_lock", "hold", "--state-dir", state_dir, "--", *argv)
    return StringCommand(*(QuoteString(arg) for arg in argv))

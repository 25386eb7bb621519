"""Small helpers shared by the deploy's operations."""

from __future__ import annotations

from pyinfra import logger, state
from pyinfra.api import FunctionCommand


def first_pass() -> bool:
    """Whether an operation body runs for the first time in this pyinfra invocation.

    Without -y the body runs at prepare (which is all of --dry) and again at execute; with -y only at execute.
    What an operation logs for the operator (planned commands, diffs) is logged on the first pass only, so --dry
    shows it and a real run shows it once.
    """
    return state.is_executing != state.should_check_for_changes()


def _fail_host(state, host, message: str) -> bool:
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def fail_host_command(message: str) -> FunctionCommand:
    """A command that fails this host at execute time with ``message``; other hosts go on."""
    return FunctionCommand(_fail_host, (message,), {})

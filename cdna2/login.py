"""Who the deploy acts as on a host, and where its state directory is: decided from host data and the probe.

A root login (or one through sudo) keeps the tool's state in ``/var/lib/cdna2``; an unprivileged login, as on an
HPC cluster, keeps it in its own XDG state directory (``$XDG_STATE_HOME/cdna2``, else ``~/.local/state/cdna2``),
which only the host can resolve (cdna2/host/probe.py, ``default_state_dir``). Host data's ``state_dir`` overrides
both. Every path the run writes outside the Python environment is under that directory.
"""

from __future__ import annotations

from typing import Any

from cdna2.host.environment import ROOT_STATE_DIR


def expected_state_dir(state_dir: str | None, ssh_user: str | None, sudo: bool, remembered: str | None) -> str | None:
    """The state directory the controller expects before the probe, so that the probe can run from the installed
    agent: host data's, root's when the login is root (or through sudo), else the one the last probe of this host
    reported (``remembered``), else None. A wrong expectation costs the probe its cached bytecode, never a wrong
    fact: the probe reports the real directory."""
    if state_dir:
        return state_dir
    if sudo or ssh_user in (None, "root"):
        return ROOT_STATE_DIR
    return remembered


def write_access_refusal(probe: dict[str, Any]) -> str | None:
    """Why this login cannot provision the host: the places the run would write that it may not, by path and why
    (a read-only environment, a directory of another owner), or None."""
    problems = probe.get("write_access") or []
    if not problems:
        return None
    user = probe["login"]["user"]
    listed = "; ".join(problem["why"] for problem in problems[:8])
    more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
    return (f"user {user} cannot write where the deploy must: {listed}{more}. Give {user} write access there (own "
            f"the environment, or point target_python at an environment {user} owns; set state_dir to a directory "
            f"{user} may write), or log in as a user who may")

"""Install this tool's host-side modules on the host, and build the commands that run them there."""

from __future__ import annotations

import getpass
import os
import socket
import uuid
from functools import cache

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from cdna2.agent import AgentBundle, agent_dir, build_agent_bundle
from cdna2.cache import cache_root
from cdna2.host.shared_env import shared_environment_of


# This controller run, as the host's run lease names it (cdna2/host/state.py): who, from where, which process.
RUN_ID = uuid.uuid4().hex[:12]
RUN = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} (run {RUN_ID})"


def agent_command(target_python: str, state_dir: str, module: str, *args: str) -> StringCommand:
    """``<target_python> -B -m cdna2.host.<module> ARGS`` run from the installed agent, every value quoted.

    ``-B``: the agent's bytecode is written once, at install (``agent_installed``); the commands only read it.
    ``CDNA2_RUN`` names this run: the host's locked commands hold the run lease for it.
    """
    return StringCommand(
        "env", QuoteString(f"PYTHONPATH={agent_dir(state_dir)}"), QuoteString(f"CDNA2_RUN={RUN}"),
        QuoteString(target_python), "-B", "-m", QuoteString(f"cdna2.host.{module}"),
        *(QuoteString(arg) for arg in args),
    )


def lease_command(target_python: str, state_dir: str) -> StringCommand:
    """Take (or keep) the host's run lease: the first command of every step that changes the host, so a second
    controller stops there, before it uploads or installs anything."""
    return agent_command(target_python, state_dir, "state", "lease", "--state-dir", state_dir)


def run_tag(state_dir: str) -> str:
    """A suffix for what this run uploads: ``-<run id>`` where another controller may upload the same file at once
    (a shared environment's state directory, cdna2/host/shared_env.py), else none: a host's own state directory is
    held by one controller run at a time (its run lease)."""
    return f"-{RUN_ID}" if shared_environment_of(state_dir) is not None else ""


@cache
def current_agent_bundle() -> AgentBundle:
    """The agent bundle of this checkout, built once per run."""
    return build_agent_bundle(cache_root())


@operation()
def agent_installed(bundle: AgentBundle, state_dir: str, installed_digest: str | None, target_python: str):
    """
    Install this tool's host-side modules (cdna2/host/) under ``<state_dir>/agent``.

    + bundle: the agent archive built on the controller and its tree digest
    + state_dir: the tool's state directory on the host
    + installed_digest: the digest of the installed agent, from the host probe (None when absent)
    + target_python: the interpreter that runs the agent; it compiles the agent's bytecode once, here

    The archive is unpacked into a staging directory and renamed into place, so a run never uses a half-copied
    agent. Nothing is uploaded when the installed agent already has the bundle's digest. The bytecode (left out of
    the agent's digest) is written once at install, so even the first probe after an upgrade does not compile.

    **Example:**

    .. code:: python

        agent_installed(
            name="agent: host-side modules are current",
            bundle=build_agent_bundle(cache_dir),
            state_dir="/var/lib/cdna2",
            installed_digest=probe["agent"]["digest"],
            target_python="/opt/venv/bin/python",
        )
    """
    if installed_digest == bundle.digest:
        host.noop(f"agent in {agent_dir(state_dir)} is current ({bundle.digest[:12]})")
        return
    target = agent_dir(state_dir)
    # Names of this run's own: in a shared environment another controller may install the same agent at once.
    staging, old = f"{target}.staging-{RUN_ID}", f"{target}.old-{RUN_ID}"
    remote_archive = f"{state_dir}/agent-{bundle.digest[:16]}-{RUN_ID}.tar.gz"
    yield StringCommand("mkdir", "-p", "-m", "0700", QuoteString(state_dir))  # root's alone (cdna2/host/state.py)
    yield FileUploadCommand(str(bundle.archive), remote_archive)
    yield StringCommand(
        "rm", "-rf", QuoteString(staging), "&&", "mkdir", QuoteString(staging),
        "&&", "tar", "-xzf", QuoteString(remote_archive), "-C", QuoteString(staging),
        "&&", "rm", "-f", QuoteString(remote_archive), "&&", "{",
        # The same agent in place already (another controller's, just installed): keep it.
        "[", "-d", QuoteString(target), "]", "&&", "diff", "-rq", "-x", "__pycache__", QuoteString(staging),
        QuoteString(target), ">/dev/null", "&&", "rm", "-rf", QuoteString(staging), "||", "{",
        "{", "[", "!", "-e", QuoteString(target), "]", "||", "mv", "-T", QuoteString(target), QuoteString(old), ";",
        "}",
        # mv -T onto a directory another installer put there meanwhile fails: theirs stays.
        "&&", "{", "mv", "-T", QuoteString(staging), QuoteString(target), "||", "rm", "-rf", QuoteString(staging), ";",
        "}", "&&", "rm", "-rf", QuoteString(old), ";", "}", ";", "}",
        "&&", QuoteString(target_python), "-m", "compileall", "-q", QuoteString(target),
    )

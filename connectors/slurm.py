"""pyinfra's ``@slurm/NODE`` connector: a node of the current Slurm allocation, reached through job steps.

Registered in the ``pyinfra.connectors`` entry point group (pyproject.toml; bin/setup installs it), so an inventory
names a node ``@slurm/nid001007`` and the host is called ``nid001007``. Like pyinfra's chroot and docker connectors
it wraps each command (``make_unix_command_for_host``: sudo, env, chdir as usual) in its own program, here
``srun --overlap --jobid=J -w NODE -N1 -n1 sh -c COMMAND`` (cdna2/slurm/steps.py). Uploads go to the step's stdin
byte for byte, downloads come from its stdout. A step Slurm refuses or ends (no such allocation, "Unable to create
step", a node down, a time limit) raises ``SlurmRefusal`` with Slurm's words: pyinfra fails that host with them,
never as the command's own exit status.

The fan-out: hosts of one allocation that issue a command at the same moment, as pyinfra's greenlets do when every
host runs the same fact or operation, share ONE job step across their nodes (``_Gathering``, cdna2/slurm/fanout.py);
each host gets its own node's output and exit status. A command one host alone issues (the writer of a shared
environment) runs in a step of its own. ``job_steps()`` counts the steps this run started.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections import Counter
from functools import cache
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from pyinfra import logger
from pyinfra.api.exceptions import ConnectError, InventoryError
from pyinfra.api.state import BaseStateCallback
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector, DataMeta
from pyinfra.connectors.util import CommandOutput, OutputLine, make_unix_command_for_host
from typing_extensions import override

from cdna2.slurm import fanout
from cdna2.slurm.allocation import SlurmError, expand_nodelist
from cdna2.slurm.steps import (TASK_EXIT, fanout_step_argv, gpus_of, job_of, job_state, node_step_argv,
                               slurm_refusal)

if TYPE_CHECKING:
    from pyinfra.api.host import Host

# How long the first host of a fan-out waits for others after the last one joined, when not every host of the
# allocation has. Running operations, pyinfra starts every host's greenlet at once, so the others join within
# milliseconds or not at all; running the deploy files (facts), a host may first wait on other work of its own
# (a subprocess on the controller), so the window is longer there.
GATHER_QUIET_S = {True: 0.1, False: 1.0}  # by state.is_executing
GATHER_TICK_S = 0.02
SCONTROL_TIMEOUT_S = 60


class SlurmRefusal(OSError):
    """Slurm refused or ended the job step: the command did not run (or was stopped) on the node. An OSError, so
    pyinfra fails the host with the message as it does for a lost SSH connection."""


_node_steps: Counter = Counter()  # node -> steps on it alone
_fanouts: list[int] = []  # nodes of each step across several
_latencies: list[float] = []
_refusals: dict[str, list[str]] = {}  # node -> Slurm's words, for the report


def refusals() -> dict[str, list[str]]:
    """The nodes whose steps Slurm refused or ended in this run, with its words."""
    return {node: list(words) for node, words in _refusals.items()}


def _refused(node: str, message: str) -> SlurmRefusal:
    _refusals.setdefault(node, []).append(message)
    return SlurmRefusal(message)


def job_steps() -> dict:
    """The job steps this process started: on one node (by node), across several (with the nodes they covered),
    and each step's wall time in seconds, for the report and the bench."""
    return {"steps": _node_steps.total() + len(_fanouts), "node_steps": _node_steps.total(),
            "node_steps_by_node": dict(sorted(_node_steps.items())), "fanout_steps": len(_fanouts),
            "fanout_nodes": sum(_fanouts), "latencies_s": list(_latencies)}


def _run_step(argv: list[str], nodes: list[str], stdin: bytes | None = None,
              timeout: float | None = None) -> tuple[int, bytes, list[str]]:
    if len(nodes) == 1:
        _node_steps[nodes[0]] += 1
    else:
        _fanouts.append(len(nodes))
    started = time.monotonic()
    try:
        result = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                timeout=timeout)
    except FileNotFoundError as error:
        raise SlurmRefusal(f"srun is not on PATH ({error}): load the Slurm module") from None
    except subprocess.TimeoutExpired:  # the command's _timeout: pyinfra reports a TimeoutError as one
        raise TimeoutError(f"job step on {', '.join(nodes)} still running after {timeout} s") from None
    finally:
        _latencies.append(time.monotonic() - started)
    return result.returncode, result.stdout, result.stderr.decode("utf-8", errors="replace").splitlines()


@cache
def _allocation_nodes(job: str) -> frozenset[str] | str:
    """The nodes of running job ``job``, or Slurm's words why it is not one (once per run and job)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                           timeout=SCONTROL_TIMEOUT_S)
    if shown.returncode != 0:
        return f"scontrol show job {job}: {shown.stderr.strip() or shown.stdout.strip()}"
    fields = job_state(shown.stdout)
    if fields.get("JobState") != "RUNNING":
        return (f"job {job} is {fields.get('JobState', 'unknown')} ({fields.get('Reason', 'no reason given')}), not "
                f"running: its allocation has ended; start a new one (salloc)")
    try:
        return frozenset(expand_nodelist(fields.get("NodeList", ""), f"job {job}'s NodeList"))
    except SlurmError as error:
        return str(error)


_allocation_lock = Semaphore()


class _OperationTracker(BaseStateCallback):
    """Which operation pyinfra is running on every host at once: only the hosts that have it issue its commands."""

    current: WeakKeyDictionary = WeakKeyDictionary()  # state -> op hash

    @staticmethod
    def operation_start(state, op_hash):  # type: ignore[override]
        _OperationTracker.current[state] = op_hash

    @staticmethod
    def install(state) -> None:
        if state not in _OperationTracker.current:
            _OperationTracker.current[state] = None
            state.add_callback_handler(_OperationTracker())


class _Gathering:
    """The hosts of one allocation that issued a command at the same moment, waiting for their step."""

    def __init__(self) -> None:
        self.commands: dict[str, str] = {}  # node -> its command
        self.done = Event()
        self.outcome: dict[str, tuple[int, CommandOutput] | SlurmRefusal] = {}


_gatherings: dict[tuple, _Gathering] = {}


class SlurmConnector(BaseConnector):
    """A node of the current Slurm allocation (``$SLURM_JOB_ID``, or host data ``slurm_job``)."""

    handles_execution = True
    data_meta = {
        "slurm_job": DataMeta("job id of the allocation holding the node (default: $SLURM_JOB_ID)"),
        "slurm_gpus": DataMeta("GPUs each step asks for on the node (default: $SLURM_GPUS_PER_NODE's count)"),
    }

    def __init__(self, state, host: Host):
        super().__init__(state, host)
        self.node = host.data.get("slurm_node") or host.name
        self.job = ""
        self.gpus: int | None = None

    @override
    @staticmethod
    def make_names_data(name: str | None = None):
        if not name:
            raise InventoryError("@slurm needs a node of the allocation: @slurm/<node>")
        yield name, {"slurm_node": name}, ["@slurm"]

    @override
    def connect(self) -> None:
        try:
            self.job = str(self.host.data.get("slurm_job") or job_of(os.environ))
        except SlurmError as error:
            raise ConnectError(str(error)) from None
        self.gpus = self.host.data.get("slurm_gpus") or gpus_of(os.environ)
        _OperationTracker.install(self.state)
        with _allocation_lock:  # one scontrol for all hosts of the job
            nodes = _allocation_nodes(self.job)
        if isinstance(nodes, str):
            raise ConnectError(f"{self.node}: {nodes}")
        if self.node not in nodes:
            raise ConnectError(f"{self.node} is not a node of job {self.job} ({', '.join(sorted(nodes)[:8])}"
                               f"{', ...' if len(nodes) > 8 else ''}): name the allocation's nodes")

    @override
    def run_shell_command(self, command, print_output: bool = False, print_input: bool = False, **arguments):
        arguments.pop("_get_pty", None)
        stdin = arguments.pop("_stdin", None)
        timeout = arguments.pop("_timeout", None)
        success_exit_codes = arguments.pop("_success_exit_codes", None)
        unix_command = make_unix_command_for_host(self.state, self.host, command, **arguments)
        if print_input:
            logger.info(f"{self.host.print_prefix}>>> {unix_command}")
        raw = unix_command.get_raw_value()
        if stdin is None and timeout is None:
            returncode, output = self._gathered(raw)
        else:
            data = stdin if isinstance(stdin, bytes) else "\n".join(stdin if isinstance(stdin, list) else [stdin])
            returncode, output = self._on_node(raw, data if isinstance(data, bytes) else data.encode(), timeout)
        if print_output:
            for line in output:
                logger.info(f"{self.host.print_prefix}{line.line}")
        return (returncode in success_exit_codes if success_exit_codes else returncode == 0), output

    def _step_refused(self, returncode: int, stderr: list[str]) -> None:
        words = slurm_refusal(returncode, stderr)
        if words:
            raise _refused(self.node, f"{self.node}: Slurm refused or ended the job step (job {self.job}): {words}")

    def _on_node(self, command: str, stdin: bytes | None = None,
                 timeout: float | None = None) -> tuple[int, CommandOutput]:
        returncode, stdout, stderr = _run_step(node_step_argv(self.job, self.node, command, self.gpus), [self.node],
                                               stdin, timeout)
        self._step_refused(returncode, stderr)
        # srun's line for the task's non-zero exit is Slurm's report of the status returned here, not the command's.
        return returncode, _output(stdout.decode("utf-8", errors="replace"),
                                   [line for line in stderr if not TASK_EXIT.match(line)])

    def _gathered(self, command: str) -> tuple[int, CommandOutput]:
        """Run ``command`` in a job step shared with the other hosts of this allocation that issue theirs now (the
        first of them leads: it waits for the others, starts the step, hands each its result)."""
        key = (self.job, self.gpus)
        gathering = _gatherings.get(key)
        leads = gathering is None
        if leads:
            gathering = _gatherings[key] = _Gathering()
        gathering.commands[self.node] = command
        if leads:
            self._wait_for_others(gathering)
            del _gatherings[key]
            try:
                self._run_gathering(gathering)
            finally:
                gathering.done.set()
        else:
            gathering.done.wait()
        outcome = gathering.outcome.get(self.node) or _refused(self.node, f"{self.node}: no result from the job step")
        if isinstance(outcome, SlurmRefusal):
            raise outcome
        return outcome

    def _wait_for_others(self, gathering: _Gathering) -> None:
        """Until every active host of this allocation joined, or none joined for the quiet window."""
        quiet = GATHER_QUIET_S[bool(self.state.is_executing)]
        joined, last_join = len(gathering.commands), time.monotonic()
        while not self._expected_nodes() <= gathering.commands.keys():
            gevent.sleep(GATHER_TICK_S)
            if len(gathering.commands) != joined:
                joined, last_join = len(gathering.commands), time.monotonic()
            elif time.monotonic() - last_join >= quiet:
                return

    def _expected_nodes(self) -> set[str]:
        """The nodes of this allocation that may issue a command now: while operations run, those that have the
        running operation; while the deploy files run, all of them."""
        operation = _OperationTracker.current.get(self.state) if self.state.is_executing else None
        return {host.data.get("slurm_node") or host.name for host in self.state.inventory.get_active_hosts()
                if host.connector_cls is SlurmConnector
                and str(host.data.get("slurm_job") or os.environ.get("SLURM_JOB_ID", "")) == self.job
                and (operation is None or operation in self.state.ops.get(host, {}))}

    def _run_gathering(self, gathering: _Gathering) -> None:
        batches = fanout.step_batches(gathering.commands) if len(gathering.commands) > 1 else None
        if batches is None:
            self._each_on_its_node(gathering, sorted(gathering.commands))
            return
        for nodes, arguments in batches:
            returncode, stdout, stderr = _run_step(fanout_step_argv(self.job, nodes, fanout.TASK_SCRIPT, *arguments,
                                                                    gpus=self.gpus), nodes)
            found = fanout.results(stdout.decode("utf-8", errors="replace"))
            if not found:
                # Slurm refused the whole step (it does when one of its nodes is no longer in the allocation):
                # each node is asked on its own, so the others still get their result and that one Slurm's words.
                self._each_on_its_node(gathering, nodes)
                continue
            words = slurm_refusal(returncode, stderr) or f"no result came back (srun exit {returncode})"
            for node in nodes:
                result = found.get(node)
                gathering.outcome[node] = (
                    (result.status, _output(result.stdout, result.stderr.splitlines())) if result else
                    _refused(node, f"{node}: Slurm refused or ended the job step (job {self.job}): {words}"))

    def _each_on_its_node(self, gathering: _Gathering, nodes: list[str]) -> None:
        for node in nodes:
            try:
                gathering.outcome[node] = _connector_of(self.state, self.job, node)._on_node(gathering.commands[node])
            except SlurmRefusal as refusal:
                gathering.outcome[node] = refusal

    @override
    def put_file(self, filename_or_io, remote_filename, remote_temp_filename=None, print_output: bool = False,
                 print_input: bool = False, **arguments) -> bool:
        with get_file_io(filename_or_io) as file_io:
            data = file_io.read()
        data = data.encode() if isinstance(data, str) else data
        # Written beside the target and renamed over it: a cut step leaves no half file under the final name.
        partial = f"{remote_filename}.partial-{uuid.uuid4().hex[:12]}"
        arguments = {key: value for key, value in arguments.items() if key != "_stdin"}
        status, output = self.run_shell_command(
            f"cat > '{_quoted(partial)}' && mv -f '{_quoted(partial)}' '{_quoted(remote_filename)}'",
            _stdin=data, **arguments)
        if not status:
            raise OSError(f"{self.node}: upload to {remote_filename} failed: {output.stderr}")
        return True

    @override
    def get_file(self, remote_filename, filename_or_io, remote_temp_filename=None, print_output: bool = False,
                 print_input: bool = False, **arguments) -> bool:
        unix_command = make_unix_command_for_host(self.state, self.host, f"cat '{_quoted(remote_filename)}'",
                                                  **{key: value for key, value in arguments.items()
                                                     if key not in ("_stdin", "_timeout", "_get_pty",
                                                                    "_success_exit_codes")})
        returncode, stdout, stderr = _run_step(node_step_argv(self.job, self.node, unix_command.get_raw_value(),
                                                              self.gpus), [self.node])
        self._step_refused(returncode, stderr)
        if returncode != 0:
            raise OSError(f"{self.node}: download of {remote_filename} failed: {' '.join(stderr)[-500:]}")
        with get_file_io(filename_or_io, "wb") as file_io:
            file_io.write(stdout)
        return True


def _quoted(path: str) -> str:
    """``path`` for inside single quotes."""
    return path.replace("'", "'\\''")


def _output(stdout: str, stderr: list[str]) -> CommandOutput:
    return CommandOutput([*(OutputLine("stdout", line) for line in stdout.splitlines()),
                          *(OutputLine("stderr", line) for line in stderr)])


def _connector_of(state, job: str, node: str) -> SlurmConnector:
    for host in state.inventory:
        connector = host.connector
        if isinstance(connector, SlurmConnector) and connector.job == job and connector.node == node:
            return connector
    raise KeyError(node)

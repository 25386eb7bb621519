"""Collect what the run decided and did on each host, and write the cluster report when the run ends.

pyinfra has no end-of-run hook and a reporting operation would count as a change on every run, so the report is
fed by a state callback (operation results, connection errors) and written by an exit handler on the controller.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback, State, StateStage

from cdna2.reports.run import CHANGED, FAILED, PLANNED, UNCHANGED, RunReport
from cdna2.slurm.steps import steps_summary
from connectors.slurm import SlurmConnector, job_steps, refusals
from operations.images import CommittedImages, settle_image_target

# Where reports go: reports/ under the directory pyinfra runs in, unless CDNA2_REPORT_DIR says otherwise.
def report_dir() -> Path:
    return Path(os.environ.get("CDNA2_REPORT_DIR") or "reports")


# pyinfra CLI options that take a value, so that the value is not mistaken for the inventory argument.
OPTIONS_WITH_VALUES = {
    "--limit", "--exclude", "--data", "--group-data", "--parallel", "--fail-percent", "--ssh-user", "--ssh-port",
    "--ssh-key", "--ssh-key-password", "--ssh-password", "--sudo-user", "--su-user", "--dzdo-user",
    "--shell-executable", "--chdir", "--config", "--retry", "--retry-delay",
}


def inventory_argument(arguments: list[str]) -> str:
    """The INVENTORY argument of a pyinfra command line, for the report's title."""
    words = iter(arguments)
    for word in words:
        if word in OPTIONS_WITH_VALUES:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "inventory"


def record_failure(host_name: str, step: str, detail: str) -> None:
    """Mark ``step`` of a host failed in this run's report, with why (for failures raised on the controller)."""
    if RunRecorder._current is not None:
        RunRecorder._current.report.step(host_name, step, FAILED, detail)


class RunRecorder(BaseStateCallback):
    """The one recorder of a pyinfra run; ``RunRecorder.install`` returns it from every host's deploy pass."""

    _current: RunRecorder | None = None

    def __init__(self, state: State, mode: str, inventory_name: str):
        self.state = state
        self.report = RunReport(mode=mode, inventory=inventory_name)

    @classmethod
    def install(cls, state: State, mode: str) -> RunRecorder:
        # deploy.py runs once per host; only the first pass creates and registers the recorder.
        if cls._current is None or cls._current.state is not state:
            cls._current = cls(state, mode, inventory_argument(sys.argv[1:]))
            state.add_callback_handler(cls._current)
            CommittedImages.install()
            atexit.register(cls._current.finish)
        return cls._current

    # pyinfra calls the callbacks as plain functions with the state first; these are bound methods of the
    # one recorder, so the state argument is the same object as self.state.
    def host_connect_error(self, state, host, error):  # type: ignore[override]
        row = self.report.host(host.name)
        row.connected = False
        row.errors.append(f"could not connect: {error}")

    def operation_end(self, state, op_hash):  # type: ignore[override]
        # Deploy operations are named "<step>: <desired state>", which ties each result to its report column.
        names = ", ".join(state.get_op_meta(op_hash).names)
        step_name = names.partition(":")[0]
        for host, operations in state.ops.items():
            if op_hash not in operations or not operations[op_hash].operation_meta.is_complete():
                continue
            meta = operations[op_hash].operation_meta
            row = self.report.host(host.name)
            step = row.steps.get(step_name)
            if meta.did_error():
                output = "; ".join(line for line in meta.stderr_lines[-5:] if line.strip())
                row.errors.append(f"{names} failed" + (f": {output}" if output else ""))
                if step is not None:
                    step.status = FAILED
            elif meta.did_change():
                row.changes.append(names)
                if step is not None and step.status in (PLANNED, UNCHANGED):
                    step.status = CHANGED
            elif step is not None and step.status == PLANNED:
                step.status = UNCHANGED

    def host_disconnect(self, state, host):  # type: ignore[override]
        # pyinfra has just committed an @docker image target: tag it or remove it before the report is written.
        settle_image_target(state, host, self.report.host(host.name), self.report.mode)

    def finish(self) -> None:
        self.report.executed = self.state.current_stage >= StateStage.Execute
        if any(isinstance(host.connector, SlurmConnector) for host in self.state.inventory):
            self.report.transport = steps_summary(job_steps())
            for node, words in refusals().items():  # raised as connection errors: pyinfra's op results lack them
                self.report.host(node).errors.extend(words)
        for host in self.state.failed_hosts:
            row = self.report.host(host.name)
            if row.status != FAILED:
                row.errors.append("failed (see the pyinfra output above)")
        json_path, markdown_path = self.report.write(report_dir())
        print("\n" + markdown_path.read_text(), file=sys.stderr)
        logger.info(f"--> Report written to {markdown_path} and {json_path} (every host, one row each: "
                    f"{markdown_path.with_name(markdown_path.stem + '-hosts.md')})")

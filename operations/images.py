"""Image and container targets (pyinfra's ``@docker/...`` connector): settle the committed image at disconnect.

pyinfra commits an ``@docker/IMAGE`` target's container when it disconnects from it, after the last operation,
on every run, and keeps the new image's id nowhere but in one log line (``docker build complete, image ID:
<12 hex>``). The run recorder calls ``settle_image_target`` from its ``host_disconnect`` callback, which pyinfra
triggers right after that commit, for the same host: the id is read from the log line this module's handler saw,
then ``cdna2.images.containers`` tags the image, keeps it or removes it, and the outcome goes into the host's report row.
A running container (``@docker/CONTAINER``) is patched in place and left running: nothing is committed.
"""

from __future__ import annotations

import logging
import re

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State, StateStage
from pyinfra.connectors.chroot import ChrootConnector
from pyinfra.connectors.docker import DockerConnector

from cdna2.images.containers import Engine, EngineError, decide, settle_image, short
from cdna2.reports.run import CHANGED, FAILED, SKIPPED, UNCHANGED, HostRow, StepResult

COMMITTED_LINE = re.compile(r"build complete, image ID: (?:\x1b\[[0-9;]*m)*([0-9a-f]{12})")
STEP = "image"


def is_container_target(host: Host) -> bool:
    """An ``@docker/...`` image or running container, or an ``@chroot/...`` Singularity image root (cdna2.images
    mounts one for ``python -m cdna2.images``): the only targets where host data may name the GPU arch."""
    return isinstance(host.connector, (DockerConnector, ChrootConnector))


class CommittedImages(logging.Handler):
    """The image ids pyinfra's docker connector logs as it commits, by the log line's host prefix."""

    _installed: CommittedImages | None = None

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[tuple[str, str]] = []  # (message, short image id)

    @classmethod
    def install(cls) -> CommittedImages:
        if cls._installed is None:
            cls._installed = cls()
            logger.addHandler(cls._installed)
        return cls._installed

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = COMMITTED_LINE.search(message)
        if match:
            self.lines.append((message, match.group(1)))

    def committed_by(self, host: Host) -> str | None:
        # Every pyinfra log line about a host starts with its print prefix ("[name] " with its padding).
        found = [image for message, image in self.lines if message.startswith(host.print_prefix)]
        return found[-1] if found else None


def _result_tag(mode: str, host: Host) -> str | None:
    return {"deploy": host.data.get("image_tag"), "rollback": host.data.get("rollback_image_tag")}.get(mode)


def settle_image_target(state: State, host: Host, row: HostRow, mode: str) -> None:
    """Tag, keep or remove the image pyinfra just committed for ``host``, and say so in its report row."""
    connector = host.connector
    if not isinstance(connector, DockerConnector):
        return
    engine = Engine(connector.docker_cmd)
    source = host.data.get("docker_identifier")
    if connector.no_stop:
        container = engine.container(connector.container_id) or {}
        image = container.get("Config", {}).get("Image", "?")
        row.details[STEP] = {"container": connector.container_id, "image": image, "left_running": True}
        row.steps[STEP] = StepResult(CHANGED if row.changes else UNCHANGED,
                                     f"container {connector.container_id[:12]} (image {image}) left running")
        return
    failed = row.status == FAILED or host in state.failed_hosts
    decision = decide(mode, executed=state.current_stage >= StateStage.Execute, failed=failed,
                      changed=bool(row.changes), tag=_result_tag(mode, host))
    try:
        outcome = settle_image(engine, source, CommittedImages.install().committed_by(host), decision)
    except EngineError as error:
        row.errors.append(f"image: {error}; remove or tag the committed image by hand (docker images)")
        row.steps[STEP] = StepResult(FAILED, str(error))
        return
    row.details[STEP] = outcome.to_json()
    status = SKIPPED if outcome.result_id is None else (CHANGED if outcome.result_id != outcome.source_id
                                                         else UNCHANGED)
    row.steps[STEP] = StepResult(status, outcome.summary())
    if outcome.result_id:
        logger.info(f"{host.print_prefix}result: {outcome.tag or 'untagged image'} {short(outcome.result_id)}")

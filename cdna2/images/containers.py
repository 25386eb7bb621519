"""Container images and containers as deploy targets: what becomes of the image a run commits.

pyinfra's ``@docker/IMAGE`` connector starts a container from the image, runs the deploy in it and, when it
disconnects, commits the container to a new untagged image, on every run: failed and ``--dry`` runs too. This
module decides what to do with that image (tag it, keep it, or remove it) and does it with the engine's command
line; ``operations/images.py`` calls it once per host when pyinfra disconnects.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass

# The committed image is tagged, kept untagged, removed, or removed because the source image is the result.
TAG, KEEP, REMOVE, SOURCE = "tag", "keep", "remove", "source"


class EngineError(RuntimeError):
    """A container engine command failed; the message names the command and what the engine said."""


@dataclass(frozen=True)
class Engine:
    """The engine's command line (``docker``, or ``podman``, which takes the same commands); DOCKER_HOST applies."""

    command: str = "docker"

    def run(self, *args: str) -> str:
        result = subprocess.run([self.command, *args], capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise EngineError(f"`{self.command} {' '.join(args)}` exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout.strip()

    def image_id(self, reference: str) -> str | None:
        """The full id (``sha256:...``) of an image by name, tag or id prefix; None when there is none."""
        try:
            return self.run("image", "inspect", "--format", "{{.Id}}", reference)
        except EngineError:
            return None

    def container(self, reference: str) -> dict | None:
        """``docker container inspect`` of a container, or None when there is no such container."""
        try:
            return json.loads(self.run("container", "inspect", reference))[0]
        except EngineError:
            return None

    def tag(self, image_id: str, tag: str) -> None:
        self.run("tag", image_id, tag)

    def remove_image(self, image_id: str) -> None:
        self.run("image", "rm", image_id)


@dataclass(frozen=True)
class ImageDecision:
    action: str  # TAG, KEEP, REMOVE or SOURCE
    tag: str | None  # the tag the result gets (the committed image for TAG, the source image for SOURCE)
    why: str


def decide(mode: str, executed: bool, failed: bool, changed: bool, tag: str | None) -> ImageDecision:
    """What becomes of the image pyinfra committed for a run of ``mode`` (deploy, verify, rollback).

    ``tag`` is the tag this mode's result gets (``image_tag`` for a deploy, ``rollback_image_tag`` for a rollback).
    Only a run that executed, succeeded and changed the container leaves a new image. One that changed nothing
    leaves the source image as the result (tagged, so a re-deploy of the tagged image leaves the tag where it was).
    """
    if not executed:
        return ImageDecision(REMOVE, None, "dry run: nothing was executed, the committed image is removed, no tag")
    if failed:
        return ImageDecision(REMOVE, None, "the run failed on this host: the committed image is removed, no tag")
    if mode == "verify":
        return ImageDecision(REMOVE, None, "verify changes nothing: the committed image is removed")
    if not changed:
        return ImageDecision(SOURCE, tag, "nothing changed: the source image is the result, the committed copy is "
                                          "removed")
    if tag is None:
        return ImageDecision(KEEP, None, "no tag set for this run's result: the committed image is kept untagged")
    return ImageDecision(TAG, tag, "the run changed it: the committed image is tagged")


@dataclass
class ImageOutcome:
    """What the report says about an image target: where it started, what the run left, and why."""

    source: str  # the image (or container) the target started from, as the inventory names it
    source_id: str | None
    committed_id: str | None  # what pyinfra committed (None for a running container: nothing is committed)
    result_id: str | None  # the image the run leaves as its result
    tag: str | None
    action: str
    why: str

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        result = f"{self.tag} = {short(self.result_id)}" if self.tag else f"image {short(self.result_id)}"
        if self.result_id is None:
            return f"{self.why}; from {self.source} ({short(self.source_id)})"
        return f"{result}, from {self.source} ({short(self.source_id)}): {self.why}"


def short(image_id: str | None) -> str:
    return image_id.removeprefix("sha256:")[:12] if image_id else "-"


def settle_image(engine: Engine, source: str, committed: str | None, decision: ImageDecision) -> ImageOutcome:
    """Carry out ``decision`` on the image pyinfra committed from ``source`` and say what the result is."""
    if committed is None:
        raise EngineError("pyinfra logged no committed image for this target (its INFO line `docker build complete, "
                          "image ID: ...`; a run with a quieter log level hides it), so it was neither tagged nor "
                          "removed")
    source_id, committed_id = engine.image_id(source), engine.image_id(committed)
    if committed_id is None:
        raise EngineError(f"pyinfra reported committing image {committed}, but the engine has no such image")
    if decision.action in (REMOVE, SOURCE):
        if committed_id != source_id:
            engine.remove_image(committed_id)
        result_id = source_id if decision.action == SOURCE else None
    else:
        result_id = committed_id
    if decision.tag and result_id:
        engine.tag(result_id, decision.tag)
    return ImageOutcome(source=source, source_id=source_id, committed_id=committed_id, result_id=result_id,
                        tag=decision.tag if result_id else None, action=decision.action, why=decision.why)

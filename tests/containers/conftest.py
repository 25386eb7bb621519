"""Fixtures for tests against a real container engine: the lab's own dockerd and its cached base image.

``engine``: the lab's dockerd (lab/engine.py) for the whole session: reused when it already runs, otherwise
started here and stopped by its pid at the end (``CDNA2_ENGINE_KEEP=1`` keeps it). Where this machine has no
engine (no dockerd), every container test is skipped with that reason.
``base_image``: the lab's base image (lab/images.py), built once per machine and reused by its content key.
``deployed``: one deploy of the base image, shared by every test that looks at its result.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cdna2.images.containers import Engine as EngineCli
from lab import images
from lab.engine import Engine, EngineUnavailable
from tests.lab.deploy_runner import REPO, DeployRun, run_pyinfra

INVENTORY = "inventory/images.py"


@pytest.fixture(scope="session")
def engine() -> Engine:
    daemon = Engine.default()
    try:
        started = daemon.start()
    except EngineUnavailable as error:
        pytest.skip(str(error))
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = daemon.docker_host  # for the docker CLI, pyinfra's connector and lab.images
    yield daemon
    if saved is None:
        os.environ.pop("DOCKER_HOST")
    else:
        os.environ["DOCKER_HOST"] = saved
    if started and not os.environ.get("CDNA2_ENGINE_KEEP"):
        daemon.stop()


@pytest.fixture(scope="session")
def docker(engine) -> EngineCli:
    return EngineCli()


@pytest.fixture(scope="session")
def base_image(docker) -> str:
    try:
        return images.base_image(docker)
    except EngineUnavailable as error:
        pytest.skip(str(error))


def deploy_image(play: str, source: str, report_dir: Path, *args: str) -> DeployRun:
    """``pyinfra -y inventory/images.py PLAY`` with ``source`` as the image target (nothing else in the inventory)."""
    os.environ["CDNA2_IMAGE"] = source
    try:
        return run_pyinfra("-y", play, "--limit", "images", *args, inventory=INVENTORY, report_dir=report_dir)
    finally:
        os.environ.pop("CDNA2_IMAGE")


def image_tag_for(source: str) -> str:
    """The tag inventory/images.py gives the result of deploying ``source``."""
    return f"local/vllm-mi210:{source.rpartition(':')[2].removesuffix('-cdna2')}-cdna2"


def all_image_ids(docker: EngineCli) -> set[str]:
    """Every image the engine holds, intermediate ones included."""
    return set(docker.run("images", "-a", "-q", "--no-trunc").split())


def run_in_image(image: str, script: str, *args: str) -> str:
    """``docker run --rm IMAGE python -c SCRIPT ARGS`` with this checkout's cdna2/ mounted read-only on PYTHONPATH."""
    result = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{REPO}/cdna2:/checkout/cdna2:ro",
                             "-e", "PYTHONPATH=/checkout", image, "python", "-c", script, *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"docker run {image} failed:\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="session")
def deployed(base_image, docker, tmp_path_factory) -> DeployRun:
    run = deploy_image("deploy.py", base_image, tmp_path_factory.mktemp("image-deploy"))
    assert run.returncode == 0, run.output[-5000:]
    yield run
    # The next session deploys again: its image and the untagged parents of this one would only fill the disk.
    docker.run("image", "rm", image_tag_for(base_image))

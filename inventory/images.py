"""pyinfra inventory of container targets: an image to build a gfx90a image from, and running containers.

    pyinfra -y inventory/images.py deploy.py      # the image, provisioned and tagged (see the report's image column)

``@docker/IMAGE`` (pyinfra's docker connector) starts a container from the image, runs the deploy in it with
``docker exec``, and commits the result when the run ends; the deploy tags that image ``image_tag`` when the run
changed it and succeeded, and removes it when the run failed or was ``--dry`` (operations/images.py). There is
no GPU at build time, so ``gpu_arch`` says which arch the image is for; a GPU the probe does find wins.
``@docker/CONTAINER`` is a running container (a vLLM server, say): patched in place and left running.

Here the image is the lab's base image (lab/images.py: real amd-aiter, triton 3.7.0 and vllm 0.26.0, a ROCm
stand-in, no GPU), built on first use; ``CDNA2_IMAGE`` names another one. ``CDNA2_CONTAINERS`` lists running
containers to add (comma-separated names or ids). The engine is the one ``DOCKER_HOST`` names (``python -m
lab.engine start`` prints it for the lab's own). A real cluster names its own image, for example
``rocm/vllm:rocm7.14.0_..._vllm_0.26.0``, a tag such as ``local/vllm-mi210:<source tag>-cdna2`` and the
wheel index its containers can reach (``wheel_index_url``); see README.md, "Container images".
"""

import os
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # pyinfra executes this file without the repository on sys.path
    sys.path.insert(0, str(_REPO))

from cdna2.images.containers import Engine  # noqa: E402 (needs the path set above)
from lab import images as lab_images  # noqa: E402

_SOURCE = os.environ.get("CDNA2_IMAGE") or lab_images.base_image(Engine())
_SOURCE_TAG = _SOURCE.rpartition(":")[2] if ":" in _SOURCE.rpartition("/")[2] else "latest"

_TARGET_DATA = {
    # Built without a GPU: the arch comes from here, and the GPU smoke checks say skipped with that reason.
    "gpu_arch": "gfx90a",
    # Containers here have no network: wheels come from the directory the lab's base image carries.
    "wheel_matrix": str(lab_images.wheel_matrix()),
    "wheel_find_links": lab_images.WHEELS_IN_IMAGE,
}

# A provisioned image deployed again keeps its tag (the source tag without the suffix, then the suffix again).
images = [(f"@docker/{_SOURCE}", {**_TARGET_DATA,
                                  "image_tag": f"local/vllm-mi210:{_SOURCE_TAG.removesuffix('-cdna2')}-cdna2"})]
containers = [(f"@docker/{name}", dict(_TARGET_DATA))
              for name in os.environ.get("CDNA2_CONTAINERS", "").split(",") if name]

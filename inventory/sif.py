"""pyinfra inventory of one Singularity/Apptainer image root, as ``python -m cdna2.images`` mounts it.

Not run by hand: ``python -m cdna2.images deploy IMAGE.sif`` mounts the image's root (and its layer, if any) under
a writable overlay in a mount namespace of its own, then runs ``pyinfra -y inventory/sif.py deploy.py`` with
``CDNA2_SIF_ROOT`` naming that root; pyinfra's ``@chroot`` connector runs the deploy inside it, and what the deploy
wrote (the overlay's upper directory) becomes the layer. There is no GPU at build time, so ``gpu_arch`` says which
arch the layer is for. ``CDNA2_SIF_WHEELS``: a find-links directory bound inside the root for the wheels step
(``--wheels DIR``); without it the image's own packages are used as they are.
"""

import os

_ROOT = os.environ["CDNA2_SIF_ROOT"]
_WHEELS = os.environ.get("CDNA2_SIF_WHEELS")

images = [(f"@chroot{_ROOT}", {
    "gpu_arch": "gfx90a",
    # The image's Python is the one provisioned (LUMI's images keep their venv at /opt/venv).
    "target_python": os.environ.get("CDNA2_SIF_PYTHON", "/opt/venv/bin/python"),
    "install_wheels": bool(_WHEELS),
    "wheel_find_links": _WHEELS,
    **({"wheel_matrix": os.environ["CDNA2_SIF_WHEEL_MATRIX"]} if os.environ.get("CDNA2_SIF_WHEEL_MATRIX") else {}),
})]

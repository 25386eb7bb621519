"""``python -m cdna2.images {deploy,rollback,check,show} IMAGE.sif``: a Singularity/Apptainer image as a target.

    python -m cdna2.images show IMAGE.sif               # the SIF's header and partitions (no mount, no root)
    python -m cdna2.images deploy IMAGE.sif --dry       # the deploy's diffs inside the image; nothing written
    python -m cdna2.images deploy IMAGE.sif             # writes IMAGE.gfx90a-layer.sqsh, its record, its wrapper
    python -m cdna2.images check IMAGE.sif              # image + layer as a read-only overlay: static smoke checks
                                                        # and `patch check` with the image's own Python
    python -m cdna2.images rollback IMAGE.sif           # removes the layer, its record and its wrapper

deploy and check mount the image (kernel SquashFS and overlay, in a mount namespace of their own) and need root.
Each prints a line for a person on stderr and, with --json, one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from cdna2.images import layer, sif
from cdna2.images.check import check_image


def _show(arguments) -> dict:
    image = sif.read_sif(arguments.image)
    root = image.primary_partition()
    return {"image": str(arguments.image), "arch": image.arch, "uuid": image.uuid,
            "descriptors": [sif.describe(d) for d in image.descriptors],
            "root": {"offset": root.offset, "size": root.size, "fstype": sif.FS_NAMES[root.partition[0]]}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m cdna2.images", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("deploy", "rollback", "check", "show"))
    parser.add_argument("image", type=Path, help="the .sif image (never written)")
    parser.add_argument("--dry", action="store_true", help="deploy: show the diffs, write nothing")
    parser.add_argument("--wheels", type=Path, metavar="DIR",
                        help="deploy: a directory of wheels (find-links) for the deploy's wheels step: triton 3.7.1, "
                             "and the matrix's amd-aiter for an image without it; the layer carries what it installs")
    parser.add_argument("--wheel-matrix", type=Path, metavar="FILE",
                        help="deploy: the wheel matrix (default: the packaged cdna2/data/wheel-matrix.yaml)")
    parser.add_argument("--python", default=layer.TARGET_PYTHON,
                        help="the image's Python environment (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    arguments = parser.parse_args(argv)
    try:
        if arguments.action == "show":
            result = _show(arguments)
            summary = f"{arguments.image}: root SquashFS at byte {result['root']['offset']}"
        elif arguments.action == "rollback":
            removed = layer.rollback(arguments.image)
            result = {"image": str(arguments.image), "removed": [str(path) for path in removed]}
            summary = f"removed {', '.join(p.name for p in removed)}" if removed else "no layer: nothing to remove"
        else:
            layer.enter_private_namespace(argv)
            if arguments.action == "deploy":
                outcome = layer.deploy(arguments.image, arguments.dry, arguments.wheels, arguments.wheel_matrix,
                                       arguments.python,
                                       progress=lambda line: print(line, file=sys.stderr))
                if arguments.dry or not arguments.json:
                    print(outcome.deploy_output, file=sys.stderr)
                result = asdict(outcome)
                result.pop("deploy_output")
                summary = f"{outcome.status}: {outcome.detail}" + (f"\nrun it with: {outcome.launch}"
                                                                    if outcome.launch else "")
            else:
                result = check_image(arguments.image, arguments.python)
                summary = result["summary"]
    except (layer.ImageTargetError, sif.SifError) as error:
        if arguments.json:
            print(json.dumps({"image": str(arguments.image), "status": "failed", "error": str(error)}))
        print(f"error: {error}", file=sys.stderr)
        return 1
    if arguments.json:
        print(json.dumps(result, sort_keys=True))
    print(summary, file=sys.stderr)
    return 1 if result.get("status") == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line of release qualification: ``python -m releases {coverage,gates,explain,triton-proofs} ...``.

Built like the product's (cdna2/__main__.py): each module registers its own sub-command.
"""

from __future__ import annotations

import sys

from cdna2.__main__ import main

COMMAND_MODULES = ("releases.coverage", "releases.gates", "releases.explain", "releases.triton_proofs")

if __name__ == "__main__":
    sys.exit(main(prog="python -m releases", modules=COMMAND_MODULES, description=__doc__.splitlines()[0]))

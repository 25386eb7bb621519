"""The host agent: this tool's host-side modules (cdna2/host/, standard library only), bundled for upload.

Steps that change a host run ``python -B -m cdna2.host.<module>`` there from ``<state_dir>/agent``. The bundle is
a deterministic archive, and its tree digest is what the probe reports for the installed copy, so an unchanged
agent is never uploaded again.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cdna2.archive import tree_archive
from cdna2.host.digests import tree_digest

PACKAGE_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class AgentBundle:
    archive: Path
    digest: str


def agent_dir(state_dir: str) -> str:
    return f"{state_dir.rstrip('/')}/agent"


def build_agent_bundle(cache_dir: Path) -> AgentBundle:
    """Bundle cdna2/__init__.py and cdna2/host/*.py as they are in this checkout."""
    with tempfile.TemporaryDirectory(prefix="cdna2-agent-") as scratch:
        tree = Path(scratch, "agent")
        (tree / "cdna2" / "host").mkdir(parents=True)
        shutil.copyfile(PACKAGE_ROOT / "__init__.py", tree / "cdna2" / "__init__.py")
        for module in sorted((PACKAGE_ROOT / "host").glob("*.py")):
            shutil.copyfile(module, tree / "cdna2" / "host" / module.name)
        digest = tree_digest(tree)
        archive = tree_archive(tree, cache_dir / "agent" / f"agent-{digest[:16]}.tar.gz")
    return AgentBundle(archive=archive, digest=digest)

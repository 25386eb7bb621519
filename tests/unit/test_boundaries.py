"""Architecture rules that keep the core testable and the host code runnable anywhere.

- cdna2/ never imports pyinfra: the logic runs and is tested without it.
- cdna2/host/ runs on provisioned hosts whose Python may hold nothing but AITER: standard library only.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "cdna2"


def imported_modules(path: Path) -> set[str]:
    """Full names of the modules a file imports absolutely."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def imported_top_level_modules(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_does_not_import_pyinfra(path: Path) -> None:
    assert not {"pyinfra", "pyinfra_cli"} & imported_top_level_modules(path), f"{path} imports pyinfra"


@pytest.mark.parametrize("path", sorted((CORE / "host").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_host_code_uses_only_the_standard_library(path: Path) -> None:
    # Imports of sibling host modules (cdna2.host.x) are allowed: the whole directory is shipped together.
    outside = {name for name in imported_modules(path)
               if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
               and not name.startswith("cdna2.host")}
    assert not outside, f"{path} imports non-stdlib modules {sorted(outside)}; hosts may not have them"

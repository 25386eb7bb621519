"""Architecture rules that keep the core testable and the host code runnable anywhere.

- cdna2/ never imports pyinfra: the logic runs and is tested without it.
- cdna2/host/ runs on provisioned hosts whose Python may hold nothing but AITER: standard library only.
- The product (cdna2/, operations/, the deploy files at the top) never imports the test lab (lab/) or release
  qualification (releases/): a controller runs a deploy without them, and a change to them cannot break it.
- No import circles among the product's modules: each module's imports (also those inside functions) point one way.
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


PRODUCT = sorted([*CORE.rglob("*.py"), *(ROOT / "operations").rglob("*.py"), *(ROOT / "connectors").rglob("*.py"),
                  *ROOT.glob("*.py")])
OUTSIDE_THE_PRODUCT = {"lab", "releases", "tests"}


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_product_never_imports_the_lab_or_release_qualification(path: Path) -> None:
    found = OUTSIDE_THE_PRODUCT & imported_top_level_modules(path)
    assert not found, f"{path} imports {sorted(found)}: the product must run without them"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules among ``paths`` (named from ``root``) it imports, anywhere in its code.
    ``from package import name`` is an edge to the submodule when ``name`` is one, else to the package."""
    modules = {module_name(path, root): path for path in paths}
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    levels = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*levels, *filter(None, [base])])
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:  # a name inside a module: the module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_product_has_no_import_circles() -> None:
    packages = sorted([*CORE.rglob("*.py"), *(ROOT / "operations").rglob("*.py")])
    graph = import_graph(packages)
    assert len(graph) > 50 and graph["cdna2.patches.cli"]  # the graph is read from the code, not empty
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("from .a import x\nimport pkg.d\n")
    (package / "d.py").write_text("")
    graph = import_graph(sorted(package.glob("*.py")), tmp_path)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a", "pkg.d"}, "pkg.d": set()}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]

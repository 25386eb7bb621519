"""How the gate runner imports vLLM without its dependencies: statement by statement, from the real trees.

vLLM's wheels are unpacked without their dependencies, so a vLLM module is loaded one top-level statement at a
time (StatementLoader, found by TreeFinder in the patched files first, then the stock tree): a top-level import that
fails binds the names it would have bound to ``Unavailable`` markers, which raise on any use (a gate that needs one
reports an error, never a value); a class whose bases cannot be built is rebuilt from its own body without them.
Every such substitution is listed in SUBSTITUTIONS for the result. amd-aiter is doubled by AiterDouble: found, but
every name taken from it is Unavailable (its compiled extensions cannot load without a GPU).
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import importlib.abc
import importlib.util
import marshal
import os
import sys
import types
from pathlib import Path


class Unavailable:
    """Stands for a name a vLLM module imports from a dependency that is not installed here; any use raises."""

    def __init__(self, name: str, reason: str) -> None:
        self._name, self._reason = name, reason

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is unavailable here ({self._reason})")

    __call__ = __getitem__ = __iter__ = __bool__ = _refuse

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        self._refuse()

    def __mro_entries__(self, bases):
        self._refuse()


class Substitutions:
    """What the loader put in place of vLLM's own objects, for the result."""

    def __init__(self) -> None:
        self.unavailable: dict[str, dict[str, str]] = {}  # module -> name -> reason
        self.rebuilt_classes: dict[str, dict[str, str]] = {}  # module -> class -> why its bases were dropped

    def to_json(self) -> dict:
        return {"unavailable": self.unavailable, "rebuilt_classes": self.rebuilt_classes}


SUBSTITUTIONS = Substitutions()


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            flags |= sum(getattr(__future__, alias.name).compiler_flag for alias in node.names)
    return flags


def _bind_unavailable(names: tuple[tuple[str, str], ...], namespace: dict, error: Exception) -> None:
    """Bind each name a failed import would have bound (``names``: imported name, bound name) to a marker."""
    reason = f"{type(error).__name__}: {error}"
    for imported, bound in names:
        namespace[bound] = Unavailable(imported, reason)
        SUBSTITUTIONS.unavailable.setdefault(namespace["__name__"], {})[bound] = reason


def _without_bases(node: ast.ClassDef) -> ast.ClassDef:
    rebuilt = ast.ClassDef(name=node.name, bases=[], keywords=[], body=node.body, decorator_list=[],
                           type_params=getattr(node, "type_params", []))
    return ast.fix_missing_locations(ast.copy_location(rebuilt, node))


IMPORT, CLASS, OTHER = "import", "class", "other"
BYTECODE_CACHE: Path | None = None  # set from the spec: compiled statements, keyed by the source bytes
STATEMENTS_FORMAT = b"2"  # what one cached statement holds (part of the key)


def _compile_statements(path: str, source: bytes) -> list[tuple[str, int, object, object]]:
    """(kind, line, code, fallback) per top-level statement. The fallback is what the loader needs when the statement
    fails, made here so that no process parses a module again: for an import, (imported name, bound name) pairs; for
    a class, its name and the class compiled without its bases."""
    tree = ast.parse(source, path)
    flags = _future_flags(tree)
    statements = []
    for node in tree.body:
        code = compile(ast.Module([node], []), path, "exec", flags=flags, dont_inherit=True)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = tuple((alias.name, alias.asname or alias.name.split(".")[0]) for alias in node.names)
            statements.append((IMPORT, node.lineno, code, names))
        elif isinstance(node, ast.ClassDef):
            # Annotations stay unevaluated in the rebuilt class: they may name unavailable types.
            rebuilt = compile(ast.Module([_without_bases(node)], []), path, "exec",
                              flags=flags | __future__.annotations.compiler_flag, dont_inherit=True)
            statements.append((CLASS, node.lineno, code, (node.name, rebuilt)))
        else:
            statements.append((OTHER, node.lineno, code, None))
    return statements


def compiled_statements(path: str) -> list[tuple[str, int, object, object]]:
    """``_compile_statements`` of a file; compiling vLLM statement by statement costs seconds per process,
    so the code objects are kept in BYTECODE_CACHE (marshal, like a .pyc) under the hash of the source."""
    source = Path(path).read_bytes()
    if BYTECODE_CACHE is None:
        return _compile_statements(path, source)
    key = hashlib.sha256(b"\0".join((STATEMENTS_FORMAT, sys.version.encode(), path.encode(), source))).hexdigest()
    cached = BYTECODE_CACHE / f"{key}.marshal"
    if cached.is_file():
        return marshal.loads(cached.read_bytes())
    statements = _compile_statements(path, source)
    BYTECODE_CACHE.mkdir(parents=True, exist_ok=True)
    staging = cached.with_name(f"{cached.name}.{os.getpid()}")
    staging.write_bytes(marshal.dumps(statements))
    staging.replace(cached)
    return statements


class StatementLoader(importlib.abc.Loader):
    """Executes a vLLM source file one top-level statement at a time (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        for kind, line, code, fallback in compiled_statements(self.path):
            try:
                exec(code, module.__dict__)
            except ImportError as error:
                if kind != IMPORT:
                    raise
                _bind_unavailable(fallback, module.__dict__, error)
            except Exception as error:
                if kind != CLASS:
                    raise ImportError(f"{self.path}:{line}: {type(error).__name__}: {error}") from error
                name, rebuilt = fallback
                exec(rebuilt, module.__dict__)
                SUBSTITUTIONS.rebuilt_classes.setdefault(module.__name__, {})[name] = f"{type(error).__name__}: {error}"


class AiterDouble(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Test double of an installed amd-aiter: ``find_spec("aiter")`` finds it and ``import aiter.x.y`` works, but its
    compiled extensions cannot load without a GPU, so every name taken from it is an Unavailable marker."""

    def __init__(self, directory: str | None = None) -> None:
        # The package directory find_spec("aiter") names (None: none), where a test puts the AITER files that
        # vllm-aiter-triton-ops' sliding-window record names by digest; nothing is imported from it.
        self.directory = directory

    def find_spec(self, name: str, path, target=None):
        if name != "aiter" and not name.startswith("aiter."):
            return None
        spec = importlib.util.spec_from_loader(name, self, is_package=True)
        if name == "aiter" and self.directory:
            spec.submodule_search_locations = [self.directory]
        return spec

    def create_module(self, spec):
        module = types.ModuleType(spec.name, "Test double of amd-aiter (no GPU here).")
        module.__path__ = list(spec.submodule_search_locations or [])

        def unavailable(attribute: str):
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            return Unavailable(f"{spec.name}.{attribute}", "AITER's compiled extensions cannot load without a GPU")

        module.__getattr__ = unavailable
        return module

    def exec_module(self, module) -> None:
        pass


class TreeFinder(importlib.abc.MetaPathFinder):
    """Finds vllm.* in the patched files first, then in the stock tree; loads them with StatementLoader."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        relative = Path(*name.split("."))
        for root in self.roots:
            package_init = root / relative / "__init__.py"
            if package_init.is_file():
                locations = [str(r / relative) for r in self.roots if (r / relative).is_dir()]
                return importlib.util.spec_from_file_location(name, package_init,
                                                              loader=StatementLoader(str(package_init)),
                                                              submodule_search_locations=locations)
            module_file = root / relative.with_suffix(".py")
            if module_file.is_file():
                return importlib.util.spec_from_file_location(name, module_file,
                                                              loader=StatementLoader(str(module_file)))
        return None  # a compiled extension (vllm._C, ...): the normal finders try it and it fails without a GPU


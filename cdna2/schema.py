"""Reading and checking this tool's data files (wheel matrix, patch sets, gfx90a-tree adaptations, kernel
families): YAML, and JSON Schema checks."""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

import jsonschema
import yaml

# libyaml's loader where PyYAML was built with it (its wheels are): the same documents for a tenth of the CPU (0.16
# -> 0.01 s for the data files every deploy, verify and rollback loads).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, through libyaml when it is there; raises yaml.YAMLError as safe_load does."""
    return yaml.load(text, Loader=_YAML_LOADER)


def json_path(parts: Iterable[str | int]) -> str:
    """``$.rocm[0].torch`` for the path parts ``["rocm", 0, "torch"]``."""
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)


def first_violation(document: Any, schema: dict) -> str | None:
    """``<JSON path>: <reason>`` of the first violation in document order, or None when ``document`` is valid."""
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document),
                    key=lambda error: list(error.absolute_path))
    return f"{json_path(errors[0].absolute_path)}: {errors[0].message}" if errors else None


def load_packaged(data_file: str, schema_file: str, error: type[Exception]) -> Any:
    """``cdna2/data/<data_file>`` (YAML), validated against ``cdna2/schemas/<schema_file>``: the first violation is
    raised as ``error("<file>: <JSON path>: <reason>")``."""
    source = resources.files("cdna2").joinpath("data", data_file)
    document = load_yaml(source.read_text())
    violation = first_violation(document, json.loads(resources.files("cdna2").joinpath("schemas", schema_file)
                                                     .read_text()))
    if violation:
        raise error(f"{source}: {violation}")
    return document

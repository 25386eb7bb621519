"""JSON Schema checks of this tool's data files (wheel matrix, patch sets, gfx90a-tree adaptations)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jsonschema


def json_path(parts: Iterable[str | int]) -> str:
    """``$.rocm[0].torch`` for the path parts ``["rocm", 0, "torch"]``."""
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)


def first_violation(document: Any, schema: dict) -> str | None:
    """``<JSON path>: <reason>`` of the first violation in document order, or None when ``document`` is valid."""
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document),
                    key=lambda error: list(error.absolute_path))
    return f"{json_path(errors[0].absolute_path)}: {errors[0].message}" if errors else None

"""Fixtures of release qualification: the patch engine's catalog fixture, shared with tests/unit/patches."""

from tests.unit.patches.conftest import catalog  # noqa: F401  (a fixture, used by name)

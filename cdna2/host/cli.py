"""How the host agent's commands end: the machine-readable result on stdout, a line for a person on stderr."""

from __future__ import annotations

import json
import sys


def finish(command: str, result: dict, error: str | None = None) -> int:
    """Print ``result`` as JSON on stdout; when ``error`` is given, also ``<command> failed: <error>`` on stderr.

    The controller reads the JSON; pyinfra and the deploy report show a failed command's stderr, so the reason a
    step failed on a host reaches the operator. Returns the exit status: 1 on failure, else 0.
    """
    print(json.dumps(result, sort_keys=True))
    if error is None:
        return 0
    print(f"{command} failed: {error}", file=sys.stderr)
    return 1

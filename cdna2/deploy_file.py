"""What `python deploy.py` (or verify.py, rollback.py, bench.py) says: these are pyinfra deploy files, not programs.

pyinfra executes a deploy file with globals that hold no ``__name__``, so the guard at the top of each file runs only
when Python itself is asked to run it, before anything imports pyinfra (which may not even be installed there).
"""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_USAGE = 2
PREVIEWED = ("deploy.py", "rollback.py")  # the files whose --dry is worth offering: they change hosts


def refuse_direct_run(path: str) -> None:
    """Say in one line what the file is and the command to type, then exit with status 2."""
    name = Path(path).name
    preview = " (add --dry to preview)" if name in PREVIEWED else ""
    print(f"{name} is a pyinfra deploy file, not a program: run it with pyinfra from the repository root, "
          f"e.g. `.venv/bin/pyinfra inventory/lab.py {name}`{preview}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)

"""Prove that triton (and AITER, where torch is a real ROCm build) import in a fresh process on this host.

Runs under the target Python after the wheel installs. Each module is imported in its own child interpreter
(``python -I -c "import X"``), because triton 3.7.0 kills the process with SIGSEGV inside ``triton/knobs.py`` on
AITER's import path while ``import triton`` alone still works: only a child can die without taking the report
with it. A death by signal is reported as such ("SIGSEGV, exit 139, while importing triton.runtime.autotuner").

``import aiter`` is checked only where torch imports and is a ROCm build (``torch.version.hip`` is set); otherwise
it is reported "unavailable" with the reason, never "passed" (AITER needs ROCm and torch to import at all).

Usage on the host: ``python importcheck.py [--also MODULE ...] [--timeout SECONDS]``. JSON goes to stdout, one
line per check to stderr; the exit code is 1 when any check failed, else 0. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

ALWAYS_CHECKED = ("triton", "triton.runtime.autotuner")
OUTPUT_TAIL = 4000  # characters of a failed child's output kept in the report
# Asks a child whether torch is a ROCm build, without importing anything else.
TORCH_PROBE = "import json, torch; print(json.dumps({'version': torch.__version__, 'hip': torch.version.hip}))"


def _child(code: str, timeout: float) -> subprocess.CompletedProcess | str:
    """Run ``code`` in a fresh isolated interpreter; a string says it timed out."""
    try:
        return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"


def signal_of(returncode: int) -> int | None:
    """The signal that ended a child: negative return codes from subprocess, 128+N from a wrapping shell."""
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else None
    if number is None:
        return None
    try:
        signal.Signals(number)
    except ValueError:
        return None
    return number


def describe_failure(module: str, returncode: int) -> str:
    number = signal_of(returncode)
    if number is not None:
        return f"{signal.Signals(number).name}, exit {128 + number}, while importing {module}"
    return f"exit {returncode} while importing {module}"


def _tail(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr)[-OUTPUT_TAIL:]


def check_import(module: str, timeout: float) -> dict:
    result = _child(f"import {module}", timeout)
    if isinstance(result, str):
        return {"module": module, "status": "failed", "message": f"{result} while importing {module}",
                "exit": None, "signal": None, "output": ""}
    if result.returncode == 0:
        return {"module": module, "status": "passed", "message": f"import {module} succeeded", "exit": 0,
                "signal": None, "output": ""}
    number = signal_of(result.returncode)
    return {"module": module, "status": "failed", "message": describe_failure(module, result.returncode),
            "exit": 128 + number if number is not None else result.returncode,
            "signal": signal.Signals(number).name if number is not None else None, "output": _tail(result)}


def torch_rocm_reason(timeout: float) -> str | None:
    """None when torch imports and is a ROCm build; otherwise why AITER cannot be checked here."""
    result = _child(TORCH_PROBE, timeout)
    if isinstance(result, str):
        return f"importing torch {result}"
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"torch does not import ({describe_failure('torch', result.returncode)}: {last_line})"
    torch_info = json.loads(result.stdout.strip().splitlines()[-1])
    if not torch_info["hip"]:
        return f"torch {torch_info['version']} is not a ROCm build (torch.version.hip is None)"
    return None


def run_checks(also: tuple[str, ...] = (), timeout: float = 900.0) -> dict:
    checks = [check_import(module, timeout) for module in ALWAYS_CHECKED]
    reason = torch_rocm_reason(timeout)
    if reason is None:
        checks.append(check_import("aiter", timeout))
    else:
        checks.append({"module": "aiter", "status": "unavailable", "message": f"aiter not checked: {reason}",
                       "exit": None, "signal": None, "output": ""})
    checks.extend(check_import(module, timeout) for module in also)
    return {"python": sys.executable, "ok": all(check["status"] != "failed" for check in checks), "checks": checks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--also", action="append", default=[], metavar="MODULE",
                        help="another module to import in its own process (repeatable)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed per import (AITER may JIT-build on first import)")
    args = parser.parse_args(argv)
    report = run_checks(tuple(args.also), args.timeout)
    print(json.dumps(report, indent=2))
    for check in report["checks"]:
        print(f"importcheck: {check['status']}: {check['message']}", file=sys.stderr)
        if check["output"]:
            print(check["output"], file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Running GPU work in child processes and proving what it loaded, for the smoke test and the benchmarks.

Each child runs isolated (``python -I``) from the state directory, in a session of its own; when it ends, or at its
time limit, whatever is left of its process group is killed and the JIT locks the group held are removed. Its
output is captured at fd level, so the kernel-load lines AITER and HIP print (``load_lines``) show which code
objects it loaded, and ``provenance_problem`` says when they are not the provisioned gfx90a tree's. Standard
library only; torch and aiter are imported only inside the children.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cdna2.host import importcheck, jit, smoke_gpu
from cdna2.host.smoke_static import named

# Kernel-load lines, captured at fd level in the GPU child. AITER 0.1.7.post2.dev18's AiterAsmKernel prints
# "[aiter] hipModuleLoad: <path> GetFunction: <symbol>" unconditionally; later AITER prints
# "[aiter] LoadKernel: <symbol> hsaco: <path>" at AITER_LOG_LEVEL=info; HIP's API trace (AMD_LOG_LEVEL=3,
# AMD_LOG_MASK=1) logs "hipModuleLoad ( <ptr>, <path> )", the only trace of loaders that print nothing (the
# fmha_v3_fwd loader of 0.1.7.post2.dev18).
LOAD_LINE_PATTERNS = (
    re.compile(r"LoadKernel: (?P<symbol>\S+) hsaco: (?P<path>\S+\.co)\b"),
    re.compile(r"hipModuleLoad: (?P<path>\S+\.co) GetFunction: (?P<symbol>\S+)"),
    re.compile(r"hipModuleLoad \( *\S+, *[\"']?(?P<path>[^\s\"')]+\.co)[\"']? *\)"),
)
GPU_CHILD_ENV = {"AITER_LOG_LEVEL": "info", "AMD_LOG_LEVEL": "3", "AMD_LOG_MASK": "1"}
AGENT_ROOT = Path(__file__).resolve().parents[2]  # holds cdna2/host, as <state_dir>/agent does on a host


@dataclass(frozen=True)
class GpuLimits:
    """Seconds each GPU child may take: the device probe, the warm-up (JIT builds, first loads), each case."""

    device: float = 120.0
    warmup: float = 3600.0
    case: float = 180.0


@dataclass(frozen=True)
class GpuRun:
    """Where the GPU children run and what they must use: the provisioned AITER and its gfx90a tree."""

    state_dir: Path  # the children's working directory: nothing in it shadows the installed aiter
    site_packages: Path  # holds the provisioned aiter/ and, under aiter/jit/build, its JIT locks
    tree: Path | None  # the provisioned hsa/gfx90a
    limits: GpuLimits


def process_group(pgid: int) -> set[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after "(comm)": state, ppid, pgrp, ...
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.add(int(stat.parent.name))
    return members


def kill_group(pgid: int, wait: float = 10.0) -> list[int]:
    """SIGKILL every process of group ``pgid`` and wait until none is left; the pids that were killed."""
    members = sorted(process_group(pgid))
    if members:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + wait
        while process_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return members


def run_in_own_group(command: list[str], run: GpuRun, env: dict[str, str], timeout: float) -> dict:
    """Run ``command`` in a session of its own from the state directory; after it ends, or at ``timeout``, kill
    whatever is left of its process group and remove the JIT locks the group held (a killed AITER build never
    releases its lock, and every later build would wait on it forever).

    Returns ``returncode`` (None when it was killed at the limit), ``stdout``, ``stderr`` and ``cleanup`` (what
    was killed and removed, for the detail; empty when nothing was).
    """
    with subprocess.Popen(command, cwd=run.state_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
            returncode = child.returncode
        except subprocess.TimeoutExpired:
            stdout, stderr, returncode = "", "", None
        held = jit.locks_held_by(run.site_packages, process_group(child.pid))
        killed = kill_group(child.pid)
        if returncode is None:
            try:
                stdout, stderr = child.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process that left the group still holds the pipes
                child.kill()
    removed = jit.remove_unheld(held)
    cleanup = []
    if killed:
        cleanup.append(f"killed its process group ({len(killed)} processes: {named([str(pid) for pid in killed])})")
    if removed:
        cleanup.append(f"removed the JIT locks it held: {named([str(lock) for lock in removed])}")
    return {"returncode": returncode, "stdout": stdout or "", "stderr": stderr or "", "cleanup": "; ".join(cleanup)}


# -I: isolated mode, so neither the working directory, PYTHONPATH nor the user's site-packages can put another
# aiter/ before the installed one; the agent is put on sys.path by hand instead. argv: AGENT_ROOT MODULE ARGS.
CHILD_BOOTSTRAP = ("import importlib, sys; sys.path.insert(0, sys.argv.pop(1)); "
                   "main = importlib.import_module('cdna2.host.' + sys.argv.pop(1)).main; sys.exit(main(sys.argv[1:]))")


def gpu_child(args: list[str], run: GpuRun, timeout: float, module: str = "smoke_gpu") -> dict:
    """Run ``cdna2.host.<module> ARGS`` (smoke_gpu, or bench_gpu for the benchmarks) in a fresh process group; its
    last stdout line is its JSON report.

    The child's captured fd output goes to a file here, so what it printed before dying is still reported.
    """
    env = {**os.environ, **GPU_CHILD_ENV}
    with tempfile.TemporaryDirectory(prefix="cdna2-smoke-", dir=run.state_dir) as scratch:  # the tool's own dir
        capture_file = Path(scratch, "captured.log")
        command = [sys.executable, "-I", "-B", "-c", CHILD_BOOTSTRAP, str(AGENT_ROOT), module, *args]
        if args[0] == "run":
            command += ["--capture-file", str(capture_file)]
        ended = run_in_own_group(command, run, env, timeout)
        cleanup = f"; {ended['cleanup']}" if ended["cleanup"] else ""
        if ended["returncode"] is None:
            return {"error": f"timed out after {timeout:g} s{cleanup}", "timed_out": True,
                    "captured_tail": tail_of(capture_file)}
        lines = ended["stdout"].strip().splitlines()
        if ended["returncode"] == 0 and lines and lines[-1].startswith("{"):
            return {**json.loads(lines[-1]), "cleanup": ended["cleanup"]}
        # AITER's HIP_CALL prints the HIP error and calls exit(0): a child can end "successfully" with no report.
        number = importcheck.signal_of(ended["returncode"])
        how = f"{signal.Signals(number).name} (exit {128 + number})" if number else f"exit {ended['returncode']}"
        tail = (ended["stdout"] + ended["stderr"]).strip()[-800:]
        return {"error": f"'{module} {' '.join(args)}' ended with {how} and no report{': ' + tail if tail else ''}"
                         f"{cleanup}", "captured_tail": tail_of(capture_file)}


def tail_of(path: Path) -> str:
    return path.read_bytes()[-smoke_gpu.CAPTURED_TAIL:].decode("utf-8", errors="replace") if path.is_file() else ""


def load_lines(captured: str) -> list[dict]:
    """Kernel-load lines in captured output: the code object's path (slashes collapsed) and the raw line."""
    loads = []
    for line in captured.splitlines():
        for pattern in LOAD_LINE_PATTERNS:
            match = pattern.search(line)
            if match:
                loads.append({"path": re.sub(r"/+", "/", match.group("path")), "line": line.strip()})
                break
    return loads


def within(path: str, directory: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def relative_in(path: str, directory: Path | None) -> str | None:
    """``path`` relative to ``directory`` (symlinks resolved), or None when it lies outside."""
    if directory is None or not within(path, directory):
        return None
    return Path(os.path.realpath(path)).relative_to(os.path.realpath(directory)).as_posix()


def proven_loads(loads: list[dict], tree: Path | None, pattern: str) -> list[str]:
    """The paths of the kernel-load lines naming a code object under the provisioned ``tree`` whose path there
    matches ``pattern``: what proves that a GPU check or a benchmark case ran the provisioned kernel."""
    return sorted({load["path"] for load in loads
                   if (inside := relative_in(load["path"], tree)) is not None and re.search(pattern, inside)})


def provenance_problem(report: dict, run: GpuRun) -> str | None:
    """Why the child's AITER is not the provisioned one: its ``aiter.__file__`` or ``AITER_ASM_DIR`` lies elsewhere."""
    package, aiter_file, asm_dir = run.site_packages / "aiter", report.get("aiter_file"), report.get("aiter_asm_dir")
    if not aiter_file or not within(aiter_file, package):
        return f"the child imported aiter from {aiter_file}, not from the provisioned {package}"
    tree = run.tree
    if tree is None or not asm_dir or os.path.realpath(asm_dir) not in (os.path.realpath(tree),
                                                                        os.path.realpath(tree.parent)):
        return f"AITER_ASM_DIR is {asm_dir}, not the provisioned kernel tree {tree} (or its hsa directory)"
    return None

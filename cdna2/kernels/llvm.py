"""The LLVM tools the translator drives: discovery, and batched disassembly, assembly and objdump listings.

Every call takes many instructions or files at once, in one process, because starting llvm-mc per instruction is
what made earlier tools take minutes; the engine runs such calls side by side in its worker processes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TRIPLE = "amdgcn-amd-amdhsa"
REQUIRED_TOOLS = ("llvm-mc", "llvm-objdump", "llvm-readelf")
REQUIRED_TARGETS = ("gfx942", "gfx90a")
INSTALL_HINT = ("point ROCM_LLVM_BIN at a directory holding " + ", ".join(REQUIRED_TOOLS) + " of an LLVM with the "
                "AMDGPU target that knows gfx942 and gfx90a (LLVM >= 17): ROCm's llvm/bin (set ROCM_PATH, or load "
                "the rocm module), a pip-installed ROCm (pip install rocm-sdk-devel), or a distribution's LLVM "
                "(Debian/Ubuntu: apt-get install llvm-22; no root needed for the other ways)")
_ENCODING = re.compile(r"^\t(.*?)\s*; encoding: \[([0-9a-fx,]*)\]", re.M)
_ASM_ERROR = re.compile(r"^<stdin>:(\d+):\d+: error: (.*)$", re.M)


class LlvmNotFoundError(RuntimeError):
    """No candidate directory holds LLVM tools that know both gfx942 and gfx90a."""


class LlvmOutputError(RuntimeError):
    """An LLVM tool answered in a way the translator cannot map back to its input."""


@dataclass(frozen=True)
class LlvmTools:
    bin_dir: Path
    version: str  # e.g. "22.1.8"
    banner: str  # the version line as the tool prints it; part of the cache key

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)


def _newest_first(paths: list[Path], version_of) -> list[Path]:
    """Versioned install directories, newest first; names that carry no version are left out."""
    versioned = []
    for path in paths:
        digits = re.findall(r"\d+", version_of(path))
        if digits:
            versioned.append((tuple(int(d) for d in digits), path))
    return [path for _, path in sorted(versioned, reverse=True)]


def candidate_dirs() -> list[Path]:
    """Where LLVM is looked for, in this order (docs/getting-started.md lists it for operators):

    1. ``$ROCM_LLVM_BIN``, alone: an explicit choice is never second-guessed;
    2. ROCm's own LLVM: ``$ROCM_PATH/llvm/bin`` (what HPC modules set), ``/opt/rocm/llvm/bin``, then versioned
       installs ``/opt/rocm-X.Y.Z/llvm/bin``, newest first;
    3. a pip-installed ROCm in the controller's Python (``rocm-sdk-devel``: ``_rocm_sdk_devel/lib/llvm/bin``);
    4. a distribution's LLVM: ``/usr/lib/llvm-N/bin`` (Debian, Ubuntu) and ``/usr/lib64/llvmN/bin`` (Fedora, RHEL,
       SUSE), newest first;
    5. the ``llvm-mc`` on ``PATH`` (a distribution's unversioned LLVM, a module, conda's ``llvmdev``).
    """
    if os.environ.get("ROCM_LLVM_BIN"):
        return [Path(os.environ["ROCM_LLVM_BIN"])]
    candidates = [Path(os.environ["ROCM_PATH"], "llvm/bin")] if os.environ.get("ROCM_PATH") else []
    candidates.append(Path("/opt/rocm/llvm/bin"))
    candidates += _newest_first(list(Path("/opt").glob("rocm-*/llvm/bin")), lambda p: p.parent.parent.name)
    candidates += [Path(entry, "_rocm_sdk_devel/lib/llvm/bin") for entry in sys.path if entry.endswith("site-packages")]
    candidates += _newest_first([*Path("/usr/lib").glob("llvm-*/bin"), *Path("/usr/lib64").glob("llvm*/bin")],
                                lambda p: p.parent.name.removeprefix("llvm-").removeprefix("llvm"))
    on_path = shutil.which("llvm-mc")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    unique: list[Path] = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def _why_unusable(bin_dir: Path) -> str | None:
    missing = [name for name in REQUIRED_TOOLS if not (bin_dir / name).is_file()]
    if missing:
        return f"missing {', '.join(missing)}"
    for target in REQUIRED_TARGETS:
        result = subprocess.run([str(bin_dir / "llvm-mc"), f"-triple={TRIPLE}", f"-mcpu={target}", "-show-encoding"],
                                input="s_nop 0\n", capture_output=True, text=True)
        if result.returncode != 0 or "not a recognized processor" in result.stderr:
            return f"llvm-mc does not know {target}: {result.stderr.strip()[:200]}"
    return None


def find_llvm() -> LlvmTools:
    """The first candidate directory whose llvm-mc, llvm-objdump and llvm-readelf know gfx942 and gfx90a."""
    reasons = []
    for bin_dir in candidate_dirs():
        why = _why_unusable(bin_dir)
        if why is None:
            banner = subprocess.run([str(bin_dir / "llvm-mc"), "--version"], capture_output=True, text=True).stdout
            line = next((l.strip() for l in banner.splitlines() if "version" in l.lower()), banner.strip())
            match = re.search(r"version\s+(\S+)", line)
            return LlvmTools(bin_dir=bin_dir, version=match.group(1) if match else line, banner=line)
        reasons.append(f"{bin_dir}: {why}")
    raise LlvmNotFoundError("no usable LLVM found; tried\n  " + "\n  ".join(reasons) + "\nFix: " + INSTALL_HINT)


def _scratch_file() -> IO[bytes]:
    """An unnamed file for a tool's input or output: in memory where the system can (memfd), else in /tmp.
    llvm-objdump makes a write() per line: its 62 MB listing of the 178 kernels cost 0.73-0.78 s of system time into
    a memfd, 0.84-0.94 s into a file in an ext4 /tmp."""
    if hasattr(os, "memfd_create"):
        return open(os.memfd_create("cdna2-llvm"), "w+b")
    return tempfile.TemporaryFile()


def run(argv: list[str], input_text: str | None = None) -> subprocess.CompletedProcess:
    """Run a tool with its output in unnamed files: reading tens of MB through pipes costs seconds in poll()."""
    with _scratch_file() as stdin, _scratch_file() as stdout, _scratch_file() as stderr:
        if input_text is not None:
            stdin.write(input_text.encode())
            stdin.seek(0)
        returncode = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=stderr).returncode
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(argv, returncode, stdout.read().decode(errors="replace"),
                                           stderr.read().decode(errors="replace"))


def _mc(tools: LlvmTools, mcpu: str, text: str, *extra: str) -> subprocess.CompletedProcess:
    return run([tools.tool("llvm-mc"), f"-triple={TRIPLE}", f"-mcpu={mcpu}", "-show-encoding", *extra], text)


def _bytes_of(encoding: str) -> bytes:
    """`0x01,0xff` as llvm-mc prints an encoding -> the bytes."""
    return bytes.fromhex(encoding.replace("0x", "").replace(",", ""))


def _encodings_text(chunks: list[bytes]) -> str:
    """The chunks as llvm-mc prints encodings (`0xe7,0x30,...`), a line each: the disassembler's input, and what its
    output must echo. Built by C-level bytes.hex and str.replace: a Python format per byte cost the parent 0.5 s."""
    return "0x" + "\n".join(chunk.hex(",") for chunk in chunks).replace(",", ",0x").replace("\n", "\n0x")


def decode(tools: LlvmTools, chunks: list[bytes], mcpu: str) -> list[str | None]:
    """Each chunk's instruction text, or None where LLVM does not decode exactly that chunk as one instruction."""
    if not chunks:
        return []
    source = _encodings_text(chunks)
    result = _mc(tools, mcpu, source + "\n", "-disassemble")
    decoded = _ENCODING.findall(result.stdout)
    if len(decoded) == len(chunks) and ("\n".join(enc for _, enc in decoded) == source
                                        or all(_bytes_of(enc) == chunk for (_, enc), chunk in zip(decoded, chunks))):
        return [text for text, _ in decoded]
    if len(chunks) == 1:
        return [None]  # LLVM cannot decode exactly these bytes as one instruction
    # Something in the batch is undecodable or split differently: bisect to isolate it.
    half = len(chunks) // 2
    return decode(tools, chunks[:half], mcpu) + decode(tools, chunks[half:], mcpu)


def assemble(tools: LlvmTools, texts: list[str], mcpu: str) -> list[tuple[bytes | None, str | None]]:
    """(encoding, None) for each text the assembler accepts for `mcpu`, else (None, its error message)."""
    if not texts:
        return []
    result = _mc(tools, mcpu, "".join(t + "\n" for t in texts))
    errors: dict[int, str] = {}
    for line, message in _ASM_ERROR.findall(result.stderr):
        errors.setdefault(int(line) - 1, message)
    encodings = iter(_ENCODING.findall(result.stdout))
    out = []
    for index, text in enumerate(texts):
        if index in errors:
            out.append((None, errors[index]))
            continue
        echoed, encoding = next(encodings, (None, None))
        if encoding is None:
            raise LlvmOutputError(f"llvm-mc -mcpu={mcpu} printed fewer encodings than it accepted lines "
                                  f"(line {index + 1}: {text!r}); stderr: {result.stderr[-500:]}")
        out.append((_bytes_of(encoding), None))
    if next(encodings, None) is not None:
        raise LlvmOutputError(f"llvm-mc -mcpu={mcpu} printed more encodings than it was given lines")
    return out


_OBJDUMP_FILE_HEADER = ":\tfile format "
_OBJDUMP_PADDING = re.compile(r" *// ")


def objdump_lines(tools: LlvmTools, paths: list[Path], mcpu: str) -> dict[str, list[str]]:
    """llvm-objdump's instruction lines per file, exactly as printed (see objdump_line_around_address)."""
    result = run([tools.tool("llvm-objdump"), "-d", f"--mcpu={mcpu}", *map(str, paths)])
    if result.returncode != 0:
        raise LlvmOutputError(f"llvm-objdump --mcpu={mcpu} failed: {result.stderr.strip()[-500:]}")
    # Each file starts with "<path>:\tfile format elf64-amdgpu"; the path is the last line before the marker.
    parts = result.stdout.split(_OBJDUMP_FILE_HEADER)
    listings = {}
    for before, body in zip(parts, parts[1:]):
        name = before.rpartition("\n")[2]
        listings[name] = [line for line in body.split("\n") if line.startswith("\t")]
    return listings


def objdump_words(encoding: bytes) -> str:
    """An encoding as llvm-objdump prints it: 32-bit words (little-endian) in upper-case hex, separated by spaces."""
    return " ".join(encoding[i:i + 4][::-1].hex().upper() for i in range(0, len(encoding), 4))


def objdump_line_around_address(text: str, encoding: bytes) -> tuple[str, str]:
    """An instruction line as llvm-objdump prints it for AMDGPU is head + f"{address:012X}" + tail: the head is a tab
    and the text left-justified to 60 columns, then `// `; the tail `: ` and the encoding's words."""
    return f"{chr(9) + text:<60}// ", f": {objdump_words(encoding)}"


def normalised(line: str) -> str:
    """An objdump line with the alignment padding removed, for comparing lines laid out differently."""
    return _OBJDUMP_PADDING.sub(" // ", line, count=1)


def parse_objdump_line(line: str) -> tuple[int, str, str]:
    """(address, text, words) of one objdump instruction line."""
    text, separator, location = normalised(line).rpartition(" // ")
    address, colon, words = location.partition(": ")
    if not separator or not colon:
        raise LlvmOutputError(f"unexpected llvm-objdump line: {line!r}")
    return int(address, 16), text.strip(), words.strip()


def readelf_notes(tools: LlvmTools, paths: list[Path]) -> dict[str, str]:
    """llvm-readelf's header and notes text per file."""
    result = run([tools.tool("llvm-readelf"), "-h", "--notes", *map(str, paths)])
    if result.returncode != 0:
        raise LlvmOutputError(f"llvm-readelf failed: {result.stderr.strip()[-500:]}")
    per_file: dict[str, str] = {}
    chunks = re.split(r"^File: (.*)$", result.stdout, flags=re.M)
    if len(paths) == 1 and len(chunks) == 1:
        return {str(paths[0]): result.stdout}
    for name, body in zip(chunks[1::2], chunks[2::2]):
        per_file[name.strip()] = body
    return per_file


def target_errors(tools: LlvmTools, paths: list[Path], target: str) -> dict[str, str]:
    """Why, per file whose llvm-readelf header flags or metadata target lines do not all name `target` (a file
    absent from the answer names it everywhere)."""
    notes = readelf_notes(tools, paths)
    errors = {}
    for path in map(str, paths):
        lines = [" ".join(line.split()) for line in notes.get(path, "").splitlines()
                 if line.strip().startswith(("Flags:", "amdhsa.target:"))]
        if not any(line.startswith("Flags:") for line in lines):
            errors[path] = "llvm-readelf printed no header flags"
        elif wrong := [line for line in lines if target not in line]:
            errors[path] = f"llvm-readelf does not say {target}: {'; '.join(wrong)}"
    return errors

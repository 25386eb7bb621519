"""The lab's package mirror: a find-links wheelhouse, a PEP 503 index over it, and the lab's wheel matrix.

It holds what the lab's matrix names, taken from the cached wheelhouse (lab/wheelhouse.py), so nothing is
downloaded per host: the real amd-aiter and its dependencies, triton 3.7.0 and 3.7.1, and vLLM. ROCm builds of
torch cannot be had here and no stand-in is made: the lab's matrix leaves torch out (an entry without ``torch``
leaves torch unmanaged), so on lab hosts ``import aiter`` is reported unavailable by the import check.

Layout under the mirror root (default ``.lab/mirror``, readable from the lab hosts, which see the controller's
filesystem except /opt/rocm, /opt/venv, /var/lib/cdna2 and /tmp):

    wheels/             the wheels (symlinks into the wheelhouse cache): a find-links directory
    simple/             a PEP 503 index over wheels/, with sha256 fragments, for ``serve``
    wheel-matrix.yaml   the lab's wheel matrix (schema wheel-matrix-1.0)

    python -m lab.mirror build                 # (re)build the mirror; prints its root
    python -m lab.mirror serve --port 8631     # serve it on 127.0.0.1 until interrupted (or --seconds)
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml
from packaging.utils import canonicalize_name, parse_wheel_filename

from cdna2.host.digests import file_sha256
from lab import kinds, wheelhouse

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".lab" / "mirror"
LAB_VLLM = "vllm==0.26.0"
# The index the lab's wheels really come from: a lab host given no mirror would take them from there.
PYPI = "https://pypi.org/simple"
# The lab hosts' interpreter is Debian 12's /usr/bin/python3 (lab/venvs.py).
LAB_PYTHON_VERSIONS = ("3.11",)


def _version(requirement: str) -> str:
    return requirement.partition("==")[2]


def lab_rocm_versions() -> tuple[str, ...]:
    """major.minor of every lab kind's ROCm stand-in, in lab order."""
    versions = (".".join(kind.rocm_version.split(".")[:2]) for kind in kinds.KINDS)
    return tuple(dict.fromkeys(versions))


def lab_matrix(rocm_versions: tuple[str, ...]) -> dict:
    """The lab's wheel matrix: one entry per ROCm version, naming exactly what the mirror holds."""
    def entry(version: str) -> dict:
        return {
            "version": version,
            "note": "lab: torch is left out (no ROCm torch can be had here); everything else is real PyPI wheels",
            "python": list(LAB_PYTHON_VERSIONS),
            "amd_aiter": {"version": _version(wheelhouse.AITER), "index_url": PYPI},
            "vllm": {"version": _version(LAB_VLLM), "index_url": PYPI, "no_deps": True},
            "triton": {"version": _version(wheelhouse.TRITON_PINNED), "index_url": PYPI, "no_deps": True},
        }
    return {"$schema": "wheel-matrix-1.0.json", "rocm": [entry(version) for version in rocm_versions]}


def matrix_yaml(rocm_versions: tuple[str, ...]) -> str:
    return ("# The lab's wheel matrix, written by lab/mirror.py: what the lab mirror holds, per lab ROCm version.\n"
            + yaml.safe_dump(lab_matrix(rocm_versions), sort_keys=False))


def _aiter_closure() -> list[Path]:
    """amd-aiter and its dependencies as pip resolves them from the wheelhouse cache alone."""
    wheelhouse.wheel(wheelhouse.AITER, with_deps=True)
    cache = wheelhouse.cache_root() / "wheels"
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--dry-run", "--ignore-installed",
                   "--disable-pip-version-check", "--no-index", "--find-links", str(cache), "--report",
                   str(report_path), wheelhouse.AITER]
        # PIP_CONFIG_FILE=/dev/null: this machine's pip configuration adds find-links the mirror must not draw on.
        result = subprocess.run(command, capture_output=True, text=True,
                                env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
        if result.returncode != 0:
            raise RuntimeError(f"resolving {wheelhouse.AITER} from {cache} failed (exit {result.returncode}):\n"
                               f"{result.stderr[-4000:]}")
        report = json.loads(report_path.read_text())
    return [Path(unquote(urlparse(item["download_info"]["url"]).path)) for item in report["install"]]


def mirror_wheels() -> list[Path]:
    """Every cached wheel the lab's matrix needs."""
    named = [wheelhouse.wheel(requirement)
             for requirement in (wheelhouse.TRITON_BROKEN, wheelhouse.TRITON_PINNED, LAB_VLLM)]
    return sorted(set(_aiter_closure() + named), key=lambda path: path.name)


def _write_simple_index(root: Path, wheels: list[Path]) -> None:
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_project.setdefault(canonicalize_name(parse_wheel_filename(wheel.name)[0]), []).append(wheel)
    simple = root / "simple"
    simple.mkdir()
    links = "".join(f'<a href="{name}/">{name}</a>\n' for name in sorted(by_project))
    (simple / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for name, files in by_project.items():
        (simple / name).mkdir()
        anchors = "".join(f'<a href="../../wheels/{html.escape(wheel.name)}#sha256={file_sha256(wheel)}">'
                          f"{html.escape(wheel.name)}</a>\n" for wheel in sorted(files))
        (simple / name / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n")


def build(root: Path = DEFAULT_ROOT, rocm_versions: tuple[str, ...] | None = None) -> Path:
    """(Re)build the mirror at ``root``: staged beside it, then renamed into place. Returns ``root``."""
    wheels = mirror_wheels()
    staging = root.with_name(root.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "wheels").mkdir(parents=True)
    for wheel in wheels:
        (staging / "wheels" / wheel.name).symlink_to(wheel.resolve())
    _write_simple_index(staging, wheels)
    (staging / "wheel-matrix.yaml").write_text(matrix_yaml(rocm_versions or lab_rocm_versions()))
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    return root


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the signature is http.server's
        self.server.requested_paths.append(self.path)


class MirrorServer:
    """The mirror's PEP 503 index, served over HTTP on a loopback address until ``stop()``.

    ``requested_paths`` lists every path a client asked for, so a test can prove where pip took its wheels from.
    """

    def __init__(self, root: Path = DEFAULT_ROOT, address: str = "127.0.0.1", port: int = 0):
        if not (root / "simple" / "index.html").is_file():
            raise FileNotFoundError(f"{root} holds no mirror; run `python -m lab.mirror build` first")
        self._server = ThreadingHTTPServer((address, port), partial(_QuietHandler, directory=str(root)))
        self._server.requested_paths = []
        self._thread = threading.Thread(target=self._server.serve_forever, name="lab-mirror", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        address, port = self._server.server_address[:2]
        return f"http://{address}:{port}/simple"

    @property
    def requested_paths(self) -> list[str]:
        return list(self._server.requested_paths)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MirrorServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.mirror", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"mirror directory (default {DEFAULT_ROOT})")
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="(re)build the mirror from the wheelhouse cache")
    build_parser.add_argument("--rocm", action="append", default=None,
                              help="a ROCm version (major.minor) of the lab matrix (repeatable; default: the kinds')")
    serve_parser = commands.add_parser("serve", help="serve the mirror's PEP 503 index on a loopback address")
    serve_parser.add_argument("--address", default="127.0.0.1")
    serve_parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve_parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
    args = parser.parse_args(argv)
    if args.command == "build":
        root = build(args.root, tuple(args.rocm) if args.rocm else None)
        print(json.dumps({"root": str(root), "find_links": str(root / "wheels"),
                          "matrix": str(root / "wheel-matrix.yaml"),
                          "wheels": sorted(path.name for path in (root / "wheels").iterdir())}, indent=2))
        return 0
    with MirrorServer(args.root, args.address, args.port) as server:
        print(json.dumps({"index_url": server.url}), flush=True)
        try:
            time.sleep(args.seconds) if args.seconds is not None else threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line of release qualification: ``python -m releases {coverage,gates,explain} ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from releases import coverage, explain, gates


def _gates(args: argparse.Namespace) -> int:
    return gates.command(Path(args.json) if args.json else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m releases", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    covered = subparsers.add_parser("coverage", help="every patch set on every known AITER and vLLM release (real "
                                                     "trees, cached), the whole patch cycle on each")
    covered.add_argument("--json", action="store_true", help="print JSON instead of the table")
    covered.set_defaults(func=lambda args: coverage.command(args.json))
    gated = subparsers.add_parser("gates", help="vLLM's arch gates and attention backend selection on every vLLM "
                                                "release, stock and patched, on gfx90a and gfx942")
    gated.add_argument("--json", metavar="FILE", help="also write the results to FILE (the table goes to stdout)")
    gated.set_defaults(func=_gates)
    explain.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Command line of the core package: ``python -m cdna2 <command> ...``.

Each command group lives in its own module, which exposes ``register(subparsers)``: it adds its sub-commands and
sets ``func`` on each to a callable taking the parsed arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that register command groups, in the order `--help` lists them.
COMMAND_MODULES = (
    "cdna2.kernels.cli",  # translate, classify
    "cdna2.patches.cli",  # patch {plan,apply,check,revert}
    "cdna2.wheels",  # wheels plan
    "cdna2.hostdata",  # validate-data
    "cdna2.bench",  # bench
    "cdna2.triton.cli",  # triton-configs
)


def build_parser(prog: str = "python -m cdna2", modules: tuple[str, ...] = COMMAND_MODULES,
                 description: str = __doc__.splitlines()[0]) -> argparse.ArgumentParser:
    """One sub-command group per module of ``modules``, each added by its ``register(subparsers)``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None, **parser_options) -> int:
    args = build_parser(**parser_options).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

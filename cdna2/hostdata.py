"""Validate every host's data against the host-data schema before anything runs.

One bad host stops the whole run: an operator who misspells a key on one node expects nothing to change anywhere
until it is fixed, not a cluster where some nodes were provisioned with the default instead.

Command line: ``pyinfra INVENTORY debug-inventory --json | python -m cdna2 validate-data -`` checks an inventory
without connecting to any host.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Iterable, Mapping

import jsonschema

SCHEMA_FILE = "host-data-1.0.json"


@dataclass(frozen=True)
class DataProblem:
    host: str
    key: str
    reason: str

    def __str__(self) -> str:
        return f"host {self.host}: data key `{self.key}`: {self.reason}"


class HostDataError(ValueError):
    """Raised when any host's data is invalid; lists every problem on every host."""

    def __init__(self, problems: list[DataProblem]):
        self.problems = problems
        lines = [f"invalid host data on {len({p.host for p in problems})} host(s); no host was changed:"]
        lines += [f"  {problem}" for problem in problems]
        lines.append("fix the inventory, group_data/ or --data values named above (every key is listed in "
                     "docs/inventories.md)")
        super().__init__("\n".join(lines))


@cache
def schema() -> dict:
    return json.loads(resources.files("cdna2").joinpath("schemas", SCHEMA_FILE).read_text())


def known_keys() -> list[str]:
    return sorted(schema()["properties"])


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    """The data key an error is about and a sentence saying what is wrong with it."""
    if error.validator == "additionalProperties":
        # jsonschema words this for all extra keys at once; the caller splits them, one problem each.
        return "", error.message
    key = str(error.absolute_path[0]) if error.absolute_path else ""
    value = error.instance
    if error.validator in ("pattern", "anyOf"):
        expected = schema()["properties"].get(key, {})
        hint = _expected_form(expected)
        return key, f"value {value!r} is malformed" + (f": expected {hint}" if hint else "")
    if error.validator == "type":
        return key, f"value {value!r} has the wrong type: expected {error.validator_value}"
    if error.validator == "enum":
        return key, f"value {value!r} is not allowed: expected one of {', '.join(map(repr, error.validator_value))}"
    return key, error.message


def _expected_form(property_schema: Mapping[str, Any]) -> str:
    definitions = schema()["$defs"]
    forms = []
    for option in property_schema.get("anyOf", [property_schema]):
        ref = option.get("$ref", "")
        target = definitions.get(ref.rsplit("/", 1)[-1], option) if ref else option
        if "description" in target:
            forms.append(target["description"])
        elif target.get("type") == "null":
            forms.append("None (unset)")
    return " or ".join(forms)


def problems_for(host: str, data: Mapping[str, Any]) -> list[DataProblem]:
    problems = []
    validator = jsonschema.Draft202012Validator(schema())
    for key in sorted(set(data) - set(known_keys())):
        suggestion = difflib.get_close_matches(key, known_keys(), n=1)
        reason = "unknown data key" + (f" (did you mean `{suggestion[0]}`?)" if suggestion else "")
        problems.append(DataProblem(host, key, reason))
    for error in sorted(validator.iter_errors(dict(data)), key=lambda e: list(e.absolute_path)):
        key, reason = _describe(error)
        if key:
            problems.append(DataProblem(host, key, reason))
    return problems


def validate_hosts(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """Raise HostDataError listing every problem of every host, or return when all hosts are valid."""
    problems = [problem for name, data in hosts for problem in problems_for(name, data)]
    if problems:
        raise HostDataError(problems)


def validate_data_cmd(args: argparse.Namespace) -> int:
    """Validate the hosts of `pyinfra INVENTORY debug-inventory --json` output."""
    stream = sys.stdin if args.inventory_json == "-" else open(args.inventory_json)
    with stream:
        hosts = [(entry["name"], entry["data"]) for entry in json.load(stream)]
    problems = [problem for name, data in hosts for problem in problems_for(name, data)]
    if args.json:
        print(json.dumps({"hosts": len(hosts), "valid": not problems,
                          "problems": [problem.__dict__ for problem in problems]}, indent=2))
    elif problems:
        print(HostDataError(problems), file=sys.stderr)
    else:
        print(f"{len(hosts)} host(s): data valid")
    return 1 if problems else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("validate-data", help=validate_data_cmd.__doc__,
                                   description=validate_data_cmd.__doc__)
    parser.add_argument("inventory_json", metavar="FILE", help="debug-inventory --json output, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=validate_data_cmd)

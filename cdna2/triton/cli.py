"""``python -m cdna2 triton-configs``: derive and prove AITER's gfx90a Triton configs for one installed tree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cdna2.triton import toolchain
from cdna2.triton.proof import ProofError, prove

DEFAULT_TRITON = "3.7.1"  # the triton the deploy installs after amd-aiter


def table(result: dict) -> str:
    lines = [f"triton {result['triton']}, host {result['host']}, AITER tree {result['tree_digest'][:12]}"
             f" ({result['source']}), proof took {result['seconds']} s ({result['reused']} compiles reused)"]
    for entry in result["entries"]:
        head = f"{entry['status']:<13} {entry['op']:<40} {entry['file']}"
        if entry["status"] == "in-code":
            head += " (config chosen in code, per call)"
        elif entry["configs"]:
            head += f" -> {entry['target'] or '(none)'}"
        lines.append(head)
        for config in entry["configs"]:
            lines.append(f"    {config['key']:<24} {'compiled' if config['compiled'] else 'FAILED':<9} "
                         f"LDS {config['lds_bytes']:>6}  spills {config['spills']:>4} (gfx942 "
                         f"{config['gfx942_spills']})  {', '.join(config['mfma']) or 'no MFMA'}")
            lines.extend(f"      stepped down: {step}" for step in config["stepped_down"])
        if entry["status"] in ("refused", "unproven", "failed", "in-code"):
            lines.append(f"    {entry['reason']}")
    counts = {}
    for entry in result["entries"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    lines.append(", ".join(f"{count} {status}" for status, count in sorted(counts.items())))
    return "\n".join(lines)


def command(args) -> int:
    site_packages = Path(args.site_packages)
    try:
        result = prove(site_packages, args.triton, args.host,
                       progress=lambda line: print(f"triton-configs: {line}", file=sys.stderr, flush=True))
    except (ProofError, toolchain.ToolchainError) as error:
        print(f"triton-configs: {site_packages}: {error}", file=sys.stderr)
        return 1
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.write:
        for relative, text in sorted(result["files"].items()):
            target = Path(args.write) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target}")
    return 1 if any(entry["status"] == "failed" for entry in result["entries"]) else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("triton-configs", help="derive AITER's gfx90a Triton configs from gfx942's and "
                                                          "prove each by compiling it for gfx90a (cached)")
    parser.add_argument("--site-packages", required=True, help="the site-packages directory holding aiter/")
    parser.add_argument("--triton", default=DEFAULT_TRITON, help=f"triton version to compile with (default "
                                                                  f"{DEFAULT_TRITON})")
    parser.add_argument("--host", help="host profile of the rules (MI210, MI250X; default the rules' default_host)")
    parser.add_argument("--json", help="also write the proof as JSON to this file")
    parser.add_argument("--write", metavar="DIR", help="write each derived gfx90a config file under DIR at its path "
                                                       "under site-packages (what the aiter-triton-gfx90a set adds)")
    parser.set_defaults(func=command)

"""The record that lets vLLM's ROCM_AITER_UNIFIED_ATTN serve sliding-window models on this host's gfx90a.

vllm-aiter-triton-ops' guard (its site unified-attention-sliding-window-guard) declines every sliding-window model
on gfx90a unless this record, beside the guarded module, says that this very host's smoke test ran AITER's Triton
unified attention on a sliding window on its GPU and passed (check ``triton_unified_attention_sliding_window``), for
the AITER and triton installed now. The guard reads it at run time, with the standard library only, and admits only
when all of these hold: the record parses, its check ``passed``, it names this node, the triton installed is the
one it names, and every AITER file it names (the unified-attention wrapper and kernels, under the ``aiter`` package
directory) hashes as it says. Anything else declines, naming why.

The deploy writes it after every smoke run on a host that takes the set (the check's outcome, whatever it is: a
failed or skipped check declines), and removes it in a shared environment (one file beside vLLM would speak for
every node, whose GPUs are their own). It is written through a transaction of its own (``cdna2.host.txn``, package
``vllm-sliding-window-proof``): staged, verified, renamed; rollback removes it like every file the tool added.

    python -m cdna2.host.window_proof write --site-packages DIR --state-dir DIR --check JSON --at TIME
    python -m cdna2.host.window_proof remove --site-packages DIR --state-dir DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

from cdna2.host import txn
from cdna2.host.cli import finish
from cdna2.host.digests import file_sha256
from cdna2.host.smoke_static import searched_first

RECORD = "vllm/v1/attention/backends/gfx90a_sliding_window_proof.json"  # under site-packages; the guard's name too
CHECK = "triton_unified_attention_sliding_window"  # cdna2/host/smoke.py
PLAN = "vllm-sliding-window-proof"  # the transaction's package name: <state_dir>/backups/vllm-sliding-window-proof
FORMAT = 1
# The files of the op the check proves, under the aiter package directory (AITER 0.1.7: ops/triton/ and
# ops/triton/_triton_kernels/; 0.1.16 on also ops/triton/attention/ and ops/triton/_triton_kernels/attention/).
AITER_FILES = "ops/triton/**/unified_attention.py"


class WindowProofError(RuntimeError):
    pass


def installed(site_packages: Path) -> tuple[Path, str | None]:
    """The ``aiter`` package directory and the triton version the target Python finds with ``site_packages`` first,
    as vLLM's process finds them (a develop checkout's too)."""
    with searched_first(site_packages):
        spec = importlib.util.find_spec("aiter")
        try:
            triton = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            triton = None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations:
        raise WindowProofError(f"no aiter package is importable with {site_packages} first on the path")
    return Path(locations[0]), triton


def record_of(check: dict, site_packages: Path, at: str) -> dict:
    """The record of ``check`` (the smoke report's entry for CHECK) for the AITER and triton installed now."""
    if check.get("name") != CHECK:
        raise WindowProofError(f"the record is of check {CHECK}, not {check.get('name')!r}")
    aiter, triton = installed(site_packages)
    files = {path.relative_to(aiter).as_posix(): file_sha256(path) for path in sorted(aiter.glob(AITER_FILES))}
    if not files:
        raise WindowProofError(f"{aiter} holds no {AITER_FILES}: AITER has no Triton unified attention to record")
    return {"format": FORMAT, "check": CHECK, "status": check["status"], "detail": check.get("detail", ""),
            "at": at, "node": os.uname().nodename, "triton": triton,
            "aiter_files": files}


def write(site_packages: Path, state_dir: Path, check: dict, at: str) -> dict:
    """Write the record of ``check`` beside the guard, through the transaction (it replaces an earlier one)."""
    data = (json.dumps(record_of(check, site_packages, at), indent=1, sort_keys=True) + "\n").encode()
    target = site_packages / RECORD
    if not target.parent.is_dir():
        raise WindowProofError(f"{target.parent} does not exist: vLLM's ROCM_AITER_UNIFIED_ATTN backend is not "
                               f"there; remove vllm-aiter-triton-ops from the host's optional_patch_sets")
    current = file_sha256(target)
    staged = target.with_name(f"{target.name}{txn.STAGED_SUFFIX}-{os.getpid()}")
    staged.write_bytes(data)
    try:
        result = txn.apply({"package": PLAN, "version": None, "root": str(site_packages),
                            "backup_dir": str(state_dir / "backups" / PLAN),
                            "changes": [{"path": RECORD, "expected_sha256": current,
                                         "new_sha256": file_sha256(staged), "staged": str(staged)}]})
    finally:
        staged.unlink(missing_ok=True)
    return {**result, "action": "write", "status": check["status"]}


def remove(site_packages: Path, state_dir: Path) -> dict:
    """Remove the record this tool wrote (nothing to do where it wrote none)."""
    return txn.revert(state_dir / "backups" / PLAN, site_packages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.window_proof", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["write", "remove"])
    parser.add_argument("--site-packages", type=Path, required=True, help="site-packages holding vLLM and AITER")
    parser.add_argument("--state-dir", type=Path, required=True, help="this tool's state directory on the host")
    parser.add_argument("--check", help=f"write: the smoke report's entry for {CHECK} (JSON)")
    parser.add_argument("--at", help="write: when the smoke test ran (UTC, ISO 8601)")
    args = parser.parse_args(argv)
    if args.action == "write" and (args.check is None or args.at is None):
        parser.error("write needs --check and --at")
    try:
        result = (write(args.site_packages, args.state_dir, json.loads(args.check), args.at) if args.action == "write"
                  else remove(args.site_packages, args.state_dir))
    except (WindowProofError, txn.TxnError) as error:
        message = f"{args.site_packages / RECORD}: {error}"
        return finish(f"window_proof {args.action}", {"ok": False, "error": message}, message)
    return finish(f"window_proof {args.action}", result)


if __name__ == "__main__":
    sys.exit(main())

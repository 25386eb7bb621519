"""``python -m releases triton-proofs``: regenerate every committed Triton compile proof and the configs it derives.

For each AITER tree the tool serves (the 0.1.7 wheel's, and the v0.1.16, v0.1.19.post2, v0.1.20.post1 and main
trees from ``$CDNA2_AITER_GIT``): the whole-tree proof with the rules and recipes of this checkout
(cdna2.triton.proof; a tree already proven with them is taken from the controller's cache), written to
``cdna2/data/triton-proofs/<release>.json``; then each config directory under ``cdna2/data/triton-configs/`` is
rewritten with the union of the files its trees derived. Two trees of one directory that derive different bytes
for the same file are an error: that directory needs a variant of its own. The aiter-triton-gfx90a set's ``adds``
name those files; tests/unit/triton/test_committed.py checks that all of it agrees with today's code.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from cdna2.triton import toolchain
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.proof import COMMITTED, ProofError, prove
from lab import wheelhouse
from lab.aiter_git import SourceMissing, aiter_git
from releases.coverage import aiter_triton_tree

CONFIGS = COMMITTED.parent / "triton-configs"
# (release: the proof's file name, config directory its derived files go to, the tree: a git ref, or None for the
# PyPI wheel)
# v0.1.16's batched GEMM kernel takes no NUM_KSPLIT, so its configs have a directory of their own; v0.1.17 to main
# derive the same bytes (the set's variants 0.1.17, 0.1.18, 0.1.19 and 0.1.20-main read 0.1.17-main). v0.1.19.post2
# stands for 0.1.18 to 0.1.19.post2 (the same conv kernels and gfx942 conv files; v0.1.18 and v0.1.19 differ from it
# in import order only): its proof shows they derive 0.1.17-main's bytes, and a host on it needs no compile.
TREES = (("0.1.7.post2.dev18", "0.1.7", None), ("0.1.16", "0.1.16", "v0.1.16"),
         ("0.1.19.post2", "0.1.17-main", "v0.1.19.post2"), ("0.1.20.post1", "0.1.17-main", "v0.1.20.post1"),
         ("main", "0.1.17-main", "main"))


class RegenerateError(RuntimeError):
    pass


def tree_of(ref: str | None) -> Path:
    return wheelhouse.installed_tree(wheelhouse.AITER) if ref is None else aiter_triton_tree(aiter_git(), ref)


def committed_json(result: dict) -> str:
    """The proof as committed: where it came from is not part of it."""
    return json.dumps({key: value for key, value in result.items() if key != "source"}, indent=1,
                      sort_keys=True) + "\n"


def config_files(proofs: dict[str, dict]) -> dict[str, dict[str, str]]:
    """{config directory: {path under site-packages: text}}, the union of its trees' derived files."""
    directories: dict[str, dict[str, str]] = {}
    owners: dict[tuple[str, str], str] = {}
    for release, directory, _ in TREES:
        files = directories.setdefault(directory, {})
        for path, text in proofs[release]["files"].items():
            if path in files and files[path] != text:
                raise RegenerateError(f"{path}: the {owners[directory, path]} and {release} trees derive different "
                                      f"configs; give cdna2/data/triton-configs/{directory} a variant per release")
            files[path], owners[directory, path] = text, release
    return directories


def regenerate(progress) -> dict[str, dict]:
    proofs = {}
    for index, (release, _, ref) in enumerate(TREES, 1):
        started = time.monotonic()
        progress(f"[{index}/{len(TREES)}] {release}: proving its Triton tree with triton {DEFAULT_TRITON}")
        result = prove(tree_of(ref), DEFAULT_TRITON, progress=lambda line: progress(f"    {line}"))
        failed = [entry["file"] for entry in result["entries"] if entry["status"] == "failed"]
        progress(f"[{index}/{len(TREES)}] {release}: tree {result['tree_digest'][:12]}, {len(result['files'])} "
                 f"derived files, {len(failed)} failed ({result['source']}, {time.monotonic() - started:.1f} s)")
        proofs[release] = result
    directories = config_files(proofs)
    COMMITTED.mkdir(exist_ok=True)
    for stale in COMMITTED.glob("*.json"):
        stale.unlink()
    for release, result in proofs.items():
        (COMMITTED / f"{release}.json").write_text(committed_json(result))
        progress(f"wrote cdna2/data/triton-proofs/{release}.json")
    for directory, files in directories.items():
        shutil.rmtree(CONFIGS / directory, ignore_errors=True)
        for path, text in sorted(files.items()):
            (CONFIGS / directory / path).parent.mkdir(parents=True, exist_ok=True)
            (CONFIGS / directory / path).write_text(text)
        progress(f"wrote {len(files)} files under cdna2/data/triton-configs/{directory}")
    return proofs


def command(args) -> int:
    progress = lambda line: print(f"triton-proofs: {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        regenerate(progress)
    except (ProofError, toolchain.ToolchainError, SourceMissing, RegenerateError) as error:
        print(f"triton-proofs: {error}; nothing was written", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("triton-proofs", help="regenerate the committed Triton compile proofs "
                                                         "(cdna2/data/triton-proofs/) and the gfx90a configs they "
                                                         "derive (cdna2/data/triton-configs/), for every tree served")
    parser.set_defaults(func=command)

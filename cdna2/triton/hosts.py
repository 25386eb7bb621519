"""The compile proof of a host's own AITER Triton tree, for the deploy: once per distinct (triton version, tree
digest) on the controller, from the committed proofs or the controller's cache where they hold it, else proven now
on the host's sources, fetched once per digest. The aiter-triton-gfx90a set installs the committed configs
(cdna2/data/triton-configs/): a host whose tree's proof does not derive exactly the files the set adds is refused
for it, by name, before anything changes; so is a vLLM set one of whose sites opens an op whose kernels (their
config chosen in code) failed that proof.
"""

from __future__ import annotations

import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from cdna2.cache import cache_lock, cache_root
from cdna2.host.digests import triton_sources_digest
from cdna2.patches.catalog import Catalog, Variant
from cdna2.patches.planner import PackagePlan
from cdna2.triton.proof import ProofError, known_proof, load_rules, prove
from cdna2.triton.toolchain import triton_python

SET = "aiter-triton-gfx90a"
REGENERATE = "python -m releases triton-proofs"


def triton_after(installed: str | None, requirements: list[str]) -> str | None:
    """The triton version the host runs after this run: the one the wheels step installs (``name==version`` or a
    wheel file among its ``requirements``), else ``installed``."""
    for requirement in requirements:
        found = re.fullmatch(r"triton(?:==|-)([^-]+)(?:-.*\.whl)?", Path(requirement).name)
        if found:
            return found[1]
    return installed


def proven_tree(triton_version: str, digest: str, fetch: Callable[[Path], None],
                progress: Callable[[str], None] = lambda line: None) -> dict:
    """The proof of the AITER Triton tree with ``digest`` (as the probe reports it: the RECORD's, or a develop
    checkout's files) for ``triton_version`` and the rules' default host profile: committed or cached (no fetch, no
    compile), else ``fetch(archive)`` (a tar.gz of ``aiter/ops/triton``), checked against ``digest``, and proven.
    Raises ProofError or ToolchainError (no triton venv can be made)."""
    host = load_rules()["default_host"]
    found = known_proof(triton_version, digest, host)
    if found is not None:
        return found
    triton_python(triton_version)  # the venv first: a version no index serves is refused before any fetch
    return prove(fetched_tree(digest, fetch), triton_version, host, progress)


def fetched_tree(digest: str, fetch: Callable[[Path], None]) -> Path:
    """``$CDNA2_CACHE/triton-trees/<digest>``: a site-packages holding only ``aiter/ops/triton``, fetched once."""
    tree = cache_root() / "triton-trees" / digest
    with cache_lock(f"triton-tree-{digest[:32]}"):
        if not (tree / ".complete").exists():
            staging = tree.with_name(f".{digest}.staging")
            shutil.rmtree(staging, ignore_errors=True)
            (staging / "aiter" / "ops").mkdir(parents=True)
            archive = staging / "triton.tar.gz"
            fetch(archive)
            with tarfile.open(archive) as opened:
                opened.extractall(staging / "aiter" / "ops", filter="data")  # it comes from a host
            archive.unlink()
            found = triton_sources_digest(staging)
            if found != digest:
                shutil.rmtree(staging, ignore_errors=True)
                raise ProofError(f"the Triton sources fetched for tree {digest[:12]} have digest "
                                 f"{(found or 'none')[:12]}: aiter/ops/triton on the host differs from what its RECORD "
                                 f"lists (edited or patched: this set's files are proven on the pristine tree); "
                                 f"reinstall amd-aiter there or roll it back (rollback.py), then run again")
            (staging / ".complete").touch()
            shutil.rmtree(tree, ignore_errors=True)
            staging.rename(tree)
    return tree


def adds_refusal(proof: dict, variant: Variant) -> str | None:
    """Why the set's ``variant`` must not be installed on a tree with this ``proof``: a file it adds that the proof
    did not derive, or derived with other bytes (None: every added file is the proof's)."""
    derived = {path: text.encode() for path, text in proof["files"].items()}
    failed = {entry["file"]: entry["reason"] for entry in proof["entries"] if entry["status"] == "failed"}
    wrong = [f"{add.file}: {'derived differently' if add.file in derived else 'not derived'}"
             for add in variant.adds if derived.get(add.file) != add.data]
    if not wrong:
        return None
    return (f"{SET} (variant {variant.id}) adds configs this host's AITER Triton tree {proof['tree_digest'][:12]} "
            f"does not prove ({'; '.join(wrong)}"
            f"{'; failed: ' + '; '.join(f'{f}: {r}' for f, r in failed.items()) if failed else ''}); "
            f"remove {SET} from the host's optional_patch_sets, or regenerate the committed proofs and configs for "
            f"this release ({REGENERATE}) and add them to the set")


def opened_ops_refusal(host_name: str, proof: dict | None, catalog: Catalog, plan: PackagePlan | None) -> str | None:
    """Why the vLLM sets ``plan`` (the host's vLLM patch plan) takes must not go on this host: a site of one opens an
    AITER Triton op (its ``triton_op``) whose config AITER picks in code and whose kernels failed ``proof``, the
    compile proof of the host's tree (None: no proof this run, nothing to refuse by)."""
    if proof is None or plan is None:
        return None
    in_code = {op["name"] for op in load_rules()["in_code"]}
    failed = {entry["op"]: entry["reason"] for entry in proof["entries"]
              if entry["op"] in in_code and entry["status"] == "failed"}
    refusals = [f"{name} (variant {variant.id}) site {site.id} opens AITER's Triton {site.triton_op}, whose kernels "
                f"failed the compile proof of {host_name}'s AITER Triton tree {proof['tree_digest'][:12]} with triton "
                f"{proof['triton']}: {failed[site.triton_op]}; remove {name} from {host_name}'s optional_patch_sets"
                for name in plan.sets for variant in [catalog.by_name(name).variant(plan.variants[name])]
                for site in variant.sites if site.triton_op in failed]
    return "; ".join(refusals) or None

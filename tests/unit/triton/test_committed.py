"""The committed Triton compile proofs (cdna2/data/triton-proofs/) and configs (cdna2/data/triton-configs/): the
deploy and this suite read them instead of proving a whole tree again, so they must be today's: made by today's
rules and code, of the trees the tool serves, deriving exactly the files the aiter-triton-gfx90a set installs, and
reproduced by a compile of a sample of their configs."""

from __future__ import annotations

import json

import pytest

from cdna2.triton import proof, recipes
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.hosts import REGENERATE
from cdna2.triton.toolchain import triton_python
from releases import triton_proofs

FIELDS = ("ok", "lds_bytes", "vgpr_spills", "sgpr_spills", "scratch_bytes", "vgprs", "mfma")


def committed() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(proof.COMMITTED.glob("*.json"))}


def test_every_tree_served_has_its_committed_proof_of_todays_rules_and_code():
    proofs = committed()
    assert set(proofs) == {release for release, _, _ in triton_proofs.TREES}
    stale = [release for release, found in proofs.items() if found["code_digest"] != proof.proof_code_digest()]
    assert not stale, (f"the committed proofs of {stale} were made by other rules or code than today's: "
                       f"regenerate them with `{REGENERATE}`")
    assert {found["triton"] for found in proofs.values()} == {DEFAULT_TRITON}


def test_the_committed_configs_are_the_committed_proofs_files():
    shipped = {directory.name: {path.relative_to(directory).as_posix(): path.read_text()
                                for path in directory.rglob("*") if path.is_file()}
               for directory in triton_proofs.CONFIGS.iterdir()}
    derived = triton_proofs.config_files(committed())
    assert derived and all(derived.values())
    assert shipped == derived, f"regenerate with `{REGENERATE}`"


def test_the_017_tree_is_the_committed_one_and_its_proof_is_read_not_compiled(aiter_017_tree):
    release = triton_proofs.TREES[0][0]
    assert proof.tree_digest(aiter_017_tree) == committed()[release]["tree_digest"]
    assert proof.prove(aiter_017_tree, DEFAULT_TRITON)["source"] == f"committed ({release}.json)"


@pytest.mark.slow
def test_a_sample_recompile_reproduces_the_committed_017_entries(aiter_017_tree):
    """One config per derived op (the one stepped down furthest), every path its recipe compiles, for gfx90a: one
    worker call; each result is the committed one."""
    found = committed()[triton_proofs.TREES[0][0]]
    rules = {op["name"]: op for op in proof.load_rules()["ops"]}
    requests, expected = [], {}
    for entry in found["entries"]:
        if entry["status"] not in ("derived", "stepped-down") or entry["op"] in {e.split("|")[0] for e in expected}:
            continue
        config = max(entry["configs"], key=lambda config: len(config["stepped_down"]))
        recipe = recipes.RECIPES[rules[entry["op"]]["recipe"]]
        for path, request in recipe(config["config"], config["key"].rsplit(".", 1)[-1], proof._shape(entry["file"])):
            identifier = f"{entry['op']}|{config['key']}|{path}"
            requests.append({**request, "id": identifier, "arch": "gfx90a"})
            expected[identifier] = config["paths"][path]
    assert {identifier.split("|")[0] for identifier in expected} == {
        entry["op"] for entry in found["entries"] if entry["status"] in ("derived", "stepped-down")}
    results = proof._run_worker(triton_python(DEFAULT_TRITON), aiter_017_tree, requests, "gfx90a", lambda line: None)
    assert set(results) == set(expected)
    for identifier, result in results.items():
        assert {key: result.get(key) for key in FIELDS} == {key: expected[identifier].get(key) for key in FIELDS}, \
            (identifier, f"regenerate with `{REGENERATE}`")

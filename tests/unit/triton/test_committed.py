"""The committed Triton compile proofs (cdna2/data/triton-proofs/) and configs (cdna2/data/triton-configs/): the
deploy and this suite read them instead of proving a whole tree again, so they must be today's: made by today's
rules and code, of the trees the tool serves, deriving exactly the files the aiter-triton-gfx90a set installs, and
reproduced by a compile of a sample of their configs."""

from __future__ import annotations

import json

import pytest

from cdna2.patches import load_catalog
from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.hosts import REGENERATE, SET, adds_refusal
from cdna2.triton.toolchain import triton_python
from releases import coverage, triton_proofs

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


# committed proof -> the set's variants of the releases its tree stands for (v0.1.19.post2: 0.1.18 to 0.1.19.post2,
# whose Triton kernels and gfx942 files of the added configs are the same)
VARIANTS = {"0.1.7.post2.dev18": ["0.1.7"], "0.1.16": ["0.1.16"], "0.1.19.post2": ["0.1.18", "0.1.19"],
            "0.1.20.post1": ["0.1.20-main"], "main": ["0.1.20-main"]}


def test_each_committed_proof_derives_every_file_its_variants_add_as_the_deploy_checks():
    variants = {variant.id: variant for variant in load_catalog().by_name(SET).variants}
    assert set(VARIANTS) == {release for release, _, _ in triton_proofs.TREES}
    for release, found in committed().items():
        for name in VARIANTS[release]:
            assert variants[name].adds and adds_refusal(found, variants[name]) is None, (release, name)


def test_the_017_tree_is_the_committed_one_and_its_proof_is_read_not_compiled(aiter_017_tree):
    release = triton_proofs.TREES[0][0]
    assert proof.tree_digest(aiter_017_tree) == committed()[release]["tree_digest"]
    assert proof.prove(aiter_017_tree, DEFAULT_TRITON)["source"] == f"committed ({release}.json)"


# (committed proof, the tree it is of): the 0.1.7 wheel's and v0.1.20.post1's, whose kernels were rewritten
SAMPLED = (("0.1.7.post2.dev18", None), ("0.1.20.post1", "v0.1.20.post1"))


def sample_requests(found: dict) -> tuple[list[dict], dict[str, dict]]:
    """One config per proven op of ``found`` (the one stepped down furthest; an in-code op's first call) on the first
    path its recipe compiles, called as the proof calls it (proof.config_compiles; every path of every config is the
    whole proof's, read by the test below)."""
    rules = proof.load_rules()
    ops = {op["name"]: op for op in rules["ops"] + rules["in_code"]}
    profile = rules["hosts"][found["host"]]
    requests, expected = [], {}
    for entry in found["entries"]:
        if entry["status"] not in ("derived", "stepped-down", "in-code"):
            continue
        op = ops[entry["op"]]
        config = max(entry["configs"], key=lambda config: len(config["stepped_down"]))
        path, request = proof.config_compiles(op, config["config"], config["key"], entry["file"], profile)[0]
        identifier = f"{entry['op']}|{config['key']}|{path}"
        requests.append({**request, "id": identifier, "arch": "gfx90a"})
        expected[identifier] = config["paths"][path]
    return requests, expected


@pytest.mark.slow
@pytest.mark.parametrize("release, ref", SAMPLED)
def test_a_sample_recompile_reproduces_the_committed_entries(release, ref, aiter_017_tree, request):
    """One worker call per tree: each result is the committed one, field for field."""
    found = committed()[release]
    tree = aiter_017_tree if ref is None else coverage.aiter_triton_tree(request.getfixturevalue("aiter_git_dir"), ref)
    assert proof.tree_digest(tree) == found["tree_digest"]
    requests, expected = sample_requests(found)
    assert {identifier.split("|")[0] for identifier in expected} == {
        entry["op"] for entry in found["entries"] if entry["status"] in ("derived", "stepped-down", "in-code")}
    results, _ = proof._run_worker(triton_python(DEFAULT_TRITON), tree, requests, "gfx90a", lambda line: None)
    assert set(results) == set(expected)
    for identifier, result in results.items():
        assert {key: result.get(key) for key in FIELDS} == {key: expected[identifier].get(key) for key in FIELDS}, \
            (identifier, f"regenerate with `{REGENERATE}`")


@pytest.mark.parametrize("release", [release for release, _, _ in triton_proofs.TREES])
def test_every_proven_path_of_every_committed_proof_fits_gfx90a(release):
    """Read, not compiled: every path of every config the proof accepted compiled for gfx90a within its LDS, and a
    derived config spills only where gfx942's kernel of that path spills too; nothing failed."""
    found = committed()[release]
    limit = proof.load_rules()["lds_limit_bytes"]
    proven = [entry for entry in found["entries"] if entry["status"] in ("derived", "stepped-down", "in-code")]
    assert proven and not [entry["file"] for entry in found["entries"] if entry["status"] == "failed"]
    for entry in proven:
        for config in entry["configs"]:
            assert config["paths"], (entry["file"], config["key"])
            for path, result in config["paths"].items():
                where = (release, entry["file"], config["key"], path)
                assert result["ok"] and result["lds_bytes"] <= limit, where
                if entry["status"] != "in-code" and not config["gfx942"][path]["vgpr_spills"]:
                    assert not result["vgpr_spills"], where

"""AITER's chunked delta attention (v0.1.20 on): the nested gfx942 file's one entry is its output kernel's autotune
config; the recipe launches chunk_gla_fwd_kernel_o as chunk_delta_attn_fwd does, with that config named to the
worker; the committed proofs of v0.1.20.post1 and main derive the gfx90a file and prove the in-code fallback, and
one worker call on the v0.1.20.post1 tree reproduces what they hold."""

from __future__ import annotations

import json

import pytest

from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.recipes import delta_attention
from cdna2.triton.toolchain import triton_python
from releases import coverage
from tests.unit.triton.conftest import committed_entries

LIMIT = 65536
FILE = "gfx942/triton/attention/chunk_delta_attn/DEFAULT.json"
TARGET = "gfx90a/triton/attention/chunk_delta_attn/DEFAULT.json"
OPS = {"chunk_delta_attn", "chunk_delta_attn_fallback"}
FIELDS = ("ok", "lds_bytes", "vgpr_spills", "sgpr_spills", "scratch_bytes", "vgprs", "mfma")


def test_the_recipe_launches_the_output_kernel_as_chunk_delta_attn_fwd_does():
    config = {"BK": 32, "BV": 128, "num_warps": 4, "num_stages": 2}
    paths = dict(delta_attention.chunk_gla_fwd_o(config, "chunk_gla_fwd_kernel_o", None))
    assert {request["kernel"] for request in paths.values()} == {"chunk_gla_fwd_kernel_o"}
    # the config goes to the worker as the autotuner's one config, never among the kernel's own values
    assert all(request["autotune"] == config and not set(config) & set(request["values"])
               for request in paths.values())
    fixed, varlen = paths["bf16 head 128, chunk 64"], paths["bf16 varlen head 128, chunk 64"]
    assert fixed["values"]["cu_seqlens"] is None and "IS_VARLEN" not in fixed["values"]  # the heuristic decides
    assert varlen["tensors"]["cu_seqlens"] == "int64" and "cu_seqlens" not in varlen["values"]
    assert all(request["values"]["USE_EXP2"] and not request["values"]["TRANSPOSE_STATE"]
               for request in paths.values())
    assert paths["bf16 head 128, chunk 32"]["values"]["BT"] == 32
    gva = paths["bf16 head 64, GVA, chunk 64"]["values"]
    assert (gva["K"], gva["V"], gva["HV"] // gva["H"]) == (64, 64, 2)
    assert fixed["tensors"]["g"] == "fp32" and fixed["tensor_dtype"] == "bf16"  # the gate cumsum is fp32
    with pytest.raises(ValueError, match="no launch recipe"):
        delta_attention.chunk_gla_fwd_o(config, "chunk_kda_fwd_kernel_inter", None)


@pytest.mark.parametrize("release", ["0.1.20.post1", "main"])
def test_the_committed_proofs_derive_the_file_and_prove_the_fallback(release):
    entries = committed_entries(release, OPS)
    assert set(entries) == OPS
    derived, fallback = entries["chunk_delta_attn"], entries["chunk_delta_attn_fallback"]
    assert (derived["file"], derived["target"], derived["status"]) == (FILE, TARGET, "derived"), derived["reason"]
    assert fallback["status"] == "in-code" and fallback["file"].endswith("chunk_delta_attn/gla_output.py")
    assert [config["config"] for config in fallback["configs"]] == [delta_attention.FALLBACK]
    for entry in entries.values():
        (config,) = entry["configs"]
        assert len(config["paths"]) == 4, (release, entry["op"])
        for path, result in config["paths"].items():
            where = (release, entry["op"], path)
            assert result["ok"] and result["lds_bytes"] <= LIMIT and not result["vgpr_spills"], where
            assert result["mfma"] and all(name.endswith("bf16_1k") for name in result["mfma"]), where


@pytest.fixture(scope="module")
def recompiled(aiter_git_dir):
    """One worker call on the v0.1.20.post1 tree: every path of the derived config, the fallback's first path."""
    tree = coverage.aiter_triton_tree(aiter_git_dir, "v0.1.20.post1")
    found = json.loads((proof.COMMITTED / "0.1.20.post1.json").read_text())
    assert proof.tree_digest(tree) == found["tree_digest"]
    rules = proof.load_rules()
    ops = {op["name"]: op for op in rules["ops"] + rules["in_code"]}
    requests, expected = [], {}
    for entry in found["entries"]:
        if entry["op"] in OPS:
            (config,) = entry["configs"]
            compiles = proof.config_compiles(ops[entry["op"]], config["config"], config["key"], entry["file"],
                                             rules["hosts"][found["host"]])
            for path, request in compiles if entry["op"] == "chunk_delta_attn" else compiles[:1]:
                requests.append({**request, "id": f"{entry['op']}|{path}", "arch": "gfx90a"})
                expected[f"{entry['op']}|{path}"] = config["paths"][path]
    results = proof._run_worker(triton_python(DEFAULT_TRITON), tree, requests, "gfx90a", lambda line: None)[0]
    return results, expected


def test_a_recompile_reproduces_the_committed_paths(recompiled):
    results, expected = recompiled
    assert len(expected) == 5 and set(results) == set(expected)
    for identifier, result in results.items():
        assert {key: result.get(key) for key in FIELDS} == {key: expected[identifier].get(key) for key in FIELDS}, \
            identifier

"""Compile results reused across proofs and trees (worker.reuse_compiles): a compile Triton identifies as one
measured before is read back, not compiled, and reads exactly as it was measured; a failed compile is not kept."""

from __future__ import annotations

import json

import pytest

from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.toolchain import triton_python


def gemm_requests() -> list[dict]:
    """gemm_a16w16's first 0.1.7 config on both its paths for gfx90a, one of them for gfx942 too, and the same
    config with a block size tl.arange refuses (a compile that fails)."""
    rules = proof.load_rules()
    op = next(op for op in rules["ops"] if op["name"] == "gemm_a16w16")
    file = "gemm/MI300X-GEMM-A16W16.json"
    config = json.loads((proof.COMMITTED / "0.1.7.post2.dev18.json").read_text())
    entry = next(entry for entry in config["entries"] if entry["file"] == file)
    key, chosen = entry["configs"][0]["key"], entry["configs"][0]["config"]
    paths = proof.config_compiles(op, chosen, key, file, rules["hosts"]["MI210"])
    requests = [{**request, "id": f"{path}|gfx90a", "arch": "gfx90a"} for path, request in paths]
    requests.append({**paths[0][1], "id": f"{paths[0][0]}|gfx942", "arch": "gfx942"})
    broken = {**paths[0][1]["values"], "BLOCK_SIZE_M": 48}
    requests.append({**paths[0][1], "values": broken, "id": "BLOCK_SIZE_M=48|gfx90a", "arch": "gfx90a"})
    return requests


@pytest.fixture(scope="module")
def cold_and_warm(aiter_017_tree, tmp_path_factory):
    """The same requests twice with one empty result directory: compiled, then read back."""
    results = tmp_path_factory.mktemp("triton-results")
    requests, python = gemm_requests(), triton_python(DEFAULT_TRITON)
    cold = proof._run_worker(python, aiter_017_tree, requests, "gfx90a", lambda line: None, results=results)
    stored = sorted(path.name for path in results.iterdir())
    warm = proof._run_worker(python, aiter_017_tree, requests, "gfx90a", lambda line: None, results=results)
    return requests, cold, warm, stored, sorted(path.name for path in results.iterdir())


@pytest.mark.slow
def test_a_warm_run_reads_back_every_compile_byte_for_byte(cold_and_warm):
    requests, (cold, cold_reused), (warm, warm_reused), stored, _ = cold_and_warm
    compiled = [identifier for identifier, result in cold.items() if result["ok"]]
    assert len(compiled) == len(requests) - 1 == len(stored) == 3  # two paths for gfx90a, one for gfx942
    assert (cold_reused, warm_reused) == (0, 3)
    assert json.dumps(warm) == json.dumps(cold)  # the same results, keys in the same order
    assert cold["EVEN_K|gfx90a"]["mfma"] and cold["EVEN_K|gfx90a"] != cold["EVEN_K|gfx942"]


@pytest.mark.slow
def test_a_failed_compile_is_not_kept(cold_and_warm):
    _, (cold, _), (warm, _), stored, after = cold_and_warm
    assert not cold["BLOCK_SIZE_M=48|gfx90a"]["ok"] and "power of 2" in cold["BLOCK_SIZE_M=48|gfx90a"]["error"]
    assert warm["BLOCK_SIZE_M=48|gfx90a"] == cold["BLOCK_SIZE_M=48|gfx90a"]  # compiled again, failing again
    assert after == stored and not [name for name in after if not name.endswith(".json")]

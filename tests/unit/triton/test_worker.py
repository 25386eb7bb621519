"""The compile worker on a kernel under ``@triton.autotune``: compiled with exactly the config the request names
(never the autotuner's own, which it would warm all of), its heuristics computed as Triton computes them; a request
that names no config, or not exactly the autotuner's names, fails by name. One worker call, real triton, gfx90a."""

from __future__ import annotations

import pytest

from cdna2.triton import proof
from cdna2.triton.cli import DEFAULT_TRITON
from cdna2.triton.toolchain import triton_python

# A tile product whose LDS grows with BLOCK; MASKED is what a heuristic below the autotuner derives from the config.
KERNELS = '''
import triton
import triton.language as tl


def tile_product(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tile = offs[:, None] * BLOCK + offs[None, :]
    b = tl.load(b_ptr + tile)
    if MASKED:  # a second dot, so that which path compiled shows in the MFMA count
        a = tl.load(a_ptr + tile, mask=tile < n, other=0.0)
        c = tl.dot(a, b) + tl.dot(b, a)
    else:
        c = tl.dot(tl.load(a_ptr + tile), b)
    tl.store(c_ptr + tile, c.to(c_ptr.dtype.element_ty))


plain = triton.jit(tile_product)
tuned = triton.autotune(
    configs=[triton.Config({"BLOCK": 16}, num_warps=1, num_stages=1),
             triton.Config({"BLOCK": 64}, num_warps=8, num_stages=2)],
    key=["n"])(triton.heuristics({"MASKED": lambda args: args["n"] % args["BLOCK"] != 0})(triton.jit(tile_product)))
'''
MEASURED = ("lds_bytes", "vgprs", "agprs", "sgprs", "vgpr_spills", "mfma")
WIDE = {"BLOCK": 64, "num_warps": 8, "num_stages": 2}


def _request(identifier: str, kernel: str, values: dict, autotune: dict | None = None) -> dict:
    request = {"id": identifier, "modules": ["toy.kernels"], "kernel": kernel, "values": values,
               "tensor_dtype": "bf16", "arch": "gfx90a"}
    return {**request, "autotune": autotune} if autotune is not None else request


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    site_packages = tmp_path_factory.mktemp("site-packages")
    (site_packages / "toy").mkdir()
    (site_packages / "toy" / "kernels.py").write_text(KERNELS)
    requests = [
        _request("tuned wide", "tuned", {"n": 4096}, WIDE),
        _request("plain wide", "plain", {"n": 4096, "BLOCK": 64, "MASKED": False, "num_warps": 8, "num_stages": 2}),
        _request("tuned narrow", "tuned", {"n": 4096}, {"BLOCK": 16, "num_warps": 1, "num_stages": 1}),
        _request("tuned wide masked", "tuned", {"n": 4000}, WIDE),
        _request("plain wide masked", "plain", {"n": 4000, "BLOCK": 64, "MASKED": True, "num_warps": 8,
                                                "num_stages": 2}),
        _request("tuned unnamed", "tuned", {"n": 4096}),
        _request("tuned without num_stages", "tuned", {"n": 4096}, {"BLOCK": 64, "num_warps": 8}),
        _request("plain named", "plain", {"n": 4096, "MASKED": False}, WIDE)]
    return proof._run_worker(triton_python(DEFAULT_TRITON), site_packages, requests, "gfx90a", lambda line: None)[0]


def _measured(result: dict) -> dict:
    assert result["ok"], result
    return {key: result[key] for key in MEASURED}


def test_an_autotuned_kernel_compiles_with_exactly_the_named_config(results):
    wide = _measured(results["tuned wide"])
    assert wide["mfma"] and wide == _measured(results["plain wide"])
    # the heuristic under the autotuner saw the named BLOCK: n = 4000 is no multiple of 64, so the masked kernel
    masked = _measured(results["tuned wide masked"])
    assert masked == _measured(results["plain wide masked"])
    assert sum(masked["mfma"].values()) == 2 * sum(wide["mfma"].values())
    assert _measured(results["tuned narrow"])["lds_bytes"] < wide["lds_bytes"]  # the other config, not the first


def test_a_request_that_does_not_name_exactly_one_config_fails_by_name(results):
    for identifier in ("tuned unnamed", "tuned without num_stages"):
        assert not results[identifier]["ok"]
        assert "tuned is under @triton.autotune over ['BLOCK']" in results[identifier]["error"], results[identifier]
    assert not results["plain named"]["ok"] and "not under @triton.autotune" in results["plain named"]["error"]

"""The engine on the real gfx942 tree of amd-aiter 0.1.7.post2.dev18 from PyPI (cached by lab.wheelhouse)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from cdna2.host.probe import tree_digest
from cdna2.host import manifest
from cdna2.kernels import translate_tree

# Measured with LLVM 22.1.8 (translator version 1): 178 of 1,281 code objects are portable; under the default
# kernel_hazard_policy the 13 short of gfx90a's MFMA wait states in straight-line code are withheld.
EXPECTED_PORTABLE = 178
EXPECTED_WITHHELD = 13
EXPECTED_CODE_OBJECTS = 1281


@pytest.mark.slow
def test_real_tree_translates_consistently_and_caches(real_source, real_translation, tmp_path, llvm_tools):
    first, dst, cache = real_translation
    assert first["cache"]["status"] == "miss"
    assert first["counts"] == {"code_objects": EXPECTED_CODE_OBJECTS, "blocked": EXPECTED_CODE_OBJECTS -
                               EXPECTED_PORTABLE, "withheld": EXPECTED_WITHHELD,
                               "written": EXPECTED_PORTABLE - EXPECTED_WITHHELD}

    written = sorted(dst.rglob("*.co"))
    assert len(written) == EXPECTED_PORTABLE - EXPECTED_WITHHELD
    assert all(struct.unpack_from("<I", p.read_bytes(), 0x30)[0] & 0xFF == 0x3F for p in written)
    listing = subprocess.run([llvm_tools.tool("llvm-objdump"), "-d", "--mcpu=gfx90a", *map(str, written)],
                             capture_output=True, text=True)
    assert listing.returncode == 0 and listing.stderr == ""
    assert "<unknown>" not in listing.stdout and "invalid" not in listing.stdout
    assert "_bf16 " not in listing.stdout.replace("_bf16_1k", ""), "every gfx942 bf16 MFMA spelling is rewritten"

    csvs = [p.relative_to(dst).as_posix() for p in dst.rglob("*.csv")]
    assert csvs and not any(manifest.dangling_rows(dst, csv) for csv in csvs)
    assert first["manifest_rows"]["kept"] > 0 and first["manifest_rows"]["dropped"] > 0

    again = translate_tree(real_source, tmp_path / "second" / "gfx90a")
    assert again["output_digest"] == first["output_digest"] == tree_digest(dst), "same input, same bytes"

    cached = translate_tree(real_source, tmp_path / "third" / "gfx90a", cache_dir=cache)
    assert cached["cache"]["status"] == "hit"
    assert tree_digest(tmp_path / "third" / "gfx90a") == first["output_digest"]

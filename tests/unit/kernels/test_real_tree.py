"""The engine on the real gfx942 tree of amd-aiter 0.1.7.post2.dev18 from PyPI (cached by lab.wheelhouse)."""

from __future__ import annotations

import struct
from collections import Counter
import subprocess

import pytest

from cdna2.host.digests import tree_digest
from cdna2.host import manifest
from cdna2.kernels import Policy, translate_tree

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

    unpadded = Policy(pad_mfma_hazards=False)  # the fixture's policy
    again = translate_tree(real_source, tmp_path / "second" / "gfx90a", policy=unpadded)
    assert again["output_digest"] == first["output_digest"] == tree_digest(dst), "same input, same bytes"

    cached = translate_tree(real_source, tmp_path / "third" / "gfx90a", cache_dir=cache, policy=unpadded)
    assert cached["cache"]["status"] == "hit"
    assert tree_digest(tmp_path / "third" / "gfx90a") == first["output_digest"]


# Measured with LLVM 22.1.8: 243 kernels have int8 K=32 MFMAs as their only blocker (fmoe 186, fmoe_2stages 40,
# pa 12, top level 5, one of them with the 32x32x16 form), and the split rule handles every instance.
EXPECTED_SPLIT = 243


@pytest.mark.slow
def test_real_tree_with_the_int8_k32_split_writes_every_unlocked_kernel_with_its_proof(real_source, tmp_path):
    dst = tmp_path / "gfx90a"
    report = translate_tree(real_source, dst, policy=Policy(int8_k32_split=True))  # padding on, as by default
    assert report["counts"] == {"code_objects": EXPECTED_CODE_OBJECTS, "written": EXPECTED_PORTABLE + EXPECTED_SPLIT,
                                "blocked": EXPECTED_CODE_OBJECTS - EXPECTED_PORTABLE - EXPECTED_SPLIT}
    split = {relpath: entry for relpath, entry in report["kernels"].items() if entry.get("split_mfmas")}
    assert len(split) == EXPECTED_SPLIT == report["int8_k32_split"]["written"]
    assert all(entry["text_growth_bytes"] == 8 * entry["split_mfmas"] + 4 * entry["nops"]
               for entry in split.values()), "each split adds one 8-byte MFMA, each pad a 4-byte s_nop"
    assert all(entry["hazards"]["verdict"] == "clean" for entry in split.values())
    assert len(list(dst.rglob("*.co"))) == EXPECTED_PORTABLE + EXPECTED_SPLIT
    csvs = [p.relative_to(dst).as_posix() for p in dst.rglob("*.csv")]
    assert not any(manifest.dangling_rows(dst, csv) for csv in csvs)
    families = Counter(entry["family"] for entry in split.values())
    assert families == {"fmoe": 186, "fmoe_2stages": 40, "pa": 12, "(top-level)": 5}
    # 16 rows are kept without the split; the split adds 144 (fmoe int8 17+30+17+28, fmoe_2stages 40, pa 12).
    assert report["manifest_rows"]["kept"] == 16 + 144

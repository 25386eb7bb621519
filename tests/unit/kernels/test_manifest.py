"""Manifest pruning in each schema found in real AITER trees."""

from __future__ import annotations

import pytest

from cdna2.host import manifest

KNL_FILE_CSV = """\
qType,kvType,Gqa,Mtp,Msk,Hp,blkSz,knl_name,knl_file
bf16,bf16,16,0,0,0,16,_ZN5aiter2aE,pa_a.co
bf16,fp8,16,0,0,0,16,_ZN5aiter2bE,pa_b.co
"""
CO_NAME_CSV = """\
tile_m,tile_n,knl_name,co_name
16,128,_ZN5aiter1xE,x.co
32,128,_ZN5aiter1yE,y.co"""  # no final newline, as in i8gemm_bf16_perTokenI8.csv
FMHA_CSV = "arch,hdim,co_name\ngfx942,128,fwd_a.co\ngfx942,128,fwd_b.co\n"


def test_knl_file_schema_keeps_written_rows_only():
    pruned = manifest.prune("pa/pa_asm.csv", KNL_FILE_CSV, {"pa/pa_a.co", "pa/pa_b.co"}, {"pa/pa_a.co"})
    assert (pruned.column, pruned.kept, pruned.dropped) == ("knl_file", 1, 1)
    assert pruned.text == KNL_FILE_CSV.splitlines(keepends=True)[0] + KNL_FILE_CSV.splitlines(keepends=True)[1]


def test_co_name_schema_without_final_newline():
    pruned = manifest.prune("i8gemm/m.csv", CO_NAME_CSV, {"i8gemm/x.co", "i8gemm/y.co"}, {"i8gemm/y.co"})
    assert (pruned.column, pruned.kept, pruned.dropped) == ("co_name", 1, 1)
    assert pruned.text.splitlines() == ["tile_m,tile_n,knl_name,co_name", "32,128,_ZN5aiter1yE,y.co"]


def test_product_subfolders_count_as_the_row_kernel():
    source = {"fmha/MI300/fwd_a.co", "fmha/MI308/fwd_a.co", "fmha/MI300/fwd_b.co", "fmha/MI308/fwd_b.co"}
    # fwd_b was written for MI300 only: the row would dangle on an MI308-style lookup, so it goes.
    written = {"fmha/MI300/fwd_a.co", "fmha/MI308/fwd_a.co", "fmha/MI300/fwd_b.co"}
    pruned = manifest.prune("fmha/fmha.csv", FMHA_CSV, source, written)
    assert (pruned.kept, pruned.dropped) == (1, 1)
    assert "fwd_a.co" in pruned.text and "fwd_b.co" not in pruned.text


def test_row_naming_a_kernel_missing_from_the_source_is_dropped():
    pruned = manifest.prune("pa/pa_asm.csv", KNL_FILE_CSV, {"pa/pa_a.co"}, {"pa/pa_a.co"})
    assert (pruned.kept, pruned.dropped) == (1, 1)


@pytest.mark.parametrize("name", ["../../etc/passwd.co", "/abs/k.co", "../../x.co"])
def test_row_outside_the_tree_is_an_error(name):
    text = f"knl_name,knl_file\nk,{name}\n"
    with pytest.raises(manifest.ManifestError, match=r"pa/m.csv:2: .*outside the kernel tree"):
        manifest.prune("pa/m.csv", text, set(), set())


def test_csv_without_kernel_column_and_header_only_csv():
    assert manifest.prune("a/t.csv", "m,n\n1,2\n", set(), set()).column is None
    pruned = manifest.prune("f4gemm/f.csv", "tile_m,knl_name,co_name", set(), set())
    assert (pruned.column, pruned.kept, pruned.dropped, pruned.text) == ("co_name", 0, 0, "tile_m,knl_name,co_name")


def test_dangling_rows(tmp_path):
    (tmp_path / "pa").mkdir()
    (tmp_path / "pa" / "pa_asm.csv").write_text(KNL_FILE_CSV)
    (tmp_path / "pa" / "pa_a.co").write_bytes(b"")
    assert manifest.dangling_rows(tmp_path, "pa/pa_asm.csv") == ["bf16,fp8,16,0,0,0,16,_ZN5aiter2bE,pa_b.co"]

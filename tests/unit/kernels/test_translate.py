"""translate_tree / classify_tree on small code objects assembled by the tests."""

from __future__ import annotations

import gc
import json
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cdna2.__main__ import main as cdna2_main
from cdna2.host import elf
from cdna2.host.digests import tree_digest
from cdna2.kernels import (TranslationError, batching, classify_tree, engine, isa, scan, translate_tree, tree_cache,
                           workers, write_and_prove)
from tests.unit.kernels.conftest import BF16_MFMA, FP8_MFMA

MANIFEST = "knl_name,knl_file\n_ZN5aiter2okE,ok_bf16.co\n_ZN5aiter3fp8E,blocked_fp8.co\n"


def e_flags(path: Path) -> int:
    return struct.unpack_from("<I", path.read_bytes(), 0x30)[0]


@pytest.fixture
def source_tree(tmp_path, build_code_object) -> Path:
    src = tmp_path / "hsa" / "gfx942"
    # s_nop 1: the MFMA reads v0, which a VALU writes 2 wait states before at the least (LLVM's rule on both chips)
    build_code_object(src / "fam" / "ok_bf16.co", "v_mov_b32_e32 v0, v1", "s_nop 1", BF16_MFMA, "s_nop 0")
    build_code_object(src / "fam" / "blocked_fp8.co", FP8_MFMA)
    (src / "fam" / "kernels.csv").write_text(MANIFEST)
    (src / "fam" / "codegen.py").write_text("# carried over verbatim\n")
    return src


def test_bf16_kernel_is_rewritten_to_the_1k_opcode_and_retargeted(source_tree, tmp_path, llvm_tools):
    dst = tmp_path / "hsa" / "gfx90a"
    report = translate_tree(source_tree, dst, jobs=2)
    written = dst / "fam" / "ok_bf16.co"
    entry = report["kernels"]["fam/ok_bf16.co"]
    assert {key: entry[key] for key in ("family", "status", "code", "patched_instructions")} == {
        "family": "fam", "status": "written", "code": "in place", "patched_instructions": 1}
    assert entry["hazards"]["verdict"] == "clean" and entry["hazards"]["mfmas"] == 1
    assert e_flags(written) == 0x53F, "machine gfx90a (0x3f) with xnack/sramecc feature bits (0x500) kept"
    listing = subprocess.run([llvm_tools.tool("llvm-objdump"), "-d", "--mcpu=gfx90a", str(written)],
                             capture_output=True, text=True, check=True).stdout
    assert "v_mfma_f32_16x16x16bf16_1k a[0:3], v[0:1], v[2:3], a[0:3]" in listing
    assert "D3E78000" in listing, "bf16 16x16x16 must be opcode D3E7 on gfx90a"
    notes = subprocess.run([llvm_tools.tool("llvm-readelf"), "-h", "--notes", str(written)],
                           capture_output=True, text=True, check=True).stdout
    assert "amdgcn-amd-amdhsa--gfx90a" in notes and "gfx942" not in notes
    assert report["output_digest"] == tree_digest(dst)


def test_fp8_kernel_is_blocked_and_its_manifest_row_dropped(source_tree, tmp_path):
    dst = tmp_path / "out"
    report = translate_tree(source_tree, dst, jobs=1)
    entry = report["kernels"]["fam/blocked_fp8.co"]
    assert entry["status"] == "blocked" and entry["buckets"] == {"fp8": 1}
    assert entry["blockers"][0]["instruction"].startswith("v_mfma_f32_16x16x32_fp8_fp8")
    assert not (dst / "fam" / "blocked_fp8.co").exists()
    assert (dst / "fam" / "kernels.csv").read_text() == "knl_name,knl_file\n_ZN5aiter2okE,ok_bf16.co\n"
    assert report["manifests"] == {"fam/kernels.csv": {"column": "knl_file", "kept": 1, "dropped": 1}}
    assert (dst / "fam" / "codegen.py").read_text() == "# carried over verbatim\n"
    assert report["families"]["fam"] == {"total": 2, "portable": 1, "blocked": 1, "withheld": 0, "errors": 0,
                                         "skipped": 0, "blocked_by": {"fp8": 1}}


def test_rewrite_that_changes_length_blocks_the_kernel(tmp_path, build_code_object, monkeypatch):
    # No gfx942 instruction is known to change length on gfx90a, so the rename table is given a row that does:
    # v_mov_b32_e32 (4 bytes) spelled as its 8-byte VOP3 form.
    monkeypatch.setitem(isa.RENAMES, "v_mov_b32_e32", "v_mov_b32_e64")
    monkeypatch.setattr(workers, "pool", ThreadPoolExecutor)  # the judge runs on the pool: here, to see that row
    src = tmp_path / "gfx942"
    build_code_object(src / "grow.co", "v_mov_b32_e32 v0, v1")
    report = classify_tree(src, jobs=1)
    entry = report["kernels"]["grow.co"]
    assert entry["status"] == "blocked"
    assert entry["blockers"][0]["reason"] == "gfx90a encoding is 8 bytes, the original 4"


def test_truncated_elf_is_an_error_entry_and_not_written(source_tree, tmp_path):
    good = (source_tree / "fam" / "ok_bf16.co").read_bytes()
    (source_tree / "truncated.co").write_bytes(good[:len(good) // 2])
    report = translate_tree(source_tree, tmp_path / "out", jobs=1)
    entry = report["kernels"]["truncated.co"]
    assert entry["status"] == "error" and "truncated" in entry["reason"]
    assert not (tmp_path / "out" / "truncated.co").exists()


def test_existing_destination_is_replaced_whole_and_no_staging_is_left(source_tree, tmp_path):
    dst = tmp_path / "hsa" / "gfx90a"
    (dst / "stale").mkdir(parents=True)
    (dst / "stale" / "old.co").write_bytes(b"old")
    translate_tree(source_tree, dst, jobs=1)
    assert not (dst / "stale").exists()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["gfx90a", "gfx942"]


def test_bytecode_of_the_source_is_not_carried_and_does_not_change_the_cache_key(source_tree, tmp_path):
    clean = translate_tree(source_tree, tmp_path / "clean" / "gfx90a", jobs=1)
    (source_tree / "fam" / "__pycache__").mkdir()
    (source_tree / "fam" / "__pycache__" / "codegen.cpython-311.pyc").write_bytes(b"bytecode")
    (source_tree / "fam" / "__pycache__" / "leftover.co").write_bytes(b"not a kernel")
    dst = tmp_path / "hsa" / "gfx90a"
    report = translate_tree(source_tree, dst, jobs=1)
    assert not (dst / "fam" / "__pycache__").exists()
    assert report["carried_files"] == clean["carried_files"] == ["fam/codegen.py"]
    assert report["cache"]["key"] == clean["cache"]["key"] and report["output_digest"] == clean["output_digest"]
    assert sorted(report["kernels"]) == ["fam/blocked_fp8.co", "fam/ok_bf16.co"]


def test_bad_manifest_leaves_destination_untouched(source_tree, tmp_path):
    (source_tree / "fam" / "evil.csv").write_text("knl_name,knl_file\nx,../../../escape.co\n")
    dst = tmp_path / "hsa" / "gfx90a"
    dst.mkdir()
    (dst / "keep.co").write_bytes(b"previous tree")
    with pytest.raises(TranslationError, match=r"fam/evil.csv:2: .*outside the kernel tree"):
        translate_tree(source_tree, dst, jobs=1)
    assert (dst / "keep.co").read_bytes() == b"previous tree"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["gfx90a", "gfx942"]


def test_missing_source_names_the_fix(tmp_path):
    with pytest.raises(TranslationError, match="no such directory; SRC must be an AITER hsa/gfx942 tree"):
        translate_tree(tmp_path / "nope", tmp_path / "out")


def test_cache_gives_the_same_bytes_without_translating(source_tree, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = translate_tree(source_tree, tmp_path / "one", jobs=1, cache_dir=cache)
    assert first["cache"]["status"] == "miss"

    def no_llvm_work(*args, **kwargs):
        raise AssertionError("a cache hit must not analyse the tree again")

    monkeypatch.setattr(engine, "_analyse", no_llvm_work)
    second = translate_tree(source_tree, tmp_path / "two", jobs=1, cache_dir=cache)
    assert second["cache"]["status"] == "hit"
    assert tree_digest(tmp_path / "two") == tree_digest(tmp_path / "one") == second["output_digest"]
    assert second["kernels"] == first["kernels"]


def test_corrupted_cache_entry_is_rebuilt(source_tree, tmp_path):
    cache = tmp_path / "cache"
    first = translate_tree(source_tree, tmp_path / "one", jobs=1, cache_dir=cache)
    (cache / first["cache"]["key"] / "tree" / "fam" / "ok_bf16.co").write_bytes(b"bit rot")
    again = translate_tree(source_tree, tmp_path / "two", jobs=1, cache_dir=cache)
    assert again["cache"]["status"] == "miss: corrupt entry replaced"
    assert again["output_digest"] == first["output_digest"]


def test_the_cache_key_covers_every_module_that_decides_a_translation():
    # A change to any module the engine runs must make a new key (tree_cache.PIPELINE_MODULES). Not in it: the
    # packages, cdna2.cache (the digest itself) and cdna2.host.digests (the tree's listing and digest; the source
    # tree's digest is a part of the key of its own). The command line (kernels/cli.py) is not loaded by the engine.
    program = "import sys, cdna2.kernels.engine; print(*(name for name in sys.modules if name[:5] == 'cdna2'))"
    loaded = subprocess.run([sys.executable, "-c", program], cwd=Path(__file__).resolve().parents[3],
                            capture_output=True, text=True, check=True).stdout.split()
    not_covered = {"cdna2", "cdna2.kernels", "cdna2.host", "cdna2.cache", "cdna2.host.digests"}
    assert set(loaded) - not_covered == set(tree_cache.PIPELINE_MODULES)
    package = {f"cdna2.kernels.{path.stem}" for path in Path(tree_cache.__file__).parent.glob("*.py")}
    assert package - {"cdna2.kernels.__init__", "cdna2.kernels.cli"} <= set(tree_cache.PIPELINE_MODULES)

def test_output_is_deterministic(source_tree, tmp_path):
    one = translate_tree(source_tree, tmp_path / "one", jobs=1)
    two = translate_tree(source_tree, tmp_path / "two", jobs=2)
    assert one["output_digest"] == two["output_digest"]


def test_cli_translate_and_classify(source_tree, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert cdna2_main(["translate", str(source_tree), str(tmp_path / "out"), "--jobs", "1",
                       "--report", str(report_path)]) == 0
    printed = capsys.readouterr().out
    assert "fam" in printed and "fp8 1" in printed and "1 rows kept, 1 rows dropped" in printed
    assert "MFMA wait states (gfx90a rules, audit 1, kernel_hazard_policy default): clean 1," in printed
    assert json.loads(report_path.read_text())["counts"] == {"code_objects": 2, "blocked": 1, "written": 1}
    assert cdna2_main(["classify", str(source_tree), "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["kernels"]["fam/ok_bf16.co"]["status"] == "portable"


def test_cli_reports_unusable_input(tmp_path, capsys):
    assert cdna2_main(["translate", str(tmp_path / "nope"), str(tmp_path / "out")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_the_pool_collects_less_in_its_workers_and_here_until_it_ends():
    before = gc.get_threshold()
    with workers.pool(1) as pool:
        assert gc.get_threshold()[0] == workers.GC_THRESHOLD
        assert pool.submit(gc.get_threshold).result()[0] == workers.GC_THRESHOLD
    assert gc.get_threshold() == before


def test_patch_rewrites_only_changed_instructions_and_refuses_a_length_change(build_code_object, tmp_path):
    path = build_code_object(tmp_path / "k.co", "v_mov_b32_e32 v0, v1", "s_nop 0")
    data = bytearray(path.read_bytes())
    code_object = elf.read_code_object(bytes(data))
    chunks = isa.split_instructions(elf.text_of(bytes(data), code_object))
    assert len(chunks) == 3  # and s_endpgm
    mov, nop, end = chunks
    rows = {mov: (b"\x01\x02\x00\x7e", "H0", "T0"), nop: (nop, "H1", "T1"), end: (end, "H2", "T2")}
    original = bytes(data)
    patched, listing = write_and_prove._patch(data, code_object, rows)
    address = code_object.text_address
    assert patched == 1
    assert listing == [f"H0{address:012X}T0", f"H1{address + 4:012X}T1", f"H2{address + 8:012X}T2"]
    offset = code_object.text_offset
    assert data[offset:offset + 4] == b"\x01\x02\x00\x7e"
    assert data[:offset] == original[:offset] and data[offset + 4:] == original[offset + 4:]
    with pytest.raises(elf.ElfError, match=rf"byte mismatch at file offset {offset + 4:#x}: refusing to patch"):
        write_and_prove._patch(bytearray(original), code_object, {**rows, nop: (nop + nop, "H1", "T1")})


def test_scan_batches_are_runs_of_neighbours_of_about_equal_size(tmp_path):
    sizes = {"a/1.co": 100, "a/2.co": 100, "a/3.co": 100, "b/1.co": 300, "b/2.co": 10, "c/1.co": 290}
    for relpath, size in sizes.items():
        (tmp_path / relpath).parent.mkdir(exist_ok=True)
        (tmp_path / relpath).write_bytes(bytes(size))
    order = list(sizes)
    runs = batching.runs(tmp_path, order, 3)
    assert [relpath for run in runs for relpath in run] == order  # every file once, in the order given
    assert [sum(sizes[relpath] for relpath in run) for run in runs] == [300, 300, 300]
    assert [len(run) for run in batching.runs(tmp_path, order, 2)] == [4, 2]  # a cut takes the file it falls in
    many = batching.runs(tmp_path, order, 10)  # more runs asked for than files: none is empty
    assert [relpath for run in many for relpath in run] == order and all(many)
    assert batching.runs(tmp_path, [], 4) == []


def test_the_scan_cuts_a_repeated_text_once_per_batch(build_code_object, tmp_path, monkeypatch):
    src = tmp_path / "src"
    build_code_object(src / "a.co", BF16_MFMA)
    build_code_object(src / "b.co", BF16_MFMA)  # the same .text under another name
    build_code_object(src / "c.co", "v_mov_b32_e32 v0, v1")
    cut = []
    split = isa.split_instructions
    monkeypatch.setattr(isa, "split_instructions", lambda text: cut.append(text) or split(text))
    table, results = scan.scan_batch(str(src), ["a.co", "b.co", "c.co"])
    assert len(cut) == 2
    indices = {relpath: sorted(payload) for relpath, kind, payload in results}
    assert indices["a.co"] == indices["b.co"] != indices["c.co"]
    assert sorted(table[i] for i in indices["a.co"]) == sorted(set(split(cut[0])))

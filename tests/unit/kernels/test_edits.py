"""Edits as data (insert s_nop before an instruction, replace one by a sequence) and the proof every moved kernel
passes before it is written: on small gfx942 kernels assembled here."""

from __future__ import annotations

import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from cdna2.__main__ import main as cdna2_main
from cdna2.host import elf
from cdna2.kernels import Policy, edits, engine, isa, llvm, translate_tree, workers, write_and_prove
from cdna2.kernels.relocation_proof import Expected, prove
from cdna2 import translated
from cdna2.translated import ensure_translation

# Offsets in .text (all instructions here are 4 or 8 bytes): 0 s_mov, 4 v_add (loop start), 8 s_sub, 0xc s_cmp,
# 0x10 s_cbranch_scc0 (back to 4), 0x14 s_cbranch_execz (forward to 0x1c), 0x18 v_mov, 0x1c s_endpgm.
LOOP = ("s_mov_b32 s0, 4", "label_loop:", "v_add_u32_e32 v0, 1, v0", "s_sub_u32 s0, s0, 1",
        "s_cmp_eq_u32 s0, 0", "s_cbranch_scc0 label_loop", "s_cbranch_execz label_done", "v_mov_b32_e32 v1, v0",
        "label_done:")
K32 = "v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[0:3]"


def listing(tools, path) -> list[str]:
    return llvm.objdump_lines(tools, [path], "gfx90a")[str(path)]


def texts(tools, path) -> list[str]:
    return [llvm.parse_objdump_line(line)[1] for line in listing(tools, path)]


def test_padding_inserts_nops_that_every_path_into_the_consumer_runs(build_code_object, llvm_tools, tmp_path):
    src = tmp_path / "src"
    build_code_object(src / "loop.co", *LOOP)
    report = translate_tree(src, tmp_path / "dst", jobs=1, pads={"loop.co": [edits.Pad(consumer=4, wait_states=11)]})
    entry = report["kernels"]["loop.co"]
    assert {key: entry[key] for key in ("status", "code", "split_mfmas", "nops", "nops_in_loops",
                                        "wait_states_in_loops", "text_growth_bytes")} == {
        "status": "written", "code": "padded", "split_mfmas": 0, "nops": 2, "nops_in_loops": 2,
        "wait_states_in_loops": 11, "text_growth_bytes": 8}
    assert report["padding"] == {"enabled": True, "kernels": 1, "nops": 2}
    lines = [llvm.parse_objdump_line(line) for line in listing(llvm_tools, tmp_path / "dst" / "loop.co")]
    assert [text for _, text, _ in lines] == [
        "s_mov_b32 s0, 4", "s_nop 7", "s_nop 2", "v_add_u32_e32 v0, 1, v0", "s_sub_u32 s0, s0, 1",
        "s_cmp_eq_u32 s0, 0", "s_cbranch_scc0 label_loop", "s_cbranch_execz label_done", "v_mov_b32_e32 v1, v0",
        "s_endpgm"]
    loop_start = lines[1][0]
    branch_address, _, words = lines[6]
    assert branch_address + 4 + 4 * isa.branch_of(int(words, 16).to_bytes(4, "little"))[1] == loop_start, \
        "the loop's branch lands on the nops, not past them"


def test_split_replaces_each_k32_mfma_by_two_halves_only_when_the_policy_says_so(build_code_object, llvm_tools,
                                                                                 tmp_path):
    src = tmp_path / "src"
    # The loop body is longer than the audit's 19-wait-state look-back (hazards.py settles loops in 4 passes).
    build_code_object(src / "k32.co", "s_mov_b32 s0, 2", "label_loop:", K32, "s_nop 7", "s_nop 7", "s_nop 7",
                      "s_sub_u32 s0, s0, 1", "s_cmp_eq_u32 s0, 0", "s_cbranch_scc0 label_loop")
    off = translate_tree(src, tmp_path / "off", jobs=1)
    assert off["kernels"]["k32.co"]["status"] == "blocked"
    assert off["kernels"]["k32.co"]["unlocked_by"] == "int8_k32_split"
    assert off["int8_k32_split"] == {"enabled": False, "kernels_unlocked": 1, "written": 0,
                                     "manifest_rows_it_would_add": {}}
    assert not (tmp_path / "off" / "k32.co").exists()

    on = translate_tree(src, tmp_path / "on", jobs=1, policy=Policy(int8_k32_split=True))
    entry = on["kernels"]["k32.co"]
    assert (entry["status"], entry["code"], entry["split_mfmas"], entry["text_growth_bytes"]) == ("written", "split",
                                                                                                   1, 8)
    assert texts(llvm_tools, tmp_path / "on" / "k32.co")[1:3] == [
        "v_mfma_i32_16x16x16i8 v[0:3], v4, v6, v[0:3]", "v_mfma_i32_16x16x16i8 v[0:3], v5, v7, v[0:3]"]
    assert on["int8_k32_split"] == {"enabled": True, "kernels_unlocked": 1, "written": 1}


def test_cli_says_how_each_kernel_was_made_and_what_the_split_would_add(build_code_object, tmp_path, capsys):
    src = tmp_path / "src"
    build_code_object(src / "fam" / "k32.co", K32)
    build_code_object(src / "fam" / "plain.co", "v_mov_b32_e32 v0, v1")
    (src / "fam" / "kernels.csv").write_text("knl_name,co_name\nk,k32.co\np,plain.co\n")
    assert cdna2_main(["translate", str(src), str(tmp_path / "off"), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "written: 1 in place" in printed
    assert "int8_k32_split is off: it would add 1 kernels and 1 manifest rows (fam/kernels.csv +1)" in printed
    assert cdna2_main(["translate", str(src), str(tmp_path / "on"), "--jobs", "1", "--int8-k32-split"]) == 0
    assert "written: 1 in place, 1 split (1 MFMAs split)" in capsys.readouterr().out
    assert (tmp_path / "on" / "fam" / "k32.co").is_file()
    assert cdna2_main(["classify", str(src), "--json", str(tmp_path / "c.json")]) == 0
    assert "translate would write: 1 in place, 1 split, with int8_k32_split" in capsys.readouterr().out


def test_manifests_say_which_rows_the_split_would_add(build_code_object, tmp_path):
    src = tmp_path / "src"
    build_code_object(src / "fam" / "k32.co", K32)
    build_code_object(src / "fam" / "plain.co", "v_mov_b32_e32 v0, v1")
    (src / "fam" / "kernels.csv").write_text("knl_name,co_name\nk,k32.co\np,plain.co\n")
    off = translate_tree(src, tmp_path / "off", jobs=1)
    assert off["int8_k32_split"]["manifest_rows_it_would_add"] == {"fam/kernels.csv": 1}
    assert (tmp_path / "off" / "fam" / "kernels.csv").read_text() == "knl_name,co_name\np,plain.co\n"
    on = translate_tree(src, tmp_path / "on", jobs=1, policy=Policy(int8_k32_split=True))
    assert (tmp_path / "on" / "fam" / "kernels.csv").read_text() == "knl_name,co_name\nk,k32.co\np,plain.co\n"
    assert on["manifests"]["fam/kernels.csv"] == {"column": "co_name", "kept": 2, "dropped": 0}


def test_a_branch_pushed_out_of_the_16_bit_range_is_refused_and_not_written(build_code_object, tmp_path):
    # s_branch at 0 over 32,767 s_nop dwords lands exactly at the limit; one more wait state before the target
    # (inserted after the branch, inside its span) would need offset 32,768.
    src = tmp_path / "src"
    build_code_object(src / "far.co", "s_branch label_far", ".rept 32767", "s_nop 0", ".endr", "label_far:")
    report = translate_tree(src, tmp_path / "dst", jobs=1, pads={"far.co": [edits.Pad(consumer=8, wait_states=1)]})
    entry = report["kernels"]["far.co"]
    assert entry["status"] == "refused" and "signed 16-bit dword range" in entry["reason"]
    assert not (tmp_path / "dst" / "far.co").exists()


def test_a_pad_that_names_no_instruction_is_refused(build_code_object, tmp_path):
    src = tmp_path / "src"
    build_code_object(src / "k.co", "v_mov_b32_e32 v0, v1")
    report = translate_tree(src, tmp_path / "dst", jobs=1, pads={"k.co": [edits.Pad(consumer=2, wait_states=1)]})
    assert report["kernels"]["k.co"]["status"] == "refused"
    assert "no instruction starts there" in report["kernels"]["k.co"]["reason"]


@pytest.fixture
def padded(build_code_object, llvm_tools, tmp_path):
    """(original bytes, padded gfx90a bytes, its listing, the groups the plan expects) for LOOP padded at 4."""
    src = tmp_path / "src"
    original = build_code_object(src / "loop.co", *LOOP).read_bytes()
    translate_tree(src, tmp_path / "dst", jobs=1, pads={"loop.co": [edits.Pad(consumer=4, wait_states=2)]})
    new = (tmp_path / "dst" / "loop.co").read_bytes()
    code = elf.read_code_object(original)
    chunks = isa.split_instructions(elf.text_of(original, code))
    gfx942 = llvm.decode(llvm_tools, chunks, "gfx942")
    groups = [[Expected(text, chunk)] for text, chunk in zip(gfx942, chunks)]
    groups[1].insert(0, Expected("s_nop 1", bytes.fromhex("010080bf")))
    groups[4], groups[5] = [1], [7]
    return original, new, listing(llvm_tools, tmp_path / "dst" / "loop.co"), groups


def test_the_proof_accepts_exactly_the_planned_kernel(padded):
    assert prove(*padded) is None


def test_the_proof_reads_a_line_laid_out_otherwise_as_any_other(padded):
    # Lines spelt exactly as objdump prints the planned instruction are accepted by one comparison; others parsed.
    original, new, lines, groups = padded
    relaid = [llvm.normalised(line) for line in lines]
    assert relaid != lines
    assert prove(original, new, relaid, groups) is None


def test_the_proof_catches_a_listing_that_is_not_the_plan(padded):
    original, new, lines, groups = padded
    assert "expected 's_nop 2'" in prove(original, new, lines, [[Expected("s_nop 2", bytes.fromhex("020080bf"))]
                                                                + groups[1][1:] if i == 1 else g
                                                                for i, g in enumerate(groups)])
    assert "more instructions than planned" in prove(original, new, lines, groups[:-1])
    assert prove(original, new, lines[:-1], groups) == (
        f"the listing ends inside the group of original instruction {len(groups) - 1}")
    # Original instruction 2 (s_sub) is the fourth line: the padded group of instruction 1 holds two.
    not_a_branch = [g if i != 2 else [5] for i, g in enumerate(groups)]
    assert "stands where original instruction 2, a branch, belongs" in prove(original, new, lines, not_a_branch)


def test_the_proof_catches_a_branch_landing_elsewhere(padded):
    original, new, lines, groups = padded
    wrong = [g if i != 4 else [2] for i, g in enumerate(groups)]
    assert "its original target is now at" in prove(original, new, lines, wrong)


def test_the_proof_catches_a_changed_descriptor_note_or_symbol(padded):
    original, new, lines, groups = padded
    table = elf.sections(new)
    rodata = next(s for s in table if s.name == ".rodata")
    note = next(s for s in table if s.name == ".note")
    for offset, expected in ((rodata.offset + 0x30, "kernel descriptor bytes differ"),
                             (rodata.offset + 0x10, "kernel_code_entry_byte_offset"),
                             (note.offset + note.size - 8, "metadata note differs")):
        changed = bytearray(new)
        changed[offset] ^= 0x40
        assert expected in prove(original, bytes(changed), lines, groups)
    symtab = next(s for s in table if s.type == elf.SHT_SYMTAB)
    changed = bytearray(new)
    changed[symtab.offset + 24 + 8] ^= 0x04  # the first symbol's value (label_loop)
    assert "symbol label_loop" in prove(original, bytes(changed), lines, groups)


def test_the_moved_file_says_gfx90a_everywhere(build_code_object, llvm_tools, tmp_path):
    src = tmp_path / "src"
    build_code_object(src / "loop.co", *LOOP)
    translate_tree(src, tmp_path / "dst", jobs=1, pads={"loop.co": [edits.Pad(consumer=4, wait_states=1)]})
    notes = subprocess.run([llvm_tools.tool("llvm-readelf"), "-h", "--notes", str(tmp_path / "dst" / "loop.co")],
                           capture_output=True, text=True, check=True).stdout
    assert "amdgcn-amd-amdhsa--gfx90a" in notes and "gfx942" not in notes


@pytest.mark.parametrize("kernel", ["padded", "in place"])
def test_a_written_kernel_that_does_not_say_gfx90a_is_an_error_and_not_left(kernel, build_code_object, tmp_path,
                                                                             monkeypatch):
    src = tmp_path / "src"
    build_code_object(src / "loop.co", *LOOP)
    retarget = elf.retarget_to_gfx90a

    def retarget_leaving_header_gfx942(data, code_object):  # the bug the check is for: the ELF header says gfx942
        retarget(data, code_object)
        (flags,) = struct.unpack_from("<I", data, elf.E_FLAGS_OFFSET)
        struct.pack_into("<I", data, elf.E_FLAGS_OFFSET, (flags & ~elf.MACH_MASK) | elf.MACH_GFX942)

    monkeypatch.setattr(elf, "retarget_to_gfx90a", retarget_leaving_header_gfx942)
    monkeypatch.setattr(workers, "pool", ThreadPoolExecutor)  # workers in this process, where the patch holds
    pads = {"loop.co": [edits.Pad(consumer=4, wait_states=1)]} if kernel == "padded" else {}
    report = translate_tree(src, tmp_path / "dst", jobs=1, pads=pads)
    entry = report["kernels"]["loop.co"]
    assert entry["status"] == "error", entry
    assert entry["reason"].startswith("proof failed: llvm-readelf does not say gfx90a: Flags: 0x54c, gfx942")
    assert not (tmp_path / "dst" / "loop.co").exists()


def test_every_written_kernel_is_checked_to_say_gfx90a_by_one_readelf_run_a_worker(build_code_object, tmp_path,
                                                                                    monkeypatch):
    src = tmp_path / "src"
    build_code_object(src / "loop.co", *LOOP)
    for name in ("a", "b"):
        build_code_object(src / f"{name}.co", "v_mov_b32_e32 v0, v1", "v_add_u32_e32 v0, 1, v0")
    runs = []
    run = llvm.run
    monkeypatch.setattr(llvm, "run", lambda argv, *rest: runs.append(argv[0].rsplit("/", 1)[-1]) or run(argv, *rest))
    monkeypatch.setattr(workers, "pool", ThreadPoolExecutor)  # workers in this process, where the count holds
    report = translate_tree(src, tmp_path / "dst", jobs=1, pads={"loop.co": [edits.Pad(consumer=4, wait_states=1)]})
    assert {relpath: entry["status"] for relpath, entry in report["kernels"].items()} == {
        "a.co": "written", "b.co": "written", "loop.co": "written"}
    assert runs.count("llvm-objdump") == 3  # one per write task: three audit batches of one kernel each
    assert runs.count("llvm-readelf") == 1


def test_one_write_task_proves_both_kinds_from_one_objdump_run(build_code_object, llvm_tools, tmp_path,
                                                               monkeypatch):
    src, staging = tmp_path / "src", tmp_path / "staging"
    build_code_object(src / "loop.co", *LOOP)
    build_code_object(src / "plain.co", "v_mov_b32_e32 v0, v1", "v_add_u32_e32 v0, 1, v0")
    with ThreadPoolExecutor(1) as pool:
        analysis = engine._analyse(src, ["loop.co", "plain.co"], llvm_tools, 1, pool, lambda message: None,
                                   audit=False)
    moves = edits.MoveBatch(["loop.co"], *analysis.moves_for(["loop.co"]),
                            {"loop.co": [edits.Pad(consumer=4, wait_states=1)]}, True, {})
    expected = analysis.expected_for(["plain.co"])
    # A wrong expected text for one instruction of the in-place kernel only: its proof must fail, the other's not.
    mov = next(chunk for chunk, (_, head, _) in expected.items() if "v_mov_b32" in head)
    encoding, head, tail = expected[mov]
    expected[mov] = (encoding, head.replace("v_mov_b32_e32 v0, v1", "v_mov_b32_e32 v0, v2"), tail)
    runs = []
    run = llvm.run
    monkeypatch.setattr(llvm, "run", lambda argv, *rest: runs.append(argv[0].rsplit("/", 1)[-1]) or run(argv, *rest))
    staging.mkdir()
    in_place, moved = write_and_prove.write_batch(llvm_tools, str(src), str(staging), ["plain.co"], expected, moves)
    # One llvm-mc run assembles the batch's re-assembled kernels, one llvm-objdump run proves both kinds; the target
    # check comes once all are written (write_and_prove.check_targets).
    assert runs == ["llvm-mc", "llvm-objdump"]
    assert len(in_place) == 1 and in_place[0][0] == "plain.co"
    assert "expected 'v_mov_b32_e32 v0, v2" in in_place[0][2]
    assert not (staging / "plain.co").exists()
    assert [(m.relpath, m.outcome, m.nops) for m in moved] == [("loop.co", "written", 1)]
    assert (staging / "loop.co").is_file()


def test_the_deploy_translation_follows_the_hosts_int8_k32_split(build_code_object, tmp_path, monkeypatch):
    src = tmp_path / "gfx942"
    build_code_object(src / "k32.co", K32)
    build_code_object(src / "plain.co", "v_mov_b32_e32 v0, v1")
    cache = tmp_path / "cache"
    off = ensure_translation(cache, "d" * 64, src, Policy())
    on = ensure_translation(cache, "d" * 64, src, Policy(int8_k32_split=True))
    assert (off.kernels, on.kernels) == (1, 2)
    assert off.digest != on.digest and off.archive != on.archive
    assert ensure_translation(cache, "d" * 64, src, Policy()) == off, "each policy keeps its own cached translation"
    # Another checkout's code (another memo key) sharing the cache gets its own slot: neither re-translates after it.
    monkeypatch.setattr(translated, "MEMO_FORMAT", translated.MEMO_FORMAT + "-other-checkout")
    ensure_translation(cache, "d" * 64, src, Policy())
    monkeypatch.undo()
    taken = []
    assert ensure_translation(cache, "d" * 64, src, Policy(), progress=taken.append) == off
    assert taken == [f"translated gfx942 tree {'d' * 12} taken from the controller cache"]


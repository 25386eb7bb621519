"""The judge stage (cdna2.kernels.judge) on instructions assembled here, and its batches merged by the engine."""

from __future__ import annotations

import pytest

from cdna2.kernels import batching, classify_tree, isa, judge, llvm
from tests.unit.kernels.conftest import BF16_MFMA, FP8_MFMA

PLAIN = "v_add_u32_e32 v0, v1, v2"
INT8_K32 = "v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[0:3]"


@pytest.fixture(scope="module")
def chunks(llvm_tools) -> dict[str, bytes]:
    encoded = dict(zip((PLAIN, BF16_MFMA, FP8_MFMA, INT8_K32),
                       llvm.assemble(llvm_tools, [PLAIN, BF16_MFMA, FP8_MFMA, INT8_K32], "gfx942")))
    assert all(error is None for _, error in encoded.values())
    chunks = {text: encoding for text, (encoding, _) in encoded.items()}
    chunks["half of an 8-byte instruction"] = chunks[FP8_MFMA][:4]
    return chunks


@pytest.mark.parametrize("with_split", [False, True])
def test_each_instruction_gets_its_verdict(llvm_tools, chunks, with_split):
    plain, bf16, fp8, int8, cut = range(5)
    verdicts = judge.judge_batch(llvm_tools, list(chunks.values()), with_split)

    assert verdicts.texts == [PLAIN, BF16_MFMA, FP8_MFMA, INT8_K32, None]
    assert verdicts.gfx90a_texts[bf16] == BF16_MFMA.replace("v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16bf16_1k")
    assert verdicts.encodings.keys() == {plain, bf16}
    assert verdicts.encodings[plain] == chunks[PLAIN]
    [(expected, _)] = llvm.assemble(llvm_tools, [verdicts.gfx90a_texts[bf16]], "gfx90a")
    assert verdicts.encodings[bf16] == expected != chunks[BF16_MFMA]  # the _1k opcode, not gfx942's bytes

    assert verdicts.reasons.keys() == verdicts.buckets.keys() == {fp8, int8, cut}
    assert verdicts.buckets[fp8] == "fp8" and verdicts.reasons[fp8].startswith("not valid gfx90a: ")
    assert verdicts.buckets[int8] == isa.INT8_K32
    assert verdicts.reasons[cut] == "LLVM does not decode these bytes as one gfx942 instruction"

    assert verdicts.splittable == [int8]
    if with_split:
        first, second = verdicts.halves[int8]
        assert (first.text, second.text) == ("v_mfma_i32_16x16x16i8 v[0:3], v4, v6, v[0:3]",
                                             "v_mfma_i32_16x16x16i8 v[0:3], v5, v7, v[0:3]")
        assert [half.encoding for half in (first, second)] == [
            encoding for encoding, _ in llvm.assemble(llvm_tools, [first.text, second.text], "gfx90a")]
    else:
        assert verdicts.halves == {}
    # Without the split its halves are planned by the rule, not assembled.
    assert (verdicts.assembled, verdicts.halves_assembled, verdicts.renamed) == ((6, 2, 1) if with_split else (4, 0, 1))


def test_a_split_that_cannot_be_done_exactly_says_why(llvm_tools):
    [(overlapping, _)] = llvm.assemble(llvm_tools, ["v_mfma_i32_16x16x32_i8 v[0:3], v[2:3], v[6:7], v[0:3]"], "gfx942")
    verdicts = judge.judge_batch(llvm_tools, [overlapping], True)
    assert verdicts.splittable == [] and verdicts.halves == {}
    assert "the destination overlaps A or B" in verdicts.reasons[0]


def test_verdicts_of_many_batches_are_those_of_one(build_code_object, tmp_path, monkeypatch):
    src = tmp_path / "gfx942"
    build_code_object(src / "a.co", PLAIN, "s_nop 1", BF16_MFMA, "s_nop 0")
    build_code_object(src / "b.co", PLAIN, FP8_MFMA, INT8_K32)
    build_code_object(src / "c.co", "v_mov_b32_e32 v3, v4", INT8_K32, "s_nop 7")

    def without_durations(report: dict) -> dict:
        return {key: value for key, value in report.items() if key != "durations"}

    messages: list[str] = []
    whole = classify_tree(src, jobs=2, progress=messages.append)
    monkeypatch.setattr(batching, "JUDGE_BATCH", 2)  # read by the parent, which cuts the batches
    cut = classify_tree(src, jobs=2, progress=messages.append)
    assert without_durations(cut) == without_durations(whole)
    judged = [message.split(" batches")[0].rsplit(" ", 1)[1] for message in messages if message.startswith("judged")]
    assert judged == ["1", str(-(-whole["distinct_instructions"] // 2))]
    assert {relpath: entry["status"] for relpath, entry in whole["kernels"].items()} == {
        "a.co": "portable", "b.co": "blocked", "c.co": "blocked"}
    assert whole["kernels"]["c.co"]["unlocked_by"] == "int8_k32_split"


def test_a_split_that_does_not_assemble_or_decode_back_says_which(llvm_tools, chunks, monkeypatch):
    int8 = 3
    real_assemble, real_decode = llvm.assemble, llvm.decode

    def assemble(tools, texts, mcpu):  # the second half made invalid: its line fails as llvm-mc would say
        return [(None, "invalid operand for instruction") if text.endswith("v5, v7, v[0:3]") else result
                for text, result in zip(texts, real_assemble(tools, texts, mcpu))]

    monkeypatch.setattr(llvm, "assemble", assemble)
    verdicts = judge.judge_batch(llvm_tools, list(chunks.values()), True)
    assert verdicts.splittable == [] and verdicts.reasons[int8].endswith(
        "; its split does not assemble for gfx90a: invalid operand for instruction")

    monkeypatch.setattr(llvm, "assemble", real_assemble)
    monkeypatch.setattr(llvm, "decode", lambda tools, chunks, mcpu: (
        [None] * len(chunks) if mcpu == "gfx90a" else real_decode(tools, chunks, mcpu)))
    verdicts = judge.judge_batch(llvm_tools, list(chunks.values()), True)
    assert verdicts.splittable == [] and verdicts.reasons[int8].endswith(
        "; LLVM does not decode the halves of its split back as one instruction each")
    monkeypatch.setattr(llvm, "assemble", assemble)
    without = judge.judge_batch(llvm_tools, list(chunks.values()), False)
    assert without.splittable == [int8] and without.reasons[int8] == verdicts.reasons[int8].split(";")[0], \
        "without the split the rule alone says what it would unlock: its halves are neither assembled nor decoded"

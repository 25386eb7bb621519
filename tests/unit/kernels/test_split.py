"""The int8 K=32 split is exact: the gfx942 MFMA and its two gfx90a halves leave the same registers, on an emulator
of AMD's documented operand layouts (mfma_emulator.py), for random and extreme int8 inputs and accumulate chains;
and a deliberately wrong split is caught."""

from __future__ import annotations

import random

import pytest

from cdna2.kernels.split import split_int8_k32
from tests.unit.kernels import mfma_emulator as emu

K32_FORMS = {  # the forms real kernels use: destination VGPRs, A in AGPRs or VGPRs, SrcC the destination or 0
    "16x16": ("v_mfma_i32_16x16x32_i8 v[0:3], a[4:5], v[6:7], v[0:3]",
              "v_mfma_i32_16x16x32_i8 v[8:11], v[12:13], v[14:15], 0"),
    "32x32": ("v_mfma_i32_32x32x16_i8 v[0:15], a[4:5], v[16:17], v[0:15]",
              "v_mfma_i32_32x32x16_i8 v[20:35], v[36:37], v[38:39], 0"),
}


def register_file(rng: random.Random, fill) -> dict[tuple[str, int], list[int]]:
    return {(kind, n): [fill(rng) for _ in range(emu.WAVE)] for kind in "va" for n in range(40)}


def random_word(rng: random.Random) -> int:
    return rng.getrandbits(32)


def extreme_word(rng: random.Random) -> int:
    """Bytes drawn from -128, -1, 0, 1, 127: the products and sums at the edges of int8 and int32."""
    return int.from_bytes(bytes(rng.choice((0x80, 0xFF, 0x00, 0x01, 0x7F)) for _ in range(4)), "little")


def run_all(texts, registers):
    for text in texts:
        emu.run(text, registers)
    return registers


def test_emulator_computes_c_plus_a_times_b_in_its_layout():
    rng = random.Random(7)
    for name in emu.SHAPES:
        s = emu.shape(name)
        a = [[rng.randint(-128, 127) for _ in range(s.k)] for _ in range(s.m)]
        b = [[rng.randint(-128, 127) for _ in range(s.n)] for _ in range(s.k)]
        c = [[rng.randint(-2**31, 2**31 - 1) for _ in range(s.n)] for _ in range(s.m)]
        a_regs = [[0] * emu.WAVE for _ in range(s.ab_registers)]
        b_regs = [[0] * emu.WAVE for _ in range(s.ab_registers)]
        c_regs = [[0] * emu.WAVE for _ in range(s.cd_registers)]
        for i in range(s.m):
            for k in range(s.k):
                register, lane, byte = s.ab_place(i, k)
                a_regs[register][lane] |= (a[i][k] & 0xFF) << (8 * byte)
        for k in range(s.k):
            for j in range(s.n):
                register, lane, byte = s.ab_place(j, k)
                b_regs[register][lane] |= (b[k][j] & 0xFF) << (8 * byte)
        for i in range(s.m):
            for j in range(s.n):
                register, lane = s.cd_place(i, j)
                c_regs[register][lane] = c[i][j] & 0xFFFFFFFF
        d = emu.mfma(name, a_regs, b_regs, c_regs)
        for i in range(s.m):
            for j in range(s.n):
                register, lane = s.cd_place(i, j)
                want = (c[i][j] + sum(a[i][k] * b[k][j] for k in range(s.k))) & 0xFFFFFFFF
                assert d[register][lane] == want, (name, i, j)


@pytest.mark.parametrize("form", [t for pair in K32_FORMS.values() for t in pair])
@pytest.mark.parametrize("fill", [random_word, extreme_word], ids=["random", "extreme"])
def test_split_leaves_the_same_registers_as_the_k32_mfma(form, fill):
    halves, why = split_int8_k32(form)
    assert why is None
    rng = random.Random(f"{form}{fill.__name__}")
    for _ in range(3):
        registers = register_file(rng, fill)
        assert run_all([form], dict(registers)) == run_all(halves, dict(registers))


@pytest.mark.parametrize("size", sorted(K32_FORMS))
def test_split_is_exact_on_accumulate_chains(size):
    form = K32_FORMS[size][0]  # SrcC is the destination: D += A x B, with new A and B each step
    halves, _ = split_int8_k32(form)
    rng = random.Random(size)
    original, split = register_file(rng, extreme_word), None
    split = dict(original)
    for step in range(6):
        for register in (("a", 4), ("a", 5), ("v", 6), ("v", 7), ("v", 16), ("v", 17)):
            original[register] = split[register] = [rng.getrandbits(32) for _ in range(emu.WAVE)]
        run_all([form], original)
        run_all(halves, split)
        assert original == split, f"step {step}"


def wrong_splits(form: str) -> dict[str, list[str]]:
    (first, second), _ = split_int8_k32(form)
    name, ops = first.split(" ", 1)
    d, a_low, b_low, c = [o.strip() for o in ops.split(",")]
    _, a_high, b_high, _ = [o.strip() for o in second.split(" ", 1)[1].split(",")]
    lost = ([first, f"{name} {d}, {a_high}, {b_high}, 0"] if c == "0"  # the second half drops the first's sum
            else [f"{name} {d}, {a_low}, {b_low}, 0", second])  # the first half drops C
    return {
        "low A with high B": [f"{name} {d}, {a_low}, {b_high}, {c}", f"{name} {d}, {a_high}, {b_low}, {d}"],
        "an accumulation lost": lost,
        "only the low half": [first],
    }


@pytest.mark.parametrize("form", [t for pair in K32_FORMS.values() for t in pair])
def test_a_deliberately_wrong_split_fails(form):
    rng = random.Random(form)
    registers = register_file(rng, random_word)
    want = run_all([form], dict(registers))
    for label, texts in wrong_splits(form).items():
        assert run_all(texts, dict(registers)) != want, label


@pytest.mark.parametrize("text, reason", [
    ("v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[8:11]", "neither the destination nor 0"),
    ("v_mfma_i32_16x16x32_i8 v[0:3], v[2:3], v[6:7], v[0:3]", "overlaps A or B"),
    ("v_mfma_i32_16x16x32_i8 a[0:3], a[0:1], v[6:7], a[0:3]", "overlaps A or B"),
    ("v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[0:3] cbsz:1", "not in the form"),
    ("v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[0:3] clamp", "not in the form"),
])
def test_split_refuses_what_it_cannot_do_exactly(text, reason):
    halves, why = split_int8_k32(text)
    assert halves is None and reason in why


def test_agpr_a_and_vgpr_destination_do_not_overlap():
    halves, why = split_int8_k32("v_mfma_i32_16x16x32_i8 v[0:3], a[0:1], v[6:7], v[0:3]")
    assert why is None and halves[0] == "v_mfma_i32_16x16x16i8 v[0:3], a0, v6, v[0:3]"

"""Instruction splitting, renames and buckets, checked against LLVM's own encodings."""

from __future__ import annotations

import pytest

from cdna2.kernels import isa, llvm

# One instruction of every length rule the splitter knows, as gfx942 spells them.
EVERY_FORMAT = [
    "s_nop 0",  # SOPP
    "s_mov_b32 s0, s1",  # SOP1
    "s_mov_b32 s0, 0x12345678",  # SOP1 + literal
    "s_add_u32 s0, s1, s2",  # SOP2
    "s_add_u32 s0, 0x12345678, s2",  # SOP2 + literal in src0
    "s_add_u32 s0, s2, 0x12345678",  # SOP2 + literal in src1
    "s_cmp_eq_u32 s0, 0x12345678",  # SOPC + literal
    "s_cmp_eq_u32 s0, s1",  # SOPC
    "s_movk_i32 s0, 0x1234",  # SOPK
    "s_setreg_imm32_b32 hwreg(HW_REG_MODE), 0x12345678",  # SOPK with a constant
    "s_load_dwordx2 s[0:1], s[2:3], 0x10",  # SMEM
    "v_mov_b32_e32 v0, v1",  # VOP1
    "v_mov_b32_e32 v0, 0x12345678",  # VOP1 + literal
    "v_add_f32_e32 v0, v1, v2",  # VOP2
    "v_fmamk_f32 v0, v1, 0x42000000, v2",  # VOP2 with a mandatory constant
    "v_mov_b32_sdwa v0, v1 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:DWORD",  # SDWA
    "v_xor_b32_dpp v0, v1, v2 quad_perm:[0,1,2,3] row_mask:0xf bank_mask:0xf",  # DPP
    "v_cmp_eq_u32_e32 vcc, v0, v1",  # VOPC
    "v_add_f64 v[0:1], v[2:3], v[4:5]",  # VOP3
    "v_pk_add_f32 v[0:1], v[2:3], v[4:5]",  # VOP3P
    "v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]",  # MFMA
    "ds_read_b32 v0, v1",  # DS
    "global_load_dword v0, v[2:3], off",  # FLAT
    "buffer_load_dword v0, v1, s[4:7], 0 offen",  # MUBUF
]


def test_split_cuts_every_format_where_llvm_does(llvm_tools):
    encoded = llvm.assemble(llvm_tools, EVERY_FORMAT, "gfx942")
    assert all(error is None for _, error in encoded), encoded
    encodings = [encoding for encoding, _ in encoded]
    assert isa.split_instructions(b"".join(encodings)) == encodings


def test_split_refuses_a_partial_word():
    with pytest.raises(isa.SplitError, match="not a whole number"):
        isa.split_instructions(b"\x00\x00\x80\xbf\x00")


def test_split_refuses_an_instruction_cut_off_by_the_section_end():
    with pytest.raises(isa.SplitError, match="past the end"):
        isa.split_instructions(bytes.fromhex("0080e1d3"))  # first half of an 8-byte MFMA (0xD3E1...)


OPERAND_SHAPES = [f" {acc}, {src}, {src2}, {acc}" for acc in ("a[0:3]", "a[0:15]", "a[0:31]", "v[0:7]", "v[0:1]")
                  for src, src2 in (("v[0:1]", "v[2:3]"), ("v0", "v1"))]


@pytest.mark.parametrize("old, new", sorted(isa.RENAMES.items()))
def test_every_rename_is_the_same_gfx942_instruction_and_valid_gfx90a(llvm_tools, old, new):
    # The gfx90a spelling assembled for gfx942 must give the very bytes of the gfx942 spelling.
    results = llvm.assemble(llvm_tools, [old + shape for shape in OPERAND_SHAPES], "gfx942")
    shape, (original, _) = next((s, r) for s, r in zip(OPERAND_SHAPES, results) if r[0] is not None)
    [(alias, _)] = llvm.assemble(llvm_tools, [new + shape], "gfx942")
    [(gfx90a, error)] = llvm.assemble(llvm_tools, [new + shape], "gfx90a")
    assert alias == original, f"{new} is not the gfx942 instruction {old}"
    assert error is None and len(gfx90a) == len(original), f"{new + shape} on gfx90a: {error}"


def test_bf16_16x16x16_renames_to_the_1k_opcode(llvm_tools):
    text = isa.rename("v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]")
    assert text == "v_mfma_f32_16x16x16bf16_1k a[0:3], v[0:1], v[2:3], a[0:3]"
    [(encoding, error)] = llvm.assemble(llvm_tools, [text], "gfx90a")
    assert error is None and encoding[2:4] == bytes.fromhex("e7d3"), "must be D3E7 (bf16_1k), never D3CD (f16)"


@pytest.mark.parametrize("text, bucket", [
    ("v_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[0:1], v[2:3], a[0:3]", "fp8"),
    ("v_cvt_pk_f32_bf8_e32 v[0:1], v2", "fp8"),
    ("v_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3]", "gfx950-only"),
    ("v_mfma_i32_16x16x32_i8 a[0:3], v[0:1], v[2:3], a[0:3]", "int8 with K=32"),
    ("global_atomic_pk_add_bf16 v0, v1, s[0:1]", "bf16 atomics"),
    ("v_lshl_add_u64 v[0:1], v[0:1], 1, s[0:1]", "64-bit VALU"),
    ("v_mov_b64_e32 v[0:1], v[2:3]", "64-bit VALU"),
    ("buffer_store_dword v100, v18, s[16:19], 0 offen nt sc1", "cache-policy modifiers"),
    ("s_sleep 1", "other"),
])
def test_buckets(text, bucket):
    assert isa.bucket_of(text) == bucket

"""The MFMA wait-state audit, checked against LLVM's own hazard recognizer and on small listings."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import pytest

from cdna2.kernels import hazard_instructions, llvm
from cdna2.kernels import hazard_rules as rules
from cdna2.kernels.hazards import audit_listing, listing_from_objdump

# --- one producer, one consumer, through llc -run-pass=post-RA-hazard-rec ------------------------------------------


@dataclass(frozen=True)
class Mfma:
    opcode: str  # LLVM's MIR opcode (VGPR destination form)
    asm: str  # gfx90a spelling (the audit reads either)
    a: int  # registers of SrcA, SrcB
    c: int  # registers of SrcC and the destination


MFMAS = {
    "16x16x16bf16": Mfma("V_MFMA_F32_16X16X16BF16_1K_vgprcd_e64", "v_mfma_f32_16x16x16bf16_1k", 2, 4),
    "32x32x8bf16": Mfma("V_MFMA_F32_32X32X8BF16_1K_vgprcd_e64", "v_mfma_f32_32x32x8bf16_1k", 2, 16),
    "4x4x4f16": Mfma("V_MFMA_F32_4X4X4F16_vgprcd_e64", "v_mfma_f32_4x4x4f16", 2, 4),
    "16x16x4f32": Mfma("V_MFMA_F32_16X16X4F32_vgprcd_e64", "v_mfma_f32_16x16x4f32", 1, 4),  # not XDL on gfx942
    "32x32x2f32": Mfma("V_MFMA_F32_32X32X2F32_vgprcd_e64", "v_mfma_f32_32x32x2f32", 1, 16),
}


def mir_reg(bank: str, first: int, count: int = 1) -> str:
    return "$" + "_".join(f"{bank}{index}" for index in range(first, first + count))


def asm_reg(bank: str, first: int, count: int = 1) -> str:
    return f"{bank}{first}" if count == 1 else f"{bank}[{first}:{first + count - 1}]"


def mfma(kind: str, dst: int, c: int, a: int = 32, bank: str = "v") -> tuple[str, str]:
    """(MIR, asm) of an MFMA writing `dst`, reading SrcA at `a`, SrcB after it, SrcC at `c`."""
    m = MFMAS[kind]
    opcode = m.opcode.replace("_vgprcd", "") if bank == "a" else m.opcode
    mir_bank = "agpr" if bank == "a" else "vgpr"
    operands = (mir_reg("vgpr", a, m.a), mir_reg("vgpr", a + 2, m.a), mir_reg(mir_bank, c, m.c))
    mir = (f"{mir_reg(mir_bank, dst, m.c)} = {opcode} {', '.join(operands)}, 0, 0, 0, "
           "implicit $mode, implicit $exec")
    asm = (f"{m.asm} {asm_reg(bank, dst, m.c)}, {asm_reg('v', a, m.a)}, {asm_reg('v', a + 2, m.a)}, "
           f"{asm_reg(bank, c, m.c)}")
    return mir, asm


VALU_READ = ("$vgpr20 = V_ADD_F32_e32 $vgpr1, $vgpr21, implicit $mode, implicit $exec", "v_add_f32_e32 v20, v1, v21")
ACC_READ = ("$vgpr20 = V_ACCVGPR_READ_B32_e64 $agpr1, implicit $exec", "v_accvgpr_read_b32 v20, a1")
STORE = ("GLOBAL_STORE_DWORD $vgpr22_vgpr23, $vgpr1, 0, 0, implicit $exec", "global_store_dword v[22:23], v1, off")
LDS_WRITE = ("DS_WRITE_B32_gfx9 $vgpr22, $vgpr1, 0, 0, implicit $exec", "ds_write_b32 v22, v1")
VALU_WRITE = ("$vgpr1 = V_MOV_B32_e32 $vgpr21, implicit $exec", "v_mov_b32_e32 v1, v21")
LOAD = ("$vgpr1 = GLOBAL_LOAD_DWORD $vgpr22_vgpr23, 0, 0, implicit $exec", "global_load_dword v1, v[22:23], off")
ACC_WRITE = ("$agpr1 = V_ACCVGPR_WRITE_B32_e64 $vgpr21, implicit $exec", "v_accvgpr_write_b32 a1, v21")
SRCA_WRITE = ("$vgpr33 = V_MOV_B32_e32 $vgpr21, implicit $exec", "v_mov_b32_e32 v33, v21")
CMPX = ("V_CMPX_EQ_U32_e32 $vgpr21, $vgpr22, implicit-def $vcc, implicit-def $exec, implicit $exec",
        "v_cmpx_eq_u32_e32 vcc, v21, v22")

# (name, rule the audit must name, producer, consumer)
CASES = [
    *[(f"{kind}-valu-read", rules.VALU_READ, mfma(kind, 0, 0), VALU_READ) for kind in MFMAS],
    ("16x16x16bf16-accvgpr-read", rules.VALU_READ, mfma("16x16x16bf16", 0, 0, bank="a"), ACC_READ),
    ("32x32x8bf16-accvgpr-read", rules.VALU_READ, mfma("32x32x8bf16", 0, 0, bank="a"), ACC_READ),
    *[(f"{kind}-store", rules.MEM_READ, mfma(kind, 0, 0), STORE) for kind in ("16x16x16bf16", "32x32x2f32")],
    *[(f"{kind}-lds-write", rules.MEM_READ, mfma(kind, 0, 0), LDS_WRITE) for kind in ("4x4x4f16", "32x32x8bf16")],
    *[(f"{kind}-valu-overwrite", rules.WAW, mfma(kind, 0, 0), VALU_WRITE) for kind in ("16x16x16bf16", "16x16x4f32")],
    ("32x32x8bf16-load-overwrite", rules.WAW, mfma("32x32x8bf16", 0, 0), LOAD),
    ("16x16x16bf16-accvgpr-overwrite", rules.WAW, mfma("16x16x16bf16", 0, 0, bank="a"), ACC_WRITE),
    *[(f"{kind}-srcc-overwrite", rules.WAR, mfma(kind, 48, 0), VALU_WRITE) for kind in MFMAS],
    *[(f"{kind}-srcc-same", rules.SRCC_EXACT, mfma(kind, 0, 0), mfma(kind, 64, 0))
      for kind in ("16x16x16bf16", "4x4x4f16", "32x32x2f32")],
    *[(f"{kind}-srcc-partial", rules.SRCC_OVERLAP, mfma(kind, 0, 0), mfma(kind, 64, 2)) for kind in MFMAS],
    ("16x16x4f32-srcc-partial-xdl-reader", rules.SRCC_OVERLAP, mfma("16x16x4f32", 0, 0),
     mfma("16x16x16bf16", 64, 2)),
    *[(f"{kind}-srcab", rules.SRC_AB, mfma(kind, 0, 0), mfma(kind, 64, 64, a=0)) for kind in MFMAS],
    ("valu-write-srca", rules.VALU_WRITE, SRCA_WRITE, mfma("16x16x16bf16", 0, 0)),
    ("accvgpr-write-srcc", rules.VALU_WRITE, ACC_WRITE, mfma("16x16x16bf16", 0, 0, bank="a")),
    ("cmpx-exec", rules.EXEC_WRITE, CMPX, mfma("16x16x16bf16", 0, 0)),
]


def mir_module(cases) -> str:
    functions = []
    for name, _, producer, consumer in cases:
        functions.append(f"---\nname: {name.replace('-', '_')}\ntracksRegLiveness: false\nbody: |\n  bb.0:\n"
                         f"    {producer[0]}\n    {consumer[0]}\n    S_ENDPGM 0\n...\n")
    return "".join(functions)


@pytest.fixture(scope="module")
def llc_nops(llvm_tools) -> dict[tuple[str, str], int]:
    """Wait states llc's post-RA hazard recognizer inserts between producer and consumer, per case and CPU."""
    inserted = {}
    for cpu in rules.TARGETS:
        result = subprocess.run([llvm_tools.tool("llc"), "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={cpu}",
                                 "-run-pass=post-RA-hazard-rec", "-x", "mir", "-o", "-", "-"], input=mir_module(CASES),
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        for name, body in re.findall(r"^name:\s+(\S+)\n(.*?)^\.\.\.", result.stdout, re.M | re.S):
            inserted[name.replace("_", "-"), cpu] = sum(int(n) + 1 for n in re.findall(r"S_NOP (\d+)", body))
    return inserted


@pytest.mark.parametrize("cpu", rules.TARGETS)
@pytest.mark.parametrize("name, rule, producer, consumer", CASES, ids=[case[0] for case in CASES])
def test_audit_requires_what_llvm_inserts(llc_nops, cpu, name, rule, producer, consumer):
    audit = audit_listing([(0, 8, producer[1]), (8, 8, consumer[1])], cpu)
    assert audit.unparsed == [] and audit.dependencies >= 1
    need = llc_nops[name, cpu]
    if need == 0:
        assert audit.short_edges == [], f"llc inserts nothing on {cpu}; the audit flags {audit.short_edges}"
        producer_mfma, consumer_mfma = (hazard_instructions.parse(text).mfma for text in (producer[1], consumer[1]))
        assert rules.needed(rule, cpu, producer_mfma, consumer_mfma) == 0
        return
    assert {edge.rule for edge in audit.short_edges} >= {rule}
    assert max(edge.needed for edge in audit.short_edges) == need, f"llc inserts {need} wait states on {cpu}"
    assert all(edge.present == 0 and edge.path == "straight-line" for edge in audit.short_edges)


def test_the_cases_cover_every_rule_and_differ_between_the_chips(llc_nops):
    assert {rule for _, rule, _, _ in CASES} == {rules.VALU_READ, rules.MEM_READ, rules.WAW, rules.WAR,
                                                 rules.SRCC_EXACT, rules.SRCC_OVERLAP, rules.SRC_AB,
                                                 rules.VALU_WRITE, rules.EXEC_WRITE}
    assert llc_nops["16x16x16bf16-valu-read", "gfx90a"] == 11 and llc_nops["16x16x16bf16-valu-read", "gfx942"] == 7
    assert llc_nops["32x32x8bf16-valu-read", "gfx90a"] == 19 and llc_nops["32x32x8bf16-valu-read", "gfx942"] == 11


# --- a kernel llc compiles from IR ----------------------------------------------------------------------------------

IR_KERNEL = """
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16f16(<4 x half>, <4 x half>, <4 x float>, i32, i32, i32)

define amdgpu_kernel void @mfma_loop(ptr addrspace(1) %out, ptr addrspace(1) %in, i32 %n) {
entry:
  %a = load <4 x half>, ptr addrspace(1) %in
  %b.ptr = getelementptr <4 x half>, ptr addrspace(1) %in, i32 1
  %b = load <4 x half>, ptr addrspace(1) %b.ptr
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i.next, %loop ]
  %acc = phi <4 x float> [ zeroinitializer, %entry ], [ %scaled, %loop ]
  %m = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16f16(<4 x half> %a, <4 x half> %b, <4 x float> %acc,
                                                           i32 0, i32 0, i32 0)
  %scaled = fmul <4 x float> %m, <float 0.5, float 0.5, float 0.5, float 0.5>
  %i.next = add i32 %i, 1
  %again = icmp slt i32 %i.next, %n
  br i1 %again, label %loop, label %done
done:
  store <4 x float> %scaled, ptr addrspace(1) %out
  ret void
}
""".replace("\n                                                           ", " ")


@pytest.mark.parametrize("cpu", rules.TARGETS)
def test_kernel_compiled_by_llc_audits_clean(llvm_tools, tmp_path, cpu):
    source, obj = tmp_path / "k.ll", tmp_path / "k.o"
    source.write_text(IR_KERNEL)
    subprocess.run([llvm_tools.tool("llc"), "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={cpu}", "-O2", "-filetype=obj",
                    str(source), "-o", str(obj)], check=True, capture_output=True)
    lines = llvm.objdump_lines(llvm_tools, [obj], cpu)[str(obj)]
    audit = audit_listing(listing_from_objdump(lines), cpu)
    assert audit.mfmas >= 1 and audit.dependencies >= 2, "the loop's MFMA feeds VALUs and itself"
    assert any(text.startswith("s_cbranch") for _, _, text in listing_from_objdump(lines)), "a loop: a back edge"
    assert audit.verdict == rules.CLEAN, [edge.to_json() for edge in audit.short_edges]


# --- paths, counting, staggered writeback, parsing ------------------------------------------------------------------

def assembled(llvm_tools, lines: list[str], cpu: str = "gfx90a") -> list[tuple[int, int, str]]:
    """(address, size, text) of assembly lines, sizes from llvm-mc (branch operands are word offsets)."""
    listing, address = [], 0
    for text, (encoding, error) in zip(lines, llvm.assemble(llvm_tools, lines, cpu)):
        assert error is None, f"{text}: {error}"
        listing.append((address, len(encoding), text))
        address += len(encoding)
    return listing


MFMA_16 = "v_mfma_f32_16x16x16bf16_1k v[0:3], v[4:5], v[6:7], v[0:3]"
READ_V1 = "v_add_f32_e32 v8, v1, v9"


def test_s_nop_n_counts_n_plus_one(llvm_tools):
    listing = assembled(llvm_tools, [MFMA_16, "s_nop 7", "s_nop 1", READ_V1])
    (edge,) = audit_listing(listing).short_edges
    assert (edge.present, edge.needed, edge.path, edge.passes_wait) == (10, 11, "straight-line", False)
    assert audit_listing(assembled(llvm_tools, [MFMA_16, "s_nop 7", "s_nop 2", READ_V1])).verdict == rules.CLEAN


def test_straight_line_edge_says_whether_it_passes_a_wait(llvm_tools):
    listing = assembled(llvm_tools, [MFMA_16, "s_waitcnt lgkmcnt(0)", "s_barrier", READ_V1])
    (edge,) = audit_listing(listing).short_edges
    assert (edge.present, edge.passes_wait) == (2, True), "each counts one wait state, as in LLVM"
    branch = audit_listing(assembled(llvm_tools, [MFMA_16, "s_cbranch_scc0 0", READ_V1])).short_edges
    assert {edge.passes_wait for edge in branch} == {None}


def test_fall_through_across_a_branch(llvm_tools):
    # The branch skips the read (to s_endpgm): the read is reached by falling through it only.
    listing = assembled(llvm_tools, [MFMA_16, "s_cbranch_scc0 2", "s_nop 0", READ_V1, "s_endpgm"])
    audit = audit_listing(listing)
    assert [(e.path, e.present, e.producer_address, e.consumer_address) for e in audit.short_edges] == [
        ("fall-through", 2, 0, 16)], "the branch itself is one wait state"
    assert audit.verdict == rules.SHORT_BRANCHES and audit.worst.consumer == READ_V1


def test_taken_branch_is_its_own_path(llvm_tools):
    # MFMA, branch over 8 wait states straight to the read: 1 wait state on the taken path, 9 on the fall-through.
    listing = assembled(llvm_tools, [MFMA_16, "s_cbranch_scc1 1", "s_nop 7", READ_V1])
    paths = {edge.path: edge.present for edge in audit_listing(listing).short_edges}
    assert paths == {"taken-branch": 1, "fall-through": 9}


def test_loop_back_edge(llvm_tools):
    # The read at the loop head sees the MFMA at the loop end through the back edge only.
    listing = assembled(llvm_tools, [READ_V1, "s_nop 3", MFMA_16, "s_cbranch_scc1 65531", "s_endpgm"])
    (edge,) = audit_listing(listing).short_edges
    assert (edge.path, edge.present, edge.producer_address, edge.consumer_address) == ("taken-branch", 1, 8, 0)


def test_tight_loop_settles(llvm_tools):
    # 3 wait states a turn: paths go round the loop several times within the look-back; the nearest MFMA counts.
    listing = assembled(llvm_tools, [READ_V1, MFMA_16, "s_cbranch_scc1 65532", "s_endpgm"])
    audit = audit_listing(listing)
    assert [(e.rule, e.path, e.present, e.needed) for e in audit.short_edges] == [
        (rules.VALU_READ, "taken-branch", 1, 11)], "the MFMA reads its own result as SrcC: 0 needed on gfx90a"


def test_unconditional_branch_has_no_fall_through(llvm_tools):
    listing = assembled(llvm_tools, [MFMA_16, "s_branch 1", READ_V1, "s_nop 7", "s_nop 7", "s_endpgm"])
    assert audit_listing(listing).verdict == rules.CLEAN, "the read after s_branch is never reached from the MFMA"


def test_staggered_writeback_is_credited_on_gfx942_only(llvm_tools):
    # Register k of the 4-pass result read after 4+k wait states, as AMD's gfx942 code does.
    reads = [f"v_add_f32_e32 v{8 + k}, v{k}, v9" for k in range(4)]
    lines = ["v_mfma_f32_16x16x16_bf16 v[0:3], v[4:5], v[6:7], v[0:3]", "s_nop 3", *reads]
    gfx942 = audit_listing(assembled(llvm_tools, lines, "gfx942"), "gfx942")
    assert gfx942.verdict == rules.CLEAN and gfx942.staggered == 3, "k = 0, 1, 2 are below LLVM's 7"
    gfx90a = audit_listing(assembled(llvm_tools, [hazards_rename(line) for line in lines]))
    assert [(e.present, e.needed, e.short_on_gfx942) for e in gfx90a.short_edges] == [
        (4, 11, False), (5, 11, False), (6, 11, False), (7, 11, False)]
    early = audit_listing(assembled(llvm_tools, [lines[0], "s_nop 2", reads[1]], "gfx942"), "gfx942")
    assert [(e.present, e.needed) for e in early.short_edges] == [(3, 7)], "register 1 before 5 wait states"


def hazards_rename(line: str) -> str:
    from cdna2.kernels.isa import rename
    return rename(line)


def test_unparsed_line_and_unresolved_branch_are_never_clean():
    audit = audit_listing([(0, 8, "v_mfma_f32_99x99x1_bf16 v[0:3], v[4:5], v[6:7], v[0:3]"), (8, 4, "s_branch 7")])
    assert audit.verdict == rules.UNAUDITED
    assert audit.unparsed[0][0] == 0 and "no pass count" in audit.unparsed[0][2]
    assert audit.unresolved == [(8, "s_branch 7")]
    labelled = audit_listing([(0, 4, "s_branch label_0001"), (4, 4, "s_endpgm")])
    assert labelled.verdict == rules.UNAUDITED and "listing_from_objdump" in labelled.unparsed[0][2]


@pytest.mark.parametrize("text, reads, writes", [
    ("buffer_load_dword v216, s[12:15], 0 idxen lds", [(216, 216)], []),  # into LDS: v216 is the index
    ("buffer_atomic_add_f32 v137, v8, s[32:35], 0 idxen", [(137, 137), (8, 8)], []),
    ("buffer_atomic_add_f32 v1, v2, s[0:3], 0 offen glc", [(2, 2), (1, 1)], [(1, 1)]),
    ("global_atomic_add_f32 v0, v[1:2], v3, off sc0", [(1, 2), (3, 3)], [(0, 0)]),
    ("ds_read_b128 a[16:19], v24", [(24, 24)], [(272, 275)]),
    ("ds_bpermute_b32 v185, v186, v149", [(186, 186), (149, 149)], [(185, 185)]),
    ("v_cmp_u_f32_e64 s[74:75], v58, v58", [(58, 58), (58, 58)], []),
    ("v_pk_fma_f32 v[38:39], v[26:27], v[26:27], v[38:39] neg_lo:[0,1,0]", [(26, 27), (26, 27), (38, 39)],
     [(38, 39)]),
])
def test_operand_roles(text, reads, writes):
    facts = hazard_instructions.parse(text)
    assert (list(facts.reads), list(facts.writes)) == (reads, writes)


def test_policies():
    assert [rules.installs("default", v) for v in rules.VERDICTS] == [True, True, False, False]
    assert [rules.installs("strict", v) for v in rules.VERDICTS] == [True, False, False, False]
    assert all(rules.installs("permissive", v) for v in rules.VERDICTS)

"""The re-assembly stage: code object -> assembly source -> llvm-mc + ld.lld -> the original's linker facts restored.

With no edit the output must be the input, byte for byte: on small kernels built here, and on every kernel of the
amd-aiter 0.1.7.post2.dev18 tree (PyPI) and of AITER v0.1.19's and v0.1.20.post1's hsa/gfx942 (git history).
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest

from cdna2.cache import cache_root, code_digest
from cdna2.host import elf
from cdna2.host.digests import tree_digest
from cdna2.host.state import write_file_atomically
from cdna2.kernels import isa, reassemble
from lab import wheelhouse
from tests.unit.kernels.conftest import aiter_git_tree

LOOP = ("s_mov_b32 s0, 4", "label_loop:", "v_add_u32_e32 v0, 1, v0", "s_sub_u32 s0, s0, 1",
        "s_cmp_eq_u32 s0, 0", "s_cbranch_scc0 label_loop", "s_cbranch_execz label_done", "v_mov_b32_e32 v1, v0",
        "label_done:")


def round_trip(tools, source: Path, target: Path, *edits: reassemble.Edit) -> reassemble.Rebuilt:
    job = reassemble.Job("k.co", str(source), str(target), "gfx942", edits=edits)
    return reassemble.rebuild(tools, [job])[0]


def test_kernel_with_branches_and_labels_round_trips_byte_identical(build_code_object, llvm_tools, tmp_path):
    source = build_code_object(tmp_path / "loop.co", *LOOP)
    result = round_trip(llvm_tools, source, tmp_path / "out.co")
    assert result.error is None
    assert (tmp_path / "out.co").read_bytes() == source.read_bytes()


def test_branch_targets_are_computed_from_the_encoding(build_code_object, tmp_path):
    data = build_code_object(tmp_path / "loop.co", *LOOP).read_bytes()
    code_object = elf.read_code_object(data)
    instructions = isa.split_instructions(elf.text_of(data, code_object))
    # s_mov_b32 s0, 4 is instruction 0; the loop starts at 1; the backward branch is 4, the forward one 5.
    assert reassemble.branch_targets(instructions, isa.offsets(instructions)) == {4: 1, 5: 7}


def test_code_reading_the_pc_is_refused(build_code_object, llvm_tools, tmp_path):
    source = build_code_object(tmp_path / "pc.co", "s_getpc_b64 s[0:1]")
    result = round_trip(llvm_tools, source, tmp_path / "out.co")
    assert result.error is not None and "s_getpc_b64" in result.error and "cannot move" in result.error
    assert not (tmp_path / "out.co").exists()


@pytest.mark.parametrize("nops", [1, 3, 1100], ids=["one", "three", "past-a-page"])
def test_moved_code_is_laid_out_as_ld_lld_lays_it_out(build_code_object, llvm_tools, tmp_path, nops):
    # The same kernel written with the nops in its source and linked by ld.lld is what the rebuild must produce:
    # every section after .text, the program headers and the symbols follow the code as ld.lld moves them.
    source = build_code_object(tmp_path / "loop.co", *LOOP)
    padded = LOOP[:2] + ("s_nop 0",) * nops + LOOP[2:]
    linked = build_code_object(tmp_path / "linked" / "loop.co", *padded)
    result = round_trip(llvm_tools, source, tmp_path / "out.co", reassemble.Edit(1, "insert", ("s_nop 0",) * nops))
    assert result.error is None
    assert (tmp_path / "out.co").read_bytes() == linked.read_bytes()


def test_a_kernel_llvm_mc_refuses_is_reported_alone_and_its_batch_mates_written(build_code_object, llvm_tools,
                                                                                 tmp_path):
    # One llvm-mc run assembles the batch; gfx90a has no int8 K=32 MFMA, so the middle kernel's edit fails there.
    sources = [build_code_object(tmp_path / f"{name}.co", *LOOP) for name in ("first", "second", "third")]
    refused = "v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[0:3]"
    jobs = [reassemble.Job(source.name, str(source), str(tmp_path / "out" / source.name), "gfx90a",
                           edits=(reassemble.Edit(1, "insert", (refused,)),) if source.stem == "second" else ())
            for source in sources]
    results = reassemble.rebuild(llvm_tools, jobs)
    assert [result.relpath for result in results] == ["first.co", "second.co", "third.co"]
    assert results[0].error is None and results[2].error is None
    assert results[1].error is not None and "llvm-mc" in results[1].error and refused in results[1].error
    assert not (tmp_path / "out" / "second.co").exists()
    for source in (sources[0], sources[2]):
        assert (tmp_path / "out" / source.name).read_bytes() == source.read_bytes(), "batch-mates rebuilt as alone"


def test_an_edit_the_link_would_have_to_resolve_is_refused(build_code_object, llvm_tools, tmp_path):
    source = build_code_object(tmp_path / "loop.co", *LOOP)
    result = round_trip(llvm_tools, source, tmp_path / "out.co",
                        reassemble.Edit(1, "insert", ("s_mov_b32 s0, elsewhere@abs32@lo",)))
    assert result.error == "the assembler left relocations in the code"
    assert not (tmp_path / "out.co").exists()


# --- whole trees ----------------------------------------------------------------------------------------------------

def _round_trip_batch(root: str, out: str, relpaths: list[str]) -> list[tuple[str, str | None]]:
    from cdna2.kernels import find_llvm
    jobs = [reassemble.Job(r, str(Path(root, r)), str(Path(out, r)), "gfx942") for r in relpaths]
    results = []
    for result in reassemble.rebuild(find_llvm(), jobs):
        if result.error is None and Path(out, result.relpath).read_bytes() != Path(root, result.relpath).read_bytes():
            results.append((result.relpath, "rebuilt bytes differ from the original"))
        else:
            results.append((result.relpath, result.error))
        Path(out, result.relpath).unlink(missing_ok=True)
    return results


def assert_tree_round_trips(root: Path, tools, tmp_path: Path, expected_kernels: int) -> None:
    """Every kernel of `root` rebuilt with no edit is byte-identical; a passing verdict is cached per tree, code
    and LLVM (2 worker processes, largest files first)."""
    code = code_digest((reassemble, isa, elf))  # the code that reads, emits and restores
    key = hashlib.sha256(f"{tree_digest(root)}\n{code}\n{tools.banner}".encode()).hexdigest()
    verdict = cache_root() / "kernels" / "reassembly-round-trips" / f"{key}.json"
    relpaths = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.co"))
    assert len(relpaths) == expected_kernels
    if verdict.is_file():
        assert json.loads(verdict.read_text()) == {"kernels": expected_kernels, "identical": expected_kernels}
        return
    by_size = sorted(relpaths, key=lambda r: -(root / r).stat().st_size)
    batches = [by_size[i::16] for i in range(16)]
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
        outcomes = [o for batch in pool.map(_round_trip_batch, [str(root)] * 16, [str(tmp_path)] * 16, batches)
                    for o in batch]
    failures = [f"{relpath}: {error}" for relpath, error in outcomes if error]
    assert not failures, f"{len(failures)} of {len(relpaths)} kernels do not round-trip:\n" + "\n".join(failures[:20])
    write_file_atomically(verdict, json.dumps({"kernels": len(outcomes), "identical": len(outcomes)}).encode())


@pytest.mark.slow
def test_every_kernel_of_amd_aiter_0_1_7_round_trips_byte_identical(llvm_tools, tmp_path):
    root = wheelhouse.installed_tree(wheelhouse.AITER) / "aiter_meta/hsa/gfx942"
    assert_tree_round_trips(root, llvm_tools, tmp_path, expected_kernels=1281)


@pytest.mark.slow
def test_every_kernel_of_aiter_v0_1_19_round_trips_byte_identical(llvm_tools, tmp_path):
    assert_tree_round_trips(aiter_git_tree("v0.1.19"), llvm_tools, tmp_path, expected_kernels=1425)


@pytest.mark.slow
def test_every_kernel_of_aiter_v0_1_20_post1_round_trips_byte_identical(llvm_tools, tmp_path):
    # The newest tag; main's hsa/gfx942 (the mirror's snapshot of 2026-08-22) is the same tree.
    assert_tree_round_trips(aiter_git_tree("v0.1.20.post1"), llvm_tools, tmp_path, expected_kernels=1432)

"""vLLM's arch gates, proven by behaviour on every real vLLM release 0.23.0-0.33.0 (issue 12), stock and patched.

Slow part: cdna2.patches.gates patches a copy of each release's files with the engine as it is, and
lab/vllm_gates/runner.py imports vLLM from the real trees on CPU torch, with only amdsmi (the device query) and
amd-aiter doubled, on a pretend gfx90a and gfx942. The expectations are the module docstring of cdna2/patches/gates.py.
Releases the current patch sets do not serve are strict xfails naming why, so they flip when the sets cover them.
Fast part: the judge itself, on hand-made answers, must fail each broken expectation.
"""

from __future__ import annotations

import pytest

from cdna2.patches import gates

# Releases whose gates the current sets leave wrong, and why; each is a strict xfail, so it fails once the sets are
# fixed there. Empty since the coverage rework: before it, 0.27.0, 0.27.1 and 0.28.0 kept PerTensor/ChannelWise
# TorchFP8ScaledMMLinearKernel open on patched gfx90a (vllm-attention-gate took variant 0.33, which has no narrowing).
KNOWN_GAPS: dict[str, str] = {}
# Gates every release has, by these names: without them a clean verdict would prove nothing.
NAMED_GATES = ("rocm_aiter_ops.is_mha_enabled()", "AiterFlashAttentionBackend.supports_compute_capability()",
               "rocm_aiter_ops.is_linear_fp8_enabled()", "TorchFP8ScaledMMLinearKernel.is_supported()",
               "is_aiter_found_and_supported()")


@pytest.fixture(scope="session")
def evaluated() -> dict[str, gates.ReleaseGates]:
    return {release.version: release for release in gates.evaluate()}


def _cell(release: gates.ReleaseGates, gate: str, arch: str, tree: str) -> str:
    answer = release.answer(gate, arch, tree)
    assert answer is not None, f"vLLM {release.version}: no answer for {gate} on {arch} {tree}"
    assert not answer["error"], f"vLLM {release.version}: {gate} on {arch} {tree}: {answer['error']}"
    return "open" if answer["open"] else "closed"


@pytest.mark.slow
@pytest.mark.parametrize("version", [
    pytest.param(version, marks=pytest.mark.xfail(reason=KNOWN_GAPS[version], strict=True))
    if version in KNOWN_GAPS else version for version in gates.RELEASES])
def test_gates_behave_as_expected(evaluated, version):
    release = evaluated[version]
    assert release.patched, f"vLLM {version}: {release.patch_status}"
    present = set(release.gate_names())
    assert set(NAMED_GATES) <= present, f"vLLM {version}: gates not evaluated: {set(NAMED_GATES) - present}"
    # The pretend device reaches vLLM's own decision: the same gate answers differently on the two arches.
    assert _cell(release, "rocm_aiter_ops.is_mha_enabled()", "gfx942", "stock") == "open"
    assert _cell(release, "rocm_aiter_ops.is_mha_enabled()", "gfx90a", "stock") == "closed"
    for gate in present:
        kind = gates.category(gate)
        if not gates.reachable_on_rocm(release, gate):  # e.g. BlockWiseTorchFP8ScaledMMLinearKernel from 0.28.0 on
            assert gates.kind_label(release, gate).endswith("(no ROCm path)")
            continue
        if kind == gates.ATTENTION:
            assert _cell(release, gate, "gfx90a", "patched") == "open", f"vLLM {version}: {gate}"
        if kind == gates.FP8_FP4:
            assert _cell(release, gate, "gfx90a", "patched") == "closed", f"vLLM {version}: {gate} admits gfx90a"
    assert release.failures == [], "\n".join(release.failures)


@pytest.mark.slow
def test_table_names_every_release_with_a_verdict(evaluated):
    table = gates.render(list(evaluated.values()))
    print(table)  # shown with pytest -s: the measured table
    for version in gates.RELEASES:
        assert f"\nvLLM {version}: " in table
        assert f"| {version} | rocm_aiter_ops.is_mha_enabled() | attention |" in table


# ------------------------------------------------------------------------------------------- the judge alone

def _answers(values: dict[tuple[str, str], dict[str, bool]]) -> dict:
    """Runner-shaped answers: (tree, arch) -> gate -> open."""
    answers: dict = {}
    for (tree, arch), per_gate in values.items():
        answers.setdefault(tree, {})[arch] = {"ok": True, "result": {
            "detected": {"gcn_arch": arch}, "gates": {gate: {"open": is_open, "value": repr(is_open), "error": None}
                                                      for gate, is_open in per_gate.items()}}}
    return answers


MHA, FP8, LINEAR, MOE = ("rocm_aiter_ops.is_mha_enabled()", "TorchFP8ScaledMMLinearKernel.is_supported()",
                         "rocm_aiter_ops.is_linear_enabled()", "rocm_aiter_ops.is_fused_moe_enabled()")
GOOD = {("stock", "gfx90a"): {MHA: False, FP8: True, LINEAR: False, MOE: False},
        ("patched", "gfx90a"): {MHA: True, FP8: False, LINEAR: False, MOE: False},
        ("stock", "gfx942"): {MHA: True, FP8: True, LINEAR: True, MOE: True},
        ("patched", "gfx942"): {MHA: True, FP8: True, LINEAR: True, MOE: True}}


def _judged(values, applied=("vllm-attention-gate",)) -> list[str]:
    release = gates.ReleaseGates("9.9.9", "apply", applied_sets=list(applied), answers=_answers(values))
    return gates.judge(release)


def _broken(tree: str, arch: str, gate: str, is_open: bool) -> dict:
    values = {key: dict(per_gate) for key, per_gate in GOOD.items()}
    values[(tree, arch)][gate] = is_open
    return values


def test_judge_accepts_the_expected_answers():
    assert _judged(GOOD) == []


@pytest.mark.parametrize("tree, arch, gate, is_open, expected", [
    ("patched", "gfx90a", FP8, True, "(FP8/FP4) is open on patched gfx90a; expected closed"),
    ("patched", "gfx90a", MHA, False, "(attention) is closed on patched gfx90a; expected open"),
    ("stock", "gfx90a", MHA, True, "(attention) is open on stock gfx90a; expected closed"),
    ("patched", "gfx90a", MOE, True, "(other) is open on patched gfx90a; expected closed (as stock)"),
    ("patched", "gfx942", FP8, False, "(FP8/FP4) changed on gfx942: open stock, closed patched"),
])
def test_judge_names_each_broken_expectation(tree, arch, gate, is_open, expected):
    failures = _judged(_broken(tree, arch, gate, is_open))
    assert failures == [f"{gate} {expected}"]


def test_int8_gemm_gate_opens_only_with_the_ck_set():
    opened = _broken("patched", "gfx90a", LINEAR, True)
    assert _judged(opened, applied=("vllm-attention-gate", "vllm-ck-int8-gemm")) == []
    assert _judged(opened) == [f"{LINEAR} (int8 GEMM) is open on patched gfx90a; expected closed (as stock)"]
    assert _judged(GOOD, applied=("vllm-attention-gate", "vllm-ck-int8-gemm")) == \
        [f"{LINEAR} (int8 GEMM) is closed on patched gfx90a; expected open"]


def test_a_gate_error_on_gfx90a_is_a_failure_but_the_same_error_on_gfx942_is_not():
    release = gates.ReleaseGates("9.9.9", "apply", answers=_answers(GOOD))
    for tree in ("stock", "patched"):
        release.answers[tree]["gfx942"]["result"]["gates"][FP8] = {"open": None, "value": None,
                                                                   "error": "ImportError: aiter double"}
    assert gates.judge(release) == []
    release.answers["patched"]["gfx90a"]["result"]["gates"][FP8]["error"] = "RuntimeError: x is unavailable here"
    release.answers["patched"]["gfx90a"]["result"]["gates"][FP8]["open"] = None
    assert f"{FP8} on gfx90a patched: RuntimeError: x is unavailable here" in gates.judge(release)


def test_a_linear_kernel_no_rocm_list_names_is_shown_but_not_judged():
    values = _broken("patched", "gfx90a", FP8, True)
    release = gates.ReleaseGates("9.9.9", "apply", answers=_answers(values))
    for per_arch in release.answers.values():
        for outcome in per_arch.values():
            outcome["result"]["gates"][FP8]["on_rocm"] = False
    assert gates.judge(release) == []
    assert gates.kind_label(release, FP8) == "FP8/FP4 (no ROCm path)"
    assert f"| 9.9.9 | {FP8} | FP8/FP4 (no ROCm path) | open | open | open | open |" in gates.render([release])


def test_categories():
    assert gates.category("rocm_aiter_ops.is_fp8bmm_enabled()") == gates.FP8_FP4
    assert gates.category("AiterFp8BlockScaledMMKernel.is_supported()") == gates.FP8_FP4
    assert gates.category("is_aiter_found_and_supported()") == gates.FP8_FP4
    assert gates.category("rocm_aiter_ops.is_shuffle_kv_cache_enabled()") == gates.ATTENTION
    assert gates.category("AiterInt8ScaledMMLinearKernel.is_supported()") == gates.INT8
    assert gates.category("rocm_aiter_ops.is_mla_enabled()") == gates.OTHER

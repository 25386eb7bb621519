"""vLLM's arch gates, proven by behaviour on every real vLLM release from 0.23.0 to the newest on the index.

Slow part: releases.gates patches a copy of each release's files with the engine as it is, and
releases/vllm_gates/runner.py imports vLLM from the real trees on CPU torch, with only amdsmi (the device query) and
amd-aiter doubled, on a pretend gfx90a and gfx942. The expectations are the module docstring of releases/gates.py.
Releases the current patch sets do not serve are strict xfails naming why, so they flip when the sets cover them.
Fast part: the judge itself, on hand-made answers, must fail each broken expectation.
"""

from __future__ import annotations

import pytest

from releases import gates

# Releases whose gates the current sets leave wrong, and why; each is a strict xfail, so it fails once the sets are
# fixed there. Empty since the coverage rework: before it, 0.27.0, 0.27.1 and 0.28.0 kept PerTensor/ChannelWise
# TorchFP8ScaledMMLinearKernel open on patched gfx90a (vllm-attention-gate took variant 0.33, which has no narrowing).
KNOWN_GAPS: dict[str, str] = {}
# Gates every release has, by these names: without them a clean verdict would prove nothing.
NAMED_GATES = ("rocm_aiter_ops.is_mha_enabled()", "AiterFlashAttentionBackend.supports_compute_capability()",
               "rocm_aiter_ops.is_linear_fp8_enabled()", "TorchFP8ScaledMMLinearKernel.is_supported()",
               "is_aiter_found_and_supported()")


RELEASES = gates.releases()  # discovered (releases/discovery.py); the index's answer is kept for a day


@pytest.fixture(scope="session")
def evaluated() -> dict[str, gates.ReleaseGates]:
    return {release.version: release for release in gates.evaluate(RELEASES)}


def _cell(release: gates.ReleaseGates, gate: str, arch: str, tree: str) -> str:
    answer = release.answer(gate, arch, tree)
    assert answer is not None, f"vLLM {release.version}: no answer for {gate} on {arch} {tree}"
    assert not answer["error"], f"vLLM {release.version}: {gate} on {arch} {tree}: {answer['error']}"
    return "open" if answer["open"] else "closed"


@pytest.mark.slow
@pytest.mark.parametrize("version", [
    pytest.param(version, marks=pytest.mark.xfail(reason=KNOWN_GAPS[version], strict=True))
    if version in KNOWN_GAPS else version for version in RELEASES])
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
    for version in RELEASES:
        assert f"\nvLLM {version}: " in table
        assert f"| {version} | rocm_aiter_ops.is_mha_enabled() | attention |" in table
        # vllm-aiter-triton-ops, each op's gate: closed on stock gfx90a, open once patched, open on gfx942 either way
        for gate in gates.TRITON_GATES:
            assert f"| {version} | {gate} | AITER Triton op | closed | open | open | open |" in table


@pytest.mark.slow
def test_a_kept_evaluation_is_keyed_by_every_input_that_decides_it(evaluated, tmp_path, monkeypatch):
    """The evaluation above is kept per release (a warm run reuses it): another catalog, another wheel's RECORD, a
    changed runner file or a changed engine module each name another entry, so any of them is evaluated anew."""
    import dataclasses
    import shutil

    from cdna2.patches.catalog import load_catalog
    from lab import torchvenv, wheelhouse

    catalog, python, version = load_catalog(), torchvenv.torch_cpu_python(), RELEASES[-1]

    def path_of(catalog):
        return gates._evaluation_path(gates._evaluation_inputs(catalog, python), version)

    kept = path_of(catalog)
    assert kept is not None and kept.is_file() and kept == path_of(catalog)
    assert gates._kept_evaluation(kept).answers == evaluated[version].answers
    assert path_of(dataclasses.replace(catalog, digest="another")) != kept
    assert path_of(dataclasses.replace(catalog, digest="")) is None  # built in code
    tree = wheelhouse.installed_tree(f"vllm=={version}")
    copy = tmp_path / "tree" / tree.name
    for record in tree.glob("*.dist-info/RECORD"):
        (copy / record.parent.name).mkdir(parents=True)
        (copy / record.parent.name / "RECORD").write_bytes(record.read_bytes() + b"vllm/new.py,sha256=x,1\n")
    with monkeypatch.context() as patched:
        patched.setattr(wheelhouse, "installed_tree", lambda requirement: copy)
        assert path_of(catalog) not in (None, kept)
    runner = tmp_path / "vllm_gates" / "runner.py"
    shutil.copytree(gates.RUNNER.parent, runner.parent, ignore=shutil.ignore_patterns("__pycache__"))
    assert path_of(catalog) == kept
    with monkeypatch.context() as patched:
        patched.setattr(gates, "RUNNER", runner)
        assert path_of(catalog) == kept  # the same bytes
        (runner.parent / "models" / "llama-full-attention.json").write_text("{}")
        assert path_of(catalog) != kept
    from cdna2.patches import cli, planner
    digested = []
    with monkeypatch.context() as patched:
        patched.setattr(gates, "code_digest", lambda modules: digested.extend(modules) or "another engine")
        assert path_of(catalog) != kept
    assert {gates, planner, cli, wheelhouse} <= set(digested)


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


@pytest.mark.parametrize("gate", gates.TRITON_GATES)
def test_triton_op_gates_open_only_with_the_triton_set(gate):
    values = {key: {**per_gate, gate: key[1] == "gfx942" or key == ("patched", "gfx90a")}
              for key, per_gate in GOOD.items()}
    assert _judged(values, applied=("vllm-attention-gate", gates.TRITON_OPS_SET)) == []
    assert _judged(values) == [f"{gate} (AITER Triton op) is open on patched gfx90a; expected closed (as stock)"]


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
    assert {gates.category(gate) for gate in gates.TRITON_GATES} == {gates.TRITON}
    assert gates.category("rocm_aiter_ops.is_triton_unified_attn_enabled()") == gates.OTHER  # no consumer in vLLM


# ------------------------------------------------------------------- backend selection: the sliding-window guard

FULL_MODEL, SLIDING_MODELS = "llama-full-attention", ("gemma3-interleaved-sliding", "mistral-all-sliding",
                                                      "hybrid-sliding-full")


def _choices(release: gates.ReleaseGates, model: str, arch: str, tree: str, order: str) -> dict[str, dict]:
    selected = release.selection(arch, tree).get(model)
    assert selected is not None, f"vLLM {release.version}: no selection for {model} on {arch} {tree}"
    return selected["choices"][order]


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_patched_gfx90a_never_selects_aiter_fa_for_a_model_with_a_sliding_window(evaluated, version):
    """vLLM's own selector, per layer kind, on the four model configs: the guard declines ROCM_AITER_FA for every layer
    of the three sliding-window models on patched gfx90a (the next backend takes them; an explicit choice fails at
    start-up), keeps it for the full-attention one, and changes nothing on gfx942."""
    release = evaluated[version]
    assert set(release.models()) == {FULL_MODEL, *SLIDING_MODELS}
    assert release.selection("gfx90a", "patched")[FULL_MODEL]["layers"] == {"full": 32}
    assert release.selection("gfx90a", "patched")["hybrid-sliding-full"]["layers"] == {"full": 12, "sliding": 36}
    full = _choices(release, FULL_MODEL, "gfx90a", "patched", gates.PREFER)
    assert {kind: choice.get("backend") for kind, choice in full.items()} == {"full": gates.AITER_FA}
    assert _choices(release, FULL_MODEL, "gfx90a", "patched", gates.EXPLICIT)["full"] == {"backend": gates.AITER_FA}
    for model in SLIDING_MODELS:
        for kind, choice in _choices(release, model, "gfx90a", "patched", gates.PREFER).items():
            assert choice.get("backend") not in (None, gates.AITER_FA), f"vLLM {version}: {model} {kind}: {choice}"
        for kind, choice in _choices(release, model, "gfx90a", "patched", gates.EXPLICIT).items():
            assert gates.GUARD_REASON in choice.get("refused", ""), f"vLLM {version}: {model} {kind}: {choice}"
            assert "serve this model with ROCM_ATTN or TRITON_ATTN" in choice["refused"]
        [warning, *_] = release.selection("gfx90a", "patched")[model]["warnings"]
        assert warning.startswith("gfx90a: ROCM_AITER_FA declined: sliding-window attention (")
    for tree in ("stock", "patched"):
        assert not any(selected["warnings"] for selected in release.selection("gfx942", tree).values())
    # vllm-aiter-triton-ops: an explicit ROCM_AITER_UNIFIED_ATTN serves the full-attention model on patched gfx90a and is
    # refused for every layer of the sliding-window ones by its own guard
    assert gates.TRITON_OPS_SET in release.applied_sets
    assert _choices(release, FULL_MODEL, "gfx90a", "patched", gates.EXPLICIT_UNIFIED)["full"] == \
        {"backend": gates.AITER_UNIFIED}
    for model in SLIDING_MODELS:
        for kind, choice in _choices(release, model, "gfx90a", "patched", gates.EXPLICIT_UNIFIED).items():
            assert gates.UNIFIED_GUARD_REASON in choice.get("refused", ""), f"vLLM {version}: {model} {kind}: {choice}"
            assert gates.NO_RECORD in choice["refused"]
        # its exception: the record of this node's passed sliding-window smoke check beside the guard admits them;
        # a failed check, another AITER file, another node or a record that does not parse is refused, saying so
        passed = _choices(release, model, "gfx90a", "patched", gates.SMOKE_PASSED)
        assert passed and all(choice == {"backend": gates.AITER_UNIFIED} for choice in passed.values()), \
            f"vLLM {version}: {model}: {passed}"
        for order, named in gates.WINDOW_REFUSALS.items():
            for kind, choice in _choices(release, model, "gfx90a", "patched", order).items():
                assert named in choice.get("refused", ""), f"vLLM {version}: {model} {order} {kind}: {choice}"
    for model in (FULL_MODEL, *SLIDING_MODELS):
        for order in (gates.STOCK_ORDER, gates.EXPLICIT, gates.EXPLICIT_UNIFIED):
            assert _choices(release, model, "gfx942", "stock", order) == \
                _choices(release, model, "gfx942", "patched", order), f"vLLM {version}: {model} {order} on gfx942"
        assert _choices(release, model, "gfx942", "stock", gates.EXPLICIT) == \
            {kind: {"backend": gates.AITER_FA} for kind in release.selection("gfx942", "stock")[model]["layers"]}
    assert gates.judge_selection(release) == []
    assert f"vLLM {version}: ok" in gates.render([release])
    assert f"sliding-window models on patched gfx90a are served by {gates.sliding_window_fallback(release)}" in \
        gates.render([release])


@pytest.mark.slow
def test_without_the_guard_site_the_table_fails_every_sliding_model(tmp_path):
    """The same evaluation with vllm-attention-gate's sliding-window-guard site removed from the data: patched
    gfx90a then picks ROCM_AITER_FA for the sliding models and the verdict is FAIL, naming each of them."""
    import shutil

    import yaml

    from cdna2.patches.catalog import DEFAULT_PATCHSET_DIR, load_catalog

    shutil.copytree(DEFAULT_PATCHSET_DIR, tmp_path / "patchsets")
    path = tmp_path / "patchsets" / "vllm-attention-gate.yaml"
    data = yaml.safe_load(path.read_text())
    for variant in data["variants"]:
        variant["sites"] = [site for site in variant["sites"] if site["id"] != "sliding-window-guard"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # vllm-aiter-triton-ops' guard of ROCM_AITER_UNIFIED_ATTN calls the helper the removed site defines: it goes too
    ops = tmp_path / "patchsets" / "vllm-aiter-triton-ops.yaml"
    data = yaml.safe_load(ops.read_text())
    for variant in data["variants"]:
        variant["sites"] = [site for site in variant["sites"]
                            if site["id"] != "unified-attention-sliding-window-guard"]
    ops.write_text(yaml.safe_dump(data, sort_keys=False))
    [release] = gates.evaluate(("0.33.0",), catalog=load_catalog(tmp_path / "patchsets"), workers=1)
    assert release.verdict == "FAIL"
    for model in SLIDING_MODELS:
        assert any(failure.startswith(f"{model} (sliding-window layers) on patched gfx90a (prefer)")
                   and failure.endswith(f"{gates.AITER_FA}; expected a backend other than {gates.AITER_FA} and "
                                        f"{gates.AITER_UNIFIED}")
                   for failure in release.failures), release.failures
        assert any(failure.startswith(f"{model} (sliding-window layers) on patched gfx90a (explicit ROCM_AITER_FA)")
                   for failure in release.failures), release.failures
    # The full-attention model's only failures: the orders that put a smoke record beside the removed guard have no
    # answer (they exist to exercise that guard); every order it is served under otherwise is as expected.
    full = [failure for failure in release.failures if failure.startswith(FULL_MODEL)]
    assert full and all(failure.startswith(f"{FULL_MODEL} on patched gfx90a: no choice with explicit "
                                           f"{gates.AITER_UNIFIED}, ") for failure in full), full


@pytest.mark.slow
def test_without_variant_0_34_muse_glimmer_pins_aiter_fa_on_patched_gfx90a_and_the_table_fails(evaluated, tmp_path):
    """vLLM 0.34.0 with vllm-attention-gate's variant 0.34 removed from the data: variant 0.33 patches it (its sites
    are all there), is_mha_enabled() opens on gfx90a, and MuseGlimmerAttentionConfig pins ROCM_AITER_FA for a model
    with sliding-window layers there; the judge names that gate. With the variant (the packaged data) it stays closed.
    """
    import shutil

    import yaml

    from cdna2.patches.catalog import DEFAULT_PATCHSET_DIR, load_catalog

    shutil.copytree(DEFAULT_PATCHSET_DIR, tmp_path / "patchsets")
    path = tmp_path / "patchsets" / "vllm-attention-gate.yaml"
    data = yaml.safe_load(path.read_text())
    data["variants"] = [variant for variant in data["variants"] if variant["id"] != "0.34"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    gate = "MuseGlimmerAttentionConfig pins ROCM_AITER_FA"
    [release] = gates.evaluate(("0.34.0",), catalog=load_catalog(tmp_path / "patchsets"), workers=1)
    assert release.variants["vllm-attention-gate"] == "0.33"
    assert release.verdict == "FAIL"
    assert f"{gate} (other) is open on patched gfx90a; expected closed (as stock)" in release.failures
    packaged = evaluated["0.34.0"]
    assert packaged.variants["vllm-attention-gate"] == "0.34" and packaged.failures == []
    assert _cell(packaged, gate, "gfx90a", "patched") == "closed"
    assert _cell(packaged, gate, "gfx942", "stock") == _cell(packaged, gate, "gfx942", "patched") == "open"


def _selected(backend_by_column: dict[tuple[str, str], dict[str, dict[str, dict]]]) -> dict:
    """Runner-shaped answers with a selection: (tree, arch) -> model -> order -> kind -> choice."""
    answers = _answers(GOOD)
    for (tree, arch), models in backend_by_column.items():
        answers[tree][arch]["result"]["selection"] = {"models": {
            model: {"layers": {kind: 1 for kind in next(iter(orders.values()))}, "choices": orders,
                    "warnings": [f"gfx90a: ROCM_AITER_FA declined: ... {gates.GUARD_REASON} ..."]
                    if (tree, arch) == ("patched", "gfx90a") and model != FULL_MODEL else []}
            for model, orders in models.items()}, "unset_configs": []}
    return answers


AITER, ROCM_ATTN = {"backend": "ROCM_AITER_FA"}, {"backend": "ROCM_ATTN"}
GUARDED = {"refused": f"Selected backend is not valid. Reason: ['sliding-window attention {gates.GUARD_REASON}']"}
CAPABILITY = {"refused": "Selected backend is not valid. Reason: ['compute capability not supported']"}


def _good_selection() -> dict:
    def column(full_explicit, sliding_prefer, sliding_explicit, full_prefer=AITER):
        return {FULL_MODEL: {gates.PREFER: {"full": full_prefer}, gates.STOCK_ORDER: {"full": ROCM_ATTN},
                             gates.EXPLICIT: {"full": full_explicit}},
                "hybrid": {gates.PREFER: {"full": sliding_prefer, "sliding": sliding_prefer},
                           gates.STOCK_ORDER: {"full": ROCM_ATTN, "sliding": ROCM_ATTN},
                           gates.EXPLICIT: {"full": sliding_explicit, "sliding": sliding_explicit}}}
    return {("stock", "gfx90a"): column(CAPABILITY, ROCM_ATTN, CAPABILITY, full_prefer=ROCM_ATTN),
            ("patched", "gfx90a"): column(AITER, ROCM_ATTN, GUARDED),
            ("stock", "gfx942"): column(AITER, ROCM_ATTN, AITER, full_prefer=ROCM_ATTN),
            ("patched", "gfx942"): column(AITER, AITER, AITER)}


def _judged_selection(selection: dict) -> list[str]:
    return gates.judge_selection(gates.ReleaseGates("9.9.9", "apply", answers=_selected(selection)))


def test_selection_judge_accepts_the_expected_choices():
    selection = _good_selection()
    assert _judged_selection(selection) == []
    release = gates.ReleaseGates("9.9.9", "apply", answers=_selected(selection))
    assert gates.sliding_window_fallback(release) == "ROCM_ATTN"
    table = gates.render([release])
    assert "| 9.9.9 | hybrid | 1 full + 1 sliding | explicit ROCM_AITER_FA | refused | refused | " \
           "ROCM_AITER_FA | ROCM_AITER_FA |" in table
    assert "  sliding-window models on patched gfx90a are served by ROCM_ATTN" in table


@pytest.mark.parametrize("column, model, order, kind, choice, expected", [
    (("patched", "gfx90a"), "hybrid", gates.PREFER, "full", AITER,
     "hybrid (sliding-window layers) on patched gfx90a (prefer), full layers: ROCM_AITER_FA; expected a backend "
     "other than ROCM_AITER_FA and ROCM_AITER_UNIFIED_ATTN"),
    (("patched", "gfx90a"), "hybrid", gates.EXPLICIT, "sliding", AITER,
     "hybrid (sliding-window layers) on patched gfx90a (explicit ROCM_AITER_FA), sliding layers: ROCM_AITER_FA; "
     "expected the start-up refusal of the sliding-window guard"),
    (("patched", "gfx90a"), FULL_MODEL, gates.PREFER, "full", ROCM_ATTN,
     f"{FULL_MODEL} (full attention) on patched gfx90a (prefer), full layers: ROCM_ATTN; expected ROCM_AITER_FA"),
    (("stock", "gfx90a"), FULL_MODEL, gates.PREFER, "full", AITER,
     f"{FULL_MODEL} on stock gfx90a (prefer), full layers: ROCM_AITER_FA chosen; AITER is closed there"),
    (("patched", "gfx942"), "hybrid", gates.EXPLICIT, "sliding", GUARDED,
     "hybrid on gfx942 (explicit ROCM_AITER_FA) changed: ROCM_AITER_FA stock, full ROCM_AITER_FA, sliding refused "
     "patched"),
    (("patched", "gfx90a"), FULL_MODEL, gates.STOCK_ORDER, "full", {"error": "RuntimeError: x is unavailable here"},
     f"{FULL_MODEL} on gfx90a patched (stock order), full layers: RuntimeError: x is unavailable here"),
])
def test_selection_judge_names_each_broken_expectation(column, model, order, kind, choice, expected):
    selection = _good_selection()
    selection[column][model][order][kind] = choice
    assert _judged_selection(selection) == [expected]


UNIFIED = {"backend": gates.AITER_UNIFIED}


def _unified_guarded(named: str) -> dict:
    return {"refused": f"Selected backend is not valid. Reason: ['{gates.UNIFIED_GUARD_REASON} unless ... ({named} "
                       f"...); as ROCM_AITER_FA is: ...']"}


def _unified_judged(full: dict, sliding: dict | None = None, gfx942_after: dict = UNIFIED,
                    proven: dict = UNIFIED) -> list[str]:
    """The selection judge with the triton-ops set applied and explicit ROCM_AITER_UNIFIED_ATTN choices added: without
    a record (``sliding``: default its refusal), and with each record the runner puts beside the guard in a patched
    tree (``proven``: the passed one's choice for the sliding model; the others, their refusals)."""
    selection = _good_selection()
    refusals = {gates.EXPLICIT_UNIFIED: gates.NO_RECORD, **gates.WINDOW_REFUSALS}
    for (tree, arch), models in selection.items():
        orders = [gates.EXPLICIT_UNIFIED, *gates.WINDOW_REFUSALS, gates.SMOKE_PASSED] \
            if (tree, arch) == ("patched", "gfx90a") else [gates.EXPLICIT_UNIFIED]
        for order in orders:
            if (tree, arch) == ("patched", "gfx90a"):
                chosen = proven if order == gates.SMOKE_PASSED else _unified_guarded(refusals[order])
                if order == gates.EXPLICIT_UNIFIED and sliding is not None:
                    chosen = sliding
                models[FULL_MODEL][order] = {"full": full}
            else:
                chosen = gfx942_after if (tree, arch) == ("patched", "gfx942") else UNIFIED
                models[FULL_MODEL][order] = {"full": UNIFIED}
            models["hybrid"][order] = {"full": chosen, "sliding": chosen}
    release = gates.ReleaseGates("9.9.9", "apply", applied_sets=["vllm-attention-gate", gates.TRITON_OPS_SET],
                                 answers=_selected(selection))
    return gates.judge_selection(release)


def test_selection_judge_wants_the_unified_attention_guard_where_the_triton_set_is_applied():
    assert _unified_judged(UNIFIED) == []
    assert _unified_judged(UNIFIED, sliding=UNIFIED) == [
        f"hybrid (sliding-window layers) on patched gfx90a ({gates.EXPLICIT_UNIFIED}), {kind} layers: "
        f"{gates.AITER_UNIFIED}; expected the start-up refusal of its sliding-window guard, naming 'no record'"
        for kind in ("full", "sliding")]
    # A refusal that does not say why (no record) is not the guard's.
    assert len(_unified_judged(UNIFIED, sliding=_unified_guarded("something else"))) == 2
    assert _unified_judged(ROCM_ATTN) == [
        f"{FULL_MODEL} on patched gfx90a ({order}), full layers: ROCM_ATTN; expected {gates.AITER_UNIFIED}"
        for order in (gates.EXPLICIT_UNIFIED, *gates.WINDOW_REFUSALS, gates.SMOKE_PASSED)]
    assert _unified_judged(UNIFIED, gfx942_after=_unified_guarded(gates.NO_RECORD)) == [
        f"hybrid on gfx942 ({gates.EXPLICIT_UNIFIED}) changed: {gates.AITER_UNIFIED} stock, refused patched"]


def test_selection_judge_wants_the_host_smoke_record_to_admit_sliding_window_models():
    assert _unified_judged(UNIFIED, proven=_unified_guarded(gates.NO_RECORD)) == [
        f"hybrid on patched gfx90a ({gates.SMOKE_PASSED}), {kind} layers: refused; expected {gates.AITER_UNIFIED}"
        for kind in ("full", "sliding")]


def test_selection_judge_wants_the_guard_logged():
    release = gates.ReleaseGates("9.9.9", "apply", answers=_selected(_good_selection()))
    release.answers["patched"]["gfx90a"]["result"]["selection"]["models"]["hybrid"]["warnings"] = []
    assert gates.judge_selection(release) == [
        "hybrid (sliding-window layers) on patched gfx90a: vLLM logged no warning naming the guard's reason ([])"]

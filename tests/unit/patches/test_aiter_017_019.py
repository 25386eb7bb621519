"""AITER 0.1.17 / 0.1.19 sets on the exact anchor lines those tags hold (no real tree exists here).

The fixture files hold those lines, verbatim, between filler, plus the look-alike lines the notes warn about
(the two is_fmha_v3_fp8 `ret` lines, the INT8 branch of gemm_a8w8 with the same TORCH_CHECK line).
"""

from __future__ import annotations

import pytest

from cdna2.patches import plan_package, record_hash

RET = '        ret = get_gfx() in ("gfx942", "gfx950")\n'
FIXTURE = {
    "aiter/ops/mha.py": (
        "def _flash_attn_forward(q):\n"
        "    def is_fmha_v3_fp8():\n" + RET + "        return ret\n\n"
        "    def can_impl_fmha_v3_fwd():\n"
        "        # fmha v3 is hand-written gfx9 ASM; non-gfx9 must fall back to ck-tile.\n" + RET + "\n\n"
        "def _flash_attn_varlen_forward(q):\n"
        "    def is_fmha_v3_fp8():\n" + RET + "        return ret\n\n"
        "    def can_impl_fmha_v3_fwd():\n"
        "        # fmha v3 varlen is hand-written gfx9 ASM; non-gfx9 must fall back to\n"
        "        # ck-tile (mha_varlen_fwd, the else branch below).\n" + RET),
    "aiter_meta/csrc/cpp_itfs/mha_fwd.cu": (
        '            if(arch_id == "gfx950")\n'
        '            else if(arch_id == "gfx942" && cfg.bf16_cvt == bf16_cvt)\n'
        '    if(arch_id == "gfx942")\n    {\n        auto pos = cfg_co_name.rfind(\'/\');\n    }\n'
        '    {\n    {\n'
        '    if(a.hdim_q == 192 && a.hdim_v == 128 && arch_id == "gfx942")\n'
        '    if(arch_id == "gfx942" && a.is_group_mode && a.hdim_q == 192 && a.hdim_v == 128)\n'
        '    if(arch_id == "gfx942" && a.hdim_q == 192 && a.hdim_v == 128)\n'
        '    if(!hdim_ok ||\n       ((arch_id != "gfx942") && (arch_id != "gfx950")))\n'),
    "aiter/ops/gemm_op_a4w4.py": ('def gemm_a4w4(gfx_arch):\n    if gfx_arch in ["gfx942"]:\n'
                                  '        raise RuntimeError("A4W4 GEMM kernel is not supported on gfx942")\n'),
    "aiter/ops/quant.py": ('def quant_mxfp4_hip(x):\n    if (\n        x.dtype == dtypes.bf16\n'
                           '        and get_gfx() != "gfx942"\n    ):\n        pass\n'),
    "aiter/jit/core.py": ('def build_module():\n    if True:\n'
                          '        if get_gfx() != "gfx942" and int(os.getenv("AITER_FP4x2", "1")) > 0:\n'
                          '            flags_hip += ["-D__Float4_e2m1fn_x2"]\n'),
    "aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py": (
        "from gemm_a8w8_common import (  # noqa: E402\n    default_kernels_dict,\n    kernelInstance,\n    kernels_list,\n)\n"
        "\n\nclass gemm_a8w8_fwd_codegen:\n    def gen_instance(self):\n        if True:\n"
        '            for EDtype in ["B16", "F16"]:\n                for ABDtype in ["I8", "F8"]:\n                    pass\n\n'
        '    def gen_manifest_head(self):\n'
        '        MAINFEST_head = """\n#include <torch/extension.h>\n"""\n        MAINFEST_template = """\n"""\n'),
    "aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu": (
        "  if(XQ.dtype() == at::ScalarType::Char)\n  {\n"
        "    if (x_scale.dtype() == at::ScalarType::Float && Y.dtype() == at::ScalarType::Half)\n    {\n    }\n"
        '    else\n    {\n      TORCH_CHECK(false, "Unsupported scales/output dtype!");\n    }\n  }\n'
        "  else\n  {\n"
        "    if (x_scale.dtype() == at::ScalarType::Float && Y.dtype() == at::ScalarType::Half)\n    {\n    }\n"
        '    else\n    {\n      TORCH_CHECK(false, "Unsupported scales/output dtype!");\n    }\n  }\n  return Y;\n}\n'),
}


def plan(catalog, files, version="0.1.19"):
    record = {path: record_hash(data) for path, data in files.items() if data is not None}
    everything = {path: files.get(path) for path in catalog.target_files("amd-aiter")}
    return plan_package(catalog, "amd-aiter", version, everything, record, [])


@pytest.fixture
def fixture_files():
    return {path: text.encode() for path, text in FIXTURE.items()}


@pytest.mark.parametrize("version", ["0.1.17", "0.1.19"])
def test_sixteen_sites_apply_and_leave_fp8_lookalikes_alone(catalog, fixture_files, version):
    result = plan(catalog, fixture_files, version)
    assert result.status == "apply", result.reasons
    assert result.variants == {"aiter-asm-paths": "0.1.16-0.1.20"}
    assert len(result.sites) == 15  # the batched and varlen can_impl_fmha_v3_fwd gates are one site, count 2
    new = {change.path: change.new_bytes.decode() for change in result.changes}
    mha = new["aiter/ops/mha.py"]
    assert mha.count(RET) == 2, "the two is_fmha_v3_fp8 lines must not be widened"
    assert mha.count('ret = get_gfx() in ("gfx942", "gfx950", "gfx90a")') == 2
    gemm = new["aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu"]
    int8_branch = FIXTURE["aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu"].split("  else\n  {\n")[0]
    assert gemm.startswith(int8_branch + "  else\n  {\n#ifdef AITER_A8W8_NO_FP8"), "only the FP8 branch is wrapped"
    assert gemm.count("#ifdef") == gemm.count("#endif") == 1
    compile(new["aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py"], "gen_instances.py", "exec")
    assert "aiter/jit/module_gemm_a8w8.so" in result.jit_invalidations
    assert "aiter/jit/module_fmha_v3_fwd*.so" in result.jit_invalidations
    again = plan(catalog, {path: new.get(path, FIXTURE[path]).encode() for path in FIXTURE}, version)
    assert again.status == "refused", "patched files no longer match the RECORD hashes of the fixture"
    record = {path: record_hash(text.encode()) for path, text in FIXTURE.items()}
    files = {path: (new[path].encode() if path in new else None) for path in catalog.target_files("amd-aiter")}
    files.update({path: FIXTURE[path].encode() for path in FIXTURE if path not in new})
    assert plan_package(catalog, "amd-aiter", version, files, record, []).status == "patched"


# One edit per section-12 site, each inside that site's anchor only (the file, the exact text, the drifted text):
# each changes code, so each refuses.
DRIFT = [
    ("aiter/ops/mha.py", 'def can_impl_fmha_v3_fwd():\n        # fmha v3 is',
     'def can_impl_fmha_v3(q):\n        # fmha v3 is'),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", "cfg.bf16_cvt == bf16_cvt", "cfg.bf16_cvt == cvt"),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", "auto pos = cfg_co_name.rfind('/');", "auto pos = cfg_co_name.find('/');"),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", '128 && arch_id == "gfx942")', '128 && arch_id != "gfx942")'),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", '(arch_id != "gfx950")))', '(arch_id != "gfx950")) || x)'),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", "a.is_group_mode && a.hdim_q", "a.is_group_mode && (a.hdim_q"),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", '    if(arch_id == "gfx942" && a.hdim_q', '    if(arch_id == "gfx950" && a.hdim_q'),
    ("aiter/ops/gemm_op_a4w4.py", 'in ["gfx942"]:', 'in ("gfx942",):'),
    ("aiter/ops/quant.py", 'and get_gfx() != "gfx942"', 'and get_gfx() not in ["gfx942"]'),
    ("aiter/jit/core.py", '"AITER_FP4x2", "1"', '"AITER_FP4X2", "1"'),
    ("aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py", "    kernels_list,\n)", "    kernels_list,\n    extra,\n)"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py", 'for ABDtype in ["I8", "F8"]:', 'for ABDtype in ["F8", "I8"]:'),
    ("aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py", '"""\n        MAINFEST_template', '"""\n        MANIFEST_template'),
    ("aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu", "  else\n  {\n    if (x_scale", "  else\n  {\n    if (!x_scale"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu", "    }\n  }\n  return Y;", "    }\n  }\n  return Y + 0;"),
]

# Edits in comments, blank lines and spacing only: the same code, so the site patches and the installed text stays.
SPELLING = [
    ("aiter/ops/mha.py", "non-gfx9 must fall back to ck-tile.", "non-gfx9 falls back to ck-tile."),
    ("aiter/ops/mha.py", "# ck-tile (mha_varlen_fwd, the else", "# ck_tile (mha_varlen_fwd, the else"),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", "    {\n        auto pos", "    { // MI300 or MI308\n        auto pos"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py", "import (  # noqa: E402\n", "import (\n"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gen_instances.py", "    kernels_list,\n)", "    kernels_list,  # all of them\n)"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu", "    }\n  }\n  return Y;", "    }\n  }\n\n  return Y;"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu", "  else\n  {\n    if (x_scale", "  else {\n    if (x_scale"),
    ("aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu", "false, \"Unsupported scales/output dtype!\");\n    }\n  }\n  return",
     "false,\n                  \"Unsupported scales/output dtype!\");\n    }\n  }\n  return"),
]

# The same code, but spelled differently on the very line a site rewrites: the patched file could not be undone to
# the installed bytes (the check proves every patched file against RECORD that way), so the plan refuses by name.
RESPELLED_REWRITTEN_LINE = [
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", '128 && arch_id == "gfx942")', '128 && arch_id == "gfx942" )'),
    ("aiter_meta/csrc/cpp_itfs/mha_fwd.cu", '(arch_id != "gfx950")))', '(arch_id != "gfx950")))  // v3 only'),
    ("aiter/jit/core.py", '"1")) > 0:', '"1"))  >  0:   '),
]


def test_code_joined_on_the_row_where_a_site_inserts_refuses_by_name(catalog, fixture_files):
    path = "aiter_meta/csrc/ck_gemm_a8w8/gemm_a8w8.cu"
    joined = FIXTURE[path].replace("    }\n  }\n  return Y;", "    } }\n  return Y;")
    result = plan(catalog, dict(fixture_files, **{path: joined.encode()}))
    assert result.status == "refused" and result.changes == []
    assert result.reasons[0].startswith(f"{path}: site a8w8-fp8-branch-close of set aiter-asm-paths: the code matches "
                                        f"near line "), result.reasons


@pytest.mark.parametrize("path, exact, respelled", RESPELLED_REWRITTEN_LINE,
                         ids=[f"{p}:{e[:24]}" for p, e, _ in RESPELLED_REWRITTEN_LINE])
def test_respelled_rewritten_line_refuses_by_name(catalog, fixture_files, path, exact, respelled):
    result = plan(catalog, dict(fixture_files, **{path: FIXTURE[path].replace(exact, respelled).encode()}))
    assert result.status == "refused" and result.changes == []
    assert result.reasons == [f"{path}: the patched file would not undo to the installed bytes (the installed text at "
                              f"a site is spelled differently from the anchor where the change rewrites it); write a "
                              f"variant for this release"]


@pytest.mark.parametrize("path, exact, respelled", SPELLING, ids=[f"{p}:{e[:24]}" for p, e, _ in SPELLING])
def test_comment_and_spacing_differences_still_patch(catalog, fixture_files, path, exact, respelled):
    assert FIXTURE[path].count(exact) == 1
    installed = FIXTURE[path].replace(exact, respelled)
    result = plan(catalog, dict(fixture_files, **{path: installed.encode()}))
    assert result.status == "apply", result.reasons
    written = next(change.new_bytes.decode() for change in result.changes if change.path == path)
    kept = respelled.strip().splitlines()[0]
    assert kept in written, "the installed spelling next to the site is kept"
    again = {p: (written.encode() if p == path else data) for p, data in fixture_files.items()}
    record = {p: record_hash(FIXTURE[p].encode()) for p in FIXTURE}
    record[path] = record_hash(installed.encode())
    files = {p: again.get(p) for p in catalog.target_files("amd-aiter")}
    for change in result.changes:
        files[change.path] = change.new_bytes
    assert plan_package(catalog, "amd-aiter", "0.1.19", files, record, []).status == "patched"


@pytest.mark.parametrize("path, exact, drifted", DRIFT, ids=[f"{p}:{e[:24]}" for p, e, _ in DRIFT])
def test_any_drift_in_an_anchor_refuses_with_nothing_written(catalog, fixture_files, path, exact, drifted):
    assert FIXTURE[path].count(exact) == 1, "the drift must hit one anchor"
    mutated = dict(fixture_files, **{path: FIXTURE[path].replace(exact, drifted).encode()})
    result = plan(catalog, mutated)
    assert result.status == "refused" and result.changes == [], result.reasons
    assert result.reasons[0].startswith("amd-aiter 0.1.19: set aiter-asm-paths: no variant matches")
    assert f"{path}: site " in result.reasons[0]


def test_duplicated_anchor_refuses_rather_than_guessing(catalog, fixture_files):
    doubled = FIXTURE["aiter/jit/core.py"] * 2
    result = plan(catalog, dict(fixture_files, **{"aiter/jit/core.py": doubled.encode()}))
    assert result.status == "refused"
    assert any("aiter/jit/core.py: site fp4x2-flag: expected the anchor 1x, found 2 unpatched" in r
               for r in result.reasons), result.reasons

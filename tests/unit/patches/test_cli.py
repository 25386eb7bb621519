"""``python -m cdna2 patch`` on a copy of the real AITER wheel files."""

from __future__ import annotations

import json

from cdna2.__main__ import main
from lab import wheelhouse
from tests.unit.patches.conftest import copy_real_subset
from tests.unit.patches.test_real_trees import snapshot


def run(capsys, *argv):
    code = main(["patch", *argv])
    return code, capsys.readouterr().out


def test_plan_apply_check_revert(catalog, tmp_path, capsys):
    root = copy_real_subset(catalog, wheelhouse.AITER, "amd-aiter", tmp_path / "site")
    jit_dir = root / "aiter" / "jit"
    (jit_dir / "build" / "module_fmha_v3_fwd").mkdir(parents=True)
    (jit_dir / "module_fmha_v3_fwd.so").write_bytes(b"stale")
    before = snapshot(root)

    code, out = run(capsys, "check", "--site-packages", str(root))
    assert code == 1 and "amd-aiter 0.1.7.post2.dev18: apply (aiter-asm-paths)" in out
    code, out = run(capsys, "plan", "--site-packages", str(root))
    assert code == 0 and "+++ b/aiter_meta/csrc/cpp_itfs/mha_fwd_generate.py" in out
    assert "   amd-aiter 0.1.7.post2.dev18: set aiter-asm-paths variant 0.1.7.post2.dev18 matches" in out
    assert ('   audit: aiter/ops/mha.py:1431: ret = get_gfx() == "gfx942": still refuses gfx90a on an attention path '
            'whose kernels are installed') in out
    assert "   note: set aiter-asm-paths variant 0.1.7.post2.dev18 leaves gate a8w8-dtypes as it is" in out
    assert snapshot(root) == before, "plan is a dry run"

    code, out = run(capsys, "apply", "--site-packages", str(root), "--json")
    report = json.loads(out)
    assert code == 0
    aiter = next(entry for entry in report["packages"] if entry["package"] == "amd-aiter")
    assert aiter["result"]["jit"]["removed"] == ["aiter/jit/build/module_fmha_v3_fwd", "aiter/jit/module_fmha_v3_fwd.so"]
    assert run(capsys, "check", "--site-packages", str(root))[0] == 0

    code, out = run(capsys, "revert", "--site-packages", str(root))
    assert code == 0 and "restored aiter/ops/gemm_op_a4w4.py, aiter_meta/csrc/cpp_itfs/mha_fwd_generate.py" in out
    assert not (root / ".cdna2-patch-state").exists(), "revert leaves nothing RECORD does not list (no lock file)"
    after = snapshot(root)
    assert {path: digest for path, digest in after.items() if "/jit/" not in path} == \
        {path: digest for path, digest in before.items() if "/jit/" not in path}


def test_unknown_optional_set_is_a_usage_error(tmp_path, capsys):
    assert main(["patch", "plan", "--site-packages", str(tmp_path), "--set", "no-such-set"]) == 2

"""A host whose AITER is a develop-mode git checkout (``./lab/up --aiter develop``): a real clone of AITER v0.1.19,
installed as ``pip install -e`` leaves it. Deploy translates its ``hsa/gfx942`` and patches the checkout, a second
deploy changes nothing, verify finds it as deployed (naming the operator's own uncommitted change without failing),
and rollback leaves ``git status`` clean with ``hsa/gfx90a`` gone.

The lab is one host of its own (a scratch subnet under the cache's scratch-labs/); the checkout is cloned once per
machine from $CDNA2_AITER_GIT (skipped when absent) and the translation of its tree is cached on the controller.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab.aiter_git import missing_reason
from tests.lab.conftest import one_host_lab
from tests.lab.deploy_runner import run_pyinfra

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture()
def develop_lab(monkeypatch: pytest.MonkeyPatch):
    if missing_reason():
        pytest.skip(missing_reason())
    with one_host_lab("develop", "--aiter", "develop", monkeypatch=monkeypatch) as lab:
        yield lab


def git_status(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], check=True, capture_output=True,
                          text=True).stdout


def test_develop_checkout_is_deployed_verified_and_rolled_back_to_a_clean_git_status(develop_lab: dict,
                                                                                     tmp_path: Path) -> None:
    (lab_host,) = develop_lab["hosts"]
    name, checkout = lab_host["name"], Path(lab_host["aiter_checkout"])
    assert lab_host["kind"] == "mi210-develop" and (checkout / "aiter" / "install_mode").read_text() == "develop"
    assert git_status(checkout) == ""

    deployed = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert deployed.returncode == 0, deployed.output[-4000:]
    row = deployed.row(name)
    assert row["outcome"] == "provisioned" and row["steps"]["smoke"]["status"] == "ok", row
    assert row["steps"]["kernels"]["status"] == "changed", row
    assert row["steps"]["patches amd-aiter"] == {"status": "changed",
                                                 "detail": "aiter-asm-paths (variant 0.1.16-0.1.20)"}, row
    assert "amd-aiter" not in row["steps"]["wheels"]["detail"], "a develop checkout is never replaced by a wheel"
    assert any((checkout / "hsa" / "gfx90a").rglob("*.co")), "the translated tree is in the checkout"
    changed = git_status(checkout).splitlines()
    assert "?? hsa/gfx90a/" in changed and any(line.startswith(" M csrc/") for line in changed), changed

    again = run_pyinfra("-y", "deploy.py", report_dir=tmp_path)
    assert again.returncode == 0 and again.row(name)["changes"] == [], again.row(name)

    # Replaced, not written in place: the checkout's files are hard links into the machine's cached clone.
    (checkout / "README.md.edited").write_text("the operator's own work in progress\n")
    (checkout / "README.md.edited").rename(checkout / "README.md")
    verified = run_pyinfra("-y", "verify.py", report_dir=tmp_path)
    assert verified.returncode == 0 and verified.row(name)["steps"]["verify"] == {
        "status": "ok", "detail": "as deployed"}, verified.output[-3000:]
    assert f"amd-aiter checkout {checkout}: differ from git HEAD, not ours (left as they are): README.md" in \
        verified.row(name)["notes"]
    subprocess.run(["git", "-C", str(checkout), "checkout", "--", "README.md"], check=True)

    rolled_back = run_pyinfra("-y", "rollback.py", report_dir=tmp_path)
    assert rolled_back.returncode == 0, rolled_back.output[-4000:]
    assert rolled_back.row(name)["steps"]["record"] == {
        "status": "ok", "detail": f"amd-aiter: checkout {checkout} is at git HEAD where the deploy wrote; "
                                  f"vllm: not installed, nothing to check"}  # the develop kind has no vLLM
    assert git_status(checkout) == "", "rollback leaves the checkout at git HEAD"
    assert not (checkout / "hsa" / "gfx90a").exists() and not (checkout / "hsa" / ".gfx90a.previous").exists()

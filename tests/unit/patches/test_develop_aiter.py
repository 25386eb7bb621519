"""Develop-mode AITER: a git checkout installed with ``pip install -e`` or ``setup.py develop``.

Each test makes a small real git checkout in tmp_path: AITER v0.1.19's own files, the ones the patch catalog
targets plus a few gfx942 kernels, taken from AITER's git history ($CDNA2_AITER_GIT, skipped when absent) and
committed with a real ``git``. The probe runs as the deploy runs it (a fresh interpreter over the checkout and a
site-packages holding the editable install's metadata, both shapes); the plan, the transaction and the revert
are the real ones, run here on the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cdna2.drift import checkout_changes
from cdna2.host import txn
from cdna2.host.checkouts import checkout_path
from cdna2.host.digests import git_hash_field, record_hash, tree_digest, triton_sources_digest
from cdna2.host.distributions import file_content
from cdna2.patches import plan_package
from cdna2.patches.cli import apply_in_place
from lab.aiter_git import aiter_git, missing_reason
from cdna2.plan import FAIL, PROCEED, develop_checkout, kernels_decision, target_env_error
from cdna2.reports.run import HostRow, summarise_probe
from cdna2.translated import KernelSourceError, ensure_source
from tests.unit.test_probe import PROBE_ARGV

TAG, VERSION = "v0.1.19", "0.1.19"
KERNELS = 3  # gfx942 kernel files committed into the checkout: enough for a tree digest

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")


def git(checkout: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True, text=True).stdout


def shown(path: str) -> bytes | None:
    found = subprocess.run(["git", "--git-dir", str(aiter_git()), "show", f"{TAG}:{path}"], capture_output=True)
    return found.stdout if found.returncode == 0 else None


@pytest.fixture(scope="session")
def checkout_source(catalog, tmp_path_factory) -> Path:
    """AITER v0.1.19's catalog targets and a few gfx942 kernels at their repository paths (not yet a git tree)."""
    root = tmp_path_factory.mktemp("aiter-source")
    listing = subprocess.run(["git", "--git-dir", str(aiter_git()), "ls-tree", "-r", "--name-only", TAG, "hsa/gfx942/"],
                             check=True, capture_output=True, text=True).stdout.split()
    paths = [checkout_path(path) for path in catalog.target_files("amd-aiter")] + listing[:KERNELS]
    for path in ["setup.py", *paths]:
        data = shown(path)
        if data is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
    (root / ".gitignore").write_text("aiter/install_mode\n*.egg-info\n__pycache__\n")
    return root


@pytest.fixture()
def checkout(checkout_source: Path, tmp_path: Path) -> Path:
    """A git work tree of the source, one commit, ``aiter/install_mode`` = develop as setup.py develop writes it."""
    root = tmp_path / "aiter"
    shutil.copytree(checkout_source, root)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=test", "-c", "user.email=test@example.invalid", "commit", "-q", "-m", TAG)
    (root / "aiter" / "install_mode").write_text("develop")
    return root


def pip_editable(site: Path, checkout: Path) -> None:
    """What ``pip install -e`` leaves in site-packages: a dist-info whose RECORD lists only the path file and the
    metadata, direct_url.json saying editable (PEP 610), and the ``__editable__`` path file."""
    site.mkdir(parents=True)
    dist_info = site / f"amd_aiter-{VERSION}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\nVersion: {VERSION}\n")
    (dist_info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True},
                                                           "url": f"file://{checkout}"}))
    (site / f"__editable__.amd_aiter-{VERSION}.pth").write_text(f"{checkout}\n")
    (dist_info / "RECORD").write_text(f"__editable__.amd_aiter-{VERSION}.pth,,\n{dist_info.name}/METADATA,,\n"
                                      f"{dist_info.name}/direct_url.json,,\n{dist_info.name}/RECORD,,\n")


def run_probe(tmp_path: Path, python_path: list[Path], catalog, path: str | None = None, **options) -> dict:
    options = {"target_python": sys.executable, "rocm_root": str(tmp_path / "rocm"),
               "state_dir": str(tmp_path / "state"), "kfd_topology": str(tmp_path / "kfd"),
               "patch_files": {"amd-aiter": catalog.target_files("amd-aiter")}, **options}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, python_path)))
    if path is not None:
        env["PATH"] = path
    result = subprocess.run([sys.executable, *PROBE_ARGV, json.dumps(options)],
                            capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


def probed_files(probe: dict) -> tuple[dict, dict]:
    entries = probe["patch_targets"]["amd-aiter"]["files"]
    files = {path: None if entry is None else file_content(entry["content"]) for path, entry in entries.items()}
    return files, {path: entry["record"] for path, entry in entries.items() if entry and entry["record"]}


def plan_from(probe: dict, catalog):
    dist = probe["distributions"]["amd-aiter"]
    files, record = probed_files(probe)
    return plan_package(catalog, "amd-aiter", dist["version"], files, record, [], checkout=develop_checkout(dist))


def test_pip_install_e_checkout_is_found_with_its_git_head(checkout: Path, tmp_path: Path, catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    probe = run_probe(tmp_path, [tmp_path / "site"], catalog)
    dist = probe["distributions"]["amd-aiter"]
    assert (dist["install_mode"], dist["location"], dist["version"]) == ("develop", str(checkout), VERSION)
    assert dist["commit"] == git(checkout, "rev-parse", "HEAD").strip() and dist["checkout_error"] is None
    aiter = probe["aiter"]
    assert aiter["hsa_root"] == str(checkout / "hsa") and aiter["gfx942_on_disk"]
    assert aiter["gfx942_record_files"] == KERNELS
    assert aiter["gfx942_record_digest"] == tree_digest(checkout / "hsa" / "gfx942", git_hash_field)
    assert aiter["gfx942_record_digest"] != tree_digest(checkout / "hsa" / "gfx942")  # not a RECORD digest
    entries = probe["patch_targets"]["amd-aiter"]["files"]
    assert {path for path, entry in entries.items() if entry} == {
        path for path in entries if (checkout / checkout_path(path)).is_file()}
    assert any(entry for path, entry in entries.items() if path.startswith("aiter_meta/")), "read from the checkout"
    for path, entry in entries.items():
        if entry is not None:
            data = (checkout / checkout_path(path)).read_bytes()
            assert entry["record"] == git_hash_field(data) == "git-blob=" + git(
                checkout, "rev-parse", f"HEAD:{checkout_path(path)}").strip()
            assert entry["current"] == record_hash(data)
    assert "amd-aiter" not in probe["record_facts"], "a develop AITER is read from git on every probe, not memoised"
    assert target_env_error(probe) is None
    # Its Triton sources have no RECORD: read from the checkout's files where the aiter-triton-gfx90a set asks.
    assert probe["triton_sources"] is None
    asked = run_probe(tmp_path, [tmp_path / "site"], catalog, triton_sources=True)["triton_sources"]
    assert asked == triton_sources_digest(checkout) and asked is not None


def test_setup_py_develop_checkout_is_found_through_its_egg_info(checkout: Path, tmp_path: Path, catalog) -> None:
    # setup.py develop: <checkout>/amd_aiter.egg-info, and the checkout on sys.path (its easy-install.pth entry;
    # PYTHONPATH stands in for it here, as .pth files are read only in site directories).
    (checkout / "amd_aiter.egg-info").mkdir()
    (checkout / "amd_aiter.egg-info" / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: amd-aiter\n"
                                                               f"Version: {VERSION}\n")
    (tmp_path / "site").mkdir()
    probe = run_probe(tmp_path, [tmp_path / "site", checkout], catalog)
    dist = probe["distributions"]["amd-aiter"]
    assert (dist["install_mode"], dist["location"]) == ("develop", str(checkout))
    assert dist["metadata_dir"] == str(checkout / "amd_aiter.egg-info")
    assert probe["aiter"]["gfx942_record_digest"] == tree_digest(checkout / "hsa" / "gfx942", git_hash_field)
    assert plan_from(probe, catalog).status == "apply"
    assert not git(checkout, "status", "--porcelain"), "the egg-info and install_mode are ignored, as upstream's"


def test_a_wheel_install_is_no_develop_install(tmp_path: Path, catalog) -> None:
    site = tmp_path / "site"
    (site / f"amd_aiter-{VERSION}.dist-info").mkdir(parents=True)
    (site / f"amd_aiter-{VERSION}.dist-info" / "METADATA").write_text(f"Name: amd-aiter\nVersion: {VERSION}\n")
    (site / f"amd_aiter-{VERSION}.dist-info" / "RECORD").write_text("")
    (site / f"amd_aiter-{VERSION}.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "file:///wheels/amd_aiter.whl", "archive_info": {}}))
    dist = run_probe(tmp_path, [site], catalog)["distributions"]["amd-aiter"]
    assert "install_mode" not in dist and dist["location"] == str(site)


def test_no_git_or_no_work_tree_fails_the_host_naming_the_checkout(checkout: Path, tmp_path: Path, catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    without_git = run_probe(tmp_path, [tmp_path / "site"], catalog, path=str(tmp_path / "empty-bin"))
    assert without_git["distributions"]["amd-aiter"]["checkout_error"].startswith("git is not installed")
    assert target_env_error(without_git) == (
        f"amd-aiter is installed in develop mode from {checkout}, but git is not installed (not on PATH), and the "
        f"checkout's git HEAD is its pristine oracle: install git on the host")

    shutil.rmtree(checkout / ".git")
    no_tree = target_env_error(run_probe(tmp_path, [tmp_path / "site"], catalog))
    assert no_tree.startswith(f"amd-aiter is installed in develop mode from {checkout}, but git rev-parse in "
                              f"{checkout} exited 128: fatal: not a git repository"), no_tree
    assert no_tree.endswith("(the develop checkout must be a git work tree with a HEAD commit)")


def test_patch_check_and_revert_in_the_checkout_leave_git_status_clean(checkout: Path, tmp_path: Path,
                                                                       catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    plan = plan_from(run_probe(tmp_path, [tmp_path / "site"], catalog), catalog)
    assert plan.status == "apply" and plan.checkout == str(checkout), plan.reasons
    manifest = plan.transaction(str(checkout), str(tmp_path / "backups"), {c.path: "staged" for c in plan.changes})
    assert manifest["version"] is None, "a checkout's version is no installation a reinstall replaces"
    assert [change["path"] for change in manifest["changes"]] == [checkout_path(c.path) for c in plan.changes]
    assert any(change.path.startswith("aiter_meta/") for change in plan.changes)

    result = apply_in_place(checkout, plan, tmp_path / "backups")
    assert result["ok"], result
    patched = {line[3:] for line in git(checkout, "status", "--porcelain").splitlines()}
    assert patched == {checkout_path(change.path) for change in plan.changes}
    (checkout / "setup.py").write_text("# the operator's own work in progress\n")
    again = plan_from(run_probe(tmp_path, [tmp_path / "site"], catalog), catalog)
    assert (again.status, again.changes) == ("patched", []), again.reasons

    (checkout / "hsa" / "gfx90a").mkdir()
    (checkout / "hsa" / "gfx90a" / "k.co").write_bytes(b"\x7fELF")
    status = run_probe(tmp_path, [tmp_path / "site"], catalog, record_check=["amd-aiter"])["record_check"]["amd-aiter"]
    assert status["git"] == str(checkout) and status["error"] is None
    assert sorted(status["mismatched"]) == sorted({*patched, "setup.py"}) and status["untracked"] == ["hsa/gfx90a/"]
    ours, others = checkout_changes(status, patched)
    assert (sorted(ours), others) == (sorted([*patched, "hsa/gfx90a/"]), ["setup.py"])

    reverted = txn.revert(tmp_path / "backups", checkout)
    assert reverted["ok"] and sorted(reverted["changed"]) == sorted(patched), reverted
    shutil.rmtree(checkout / "hsa" / "gfx90a")
    assert git(checkout, "status", "--porcelain") == " M setup.py\n"
    assert not (tmp_path / "backups").exists()


def test_a_target_with_uncommitted_changes_is_refused_by_name(checkout: Path, tmp_path: Path, catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    target = plan_from(run_probe(tmp_path, [tmp_path / "site"], catalog), catalog).changes[0].path
    with open(checkout / checkout_path(target), "a") as stream:
        stream.write("\nLOCAL_EXPERIMENT = 1\n")
    plan = plan_from(run_probe(tmp_path, [tmp_path / "site"], catalog), catalog)
    assert plan.status == "refused" and plan.changes == []
    head_blob = git(checkout, "rev-parse", f"HEAD:{checkout_path(target)}").strip()
    assert plan.reasons == [
        f"{checkout}/{checkout_path(target)}: uncommitted changes outside our patch sites (with our sites undone it "
        f"is not git HEAD's git-blob={head_blob}); refusing to overwrite them: commit or stash them in {checkout}"]


def fetch_from(hsa: Path):
    def fetch(archive: Path) -> None:
        with tarfile.open(archive, "w:gz") as packed:
            packed.add(hsa / "gfx942", arcname="gfx942")
    return fetch


def test_the_kernel_source_is_checked_against_git_head(checkout: Path, tmp_path: Path, catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    digest = run_probe(tmp_path, [tmp_path / "site"], catalog)["aiter"]["gfx942_record_digest"]
    kernel = next(path for path in (checkout / "hsa" / "gfx942").rglob("*") if path.is_file())
    kernel.write_bytes(kernel.read_bytes() + b"\0")
    with pytest.raises(KernelSourceError) as refused:
        ensure_source(tmp_path / "cache", digest, fetch_from(checkout / "hsa"), checkout=str(checkout))
    assert str(refused.value).startswith(f"{checkout}/hsa/gfx942 differs from the checkout's git HEAD (tree "
                                         f"{digest[:12]} in HEAD, ")
    assert str(refused.value).endswith("uncommitted or untracked kernel files; commit or stash them there")
    assert not (tmp_path / "cache" / "sources" / digest).exists()

    git(checkout, "checkout", "--", ".")
    source = ensure_source(tmp_path / "cache", digest, fetch_from(checkout / "hsa"), checkout=str(checkout))
    assert tree_digest(source, git_hash_field) == digest


def test_kernels_step_and_report_name_the_checkout(checkout: Path, tmp_path: Path, catalog) -> None:
    pip_editable(tmp_path / "site", checkout)
    probe = run_probe(tmp_path, [tmp_path / "site"], catalog)
    probe["gpu"] = {"arch": "gfx90a", "arches": ["gfx90a"], "source": "test", "agents": [  # no GPU here
        {"arch": "gfx90a", "marketing_name": "AMD Instinct MI210", "compute_units": 104, "chip_id": "0x740f"}]}
    assert kernels_decision(probe, True) == (PROCEED, f"gfx942 tree {probe['aiter']['gfx942_record_digest'][:12]} "
                                                      f"({KERNELS} files)")
    row = HostRow(host="mi210-x")
    summarise_probe(row, probe)
    commit = probe["distributions"]["amd-aiter"]["commit"]
    assert f"amd-aiter {VERSION} is a develop checkout: {checkout} at commit {commit[:12]} (git HEAD is the " \
           f"pristine oracle)" in row.notes

    shutil.rmtree(checkout / "hsa" / "gfx942")
    gone = run_probe(tmp_path, [tmp_path / "site"], catalog)
    gone["gpu"] = probe["gpu"]
    assert kernels_decision(gone, True) == (FAIL, f"{checkout}/hsa/gfx942 is in git HEAD but missing on disk: restore "
                                                  f"it (git checkout -- hsa/gfx942 in {checkout})")

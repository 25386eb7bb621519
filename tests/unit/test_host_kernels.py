"""Installing and removing the translated kernel tree on a host (cdna2/host/kernels.py), on local directories."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cdna2.archive import tree_archive
from cdna2.host import kernels
from cdna2.host.digests import tree_digest, tree_stat_signature
from cdna2.host.state import read_state

ROOT = Path(__file__).resolve().parents[2]


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def hsa(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "hsa", {"gfx942/pa/a.co": b"gfx942 a", "codegen.py": b"# codegen"})


def archive_of(tmp_path: Path, name: str, files: dict[str, bytes]) -> tuple[Path, str, str]:
    tree = make_tree(tmp_path / f"{name}-tree", files)
    archive = tree_archive(tree, tmp_path / f"{name}.tar.gz")
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest(), tree_digest(tree)


def run_cli(*args: str) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-B", "-m", "cdna2.host.kernels", *args], capture_output=True,
                            text=True, cwd=ROOT)
    return result.returncode, json.loads(result.stdout)


def install_args(archive: Path, sha: str, digest: str, hsa: Path, state: Path) -> list[str]:
    return ["install", "--archive", str(archive), "--sha256", sha, "--digest", digest, "--hsa-root", str(hsa),
            "--state-dir", str(state)]


def test_first_install_then_replace_keeps_previous(tmp_path: Path, hsa: Path) -> None:
    state = tmp_path / "state"
    first, sha1, digest1 = archive_of(tmp_path, "v1", {"pa/a.co": b"v1", "pa/pa.csv": b"knl_file\na.co\n"})
    code, result = run_cli(*install_args(first, sha1, digest1, hsa, state))
    assert code == 0 and result["result"] == "installed"
    assert tree_digest(hsa / "gfx90a") == digest1 and not first.exists(), "archive is removed after install"
    assert read_state(state)["kernels"]["digest"] == digest1
    assert read_state(state)["kernels"]["stat_signature"] == tree_stat_signature(hsa / "gfx90a")[0], \
        "the probe takes the digest from the record while this signature holds"

    second, sha2, digest2 = archive_of(tmp_path, "v2", {"pa/a.co": b"v2"})
    code, result = run_cli(*install_args(second, sha2, digest2, hsa, state))
    assert code == 0 and result["atomic_swap"] is True, "tmpfs/ext4 support an atomic directory exchange"
    assert tree_digest(hsa / "gfx90a") == digest2
    assert tree_digest(hsa / ".gfx90a.previous") == digest1
    assert sorted(p.name for p in hsa.iterdir()) == [".gfx90a.previous", "codegen.py", "gfx90a", "gfx942"]


def test_a_killed_installs_staging_is_removed_by_the_next_install(tmp_path: Path, hsa: Path) -> None:
    make_tree(hsa / ".gfx90a.staging-4242", {"pa/a.co": b"half"})  # a command killed mid-extraction
    make_tree(hsa / ".gfx90a.staging-4343.old", {"pa/a.co": b"old"})  # killed between the two renames
    archive, sha, digest = archive_of(tmp_path, "v1", {"pa/a.co": b"v1"})
    assert run_cli(*install_args(archive, sha, digest, hsa, tmp_path / "state"))[1]["result"] == "installed"
    assert sorted(p.name for p in hsa.iterdir()) == ["codegen.py", "gfx90a", "gfx942"]


def test_same_digest_is_unchanged(tmp_path: Path, hsa: Path) -> None:
    archive, sha, digest = archive_of(tmp_path, "v1", {"a.co": b"v1"})
    copy = tmp_path / "copy.tar.gz"
    copy.write_bytes(archive.read_bytes())
    assert run_cli(*install_args(archive, sha, digest, hsa, tmp_path / "s"))[1]["result"] == "installed"
    assert run_cli(*install_args(copy, sha, digest, hsa, tmp_path / "s"))[1]["result"] == "unchanged"


def test_damaged_upload_is_refused_and_nothing_changes(tmp_path: Path, hsa: Path) -> None:
    archive, sha, digest = archive_of(tmp_path, "v1", {"a.co": b"v1"})
    archive.write_bytes(archive.read_bytes()[:-10])
    before = tree_digest(hsa)
    code, result = run_cli(*install_args(archive, sha, digest, hsa, tmp_path / "s"))
    assert code == 1 and "does not match the uploaded" in result["error"]
    assert tree_digest(hsa) == before and not (hsa / "gfx90a").exists()


def test_wrong_tree_digest_is_refused_and_staging_removed(tmp_path: Path, hsa: Path) -> None:
    archive, sha, _ = archive_of(tmp_path, "v1", {"a.co": b"v1"})
    code, result = run_cli(*install_args(archive, sha, "0" * 64, hsa, tmp_path / "s"))
    assert code == 1 and "nothing was replaced" in result["error"]
    assert sorted(p.name for p in hsa.iterdir()) == ["codegen.py", "gfx942"]


def test_archive_escaping_the_tree_is_refused(tmp_path: Path, hsa: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.co")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()
    code, result = run_cli(*install_args(evil, sha, "0" * 64, hsa, tmp_path / "s"))
    assert code == 1 and "refusing archive member" in result["error"]
    assert not (tmp_path / "escaped.co").exists()


def test_remove_takes_both_trees_and_the_record(tmp_path: Path, hsa: Path) -> None:
    state = tmp_path / "state"
    for name, payload in (("v1", b"1"), ("v2", b"2")):
        archive, sha, digest = archive_of(tmp_path, name, {"a.co": payload})
        assert run_cli(*install_args(archive, sha, digest, hsa, state))[0] == 0
    code, result = run_cli("remove", "--hsa-root", str(hsa), "--state-dir", str(state))
    assert code == 0 and len(result["removed"]) == 2
    assert sorted(p.name for p in hsa.iterdir()) == ["codegen.py", "gfx942"]
    assert "kernels" not in read_state(state)
    assert run_cli("remove", "--hsa-root", str(hsa), "--state-dir", str(state))[1]["result"] == "unchanged"


def test_exchange_directories_swaps_contents(tmp_path: Path) -> None:
    first = make_tree(tmp_path / "a", {"x": b"a"})
    second = make_tree(tmp_path / "b", {"x": b"b"})
    assert kernels.exchange_directories(first, second) is True
    assert (first / "x").read_bytes() == b"b" and (second / "x").read_bytes() == b"a"

"""cdna2.host.txn (all-or-nothing, crash recovery) and cdna2.host.jit (JIT outputs, stale locks)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdna2.host import jit, txn
from cdna2.host.distributions import absent_directories

HOST_DIR = Path(txn.__file__).parent


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_manifest(tmp_path, count=3):
    root, backup = tmp_path / "site", tmp_path / "backup"
    changes = []
    for index in range(count):
        target = root / "pkg" / f"file{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f"old {index}\n".encode())
        staged = target.with_name(f".{target.name}.staged")
        staged.write_bytes(f"new {index}\n".encode())
        changes.append({"path": f"pkg/file{index}.py", "expected_sha256": sha(f"old {index}\n".encode()),
                        "staged": str(staged), "new_sha256": sha(f"new {index}\n".encode())})
    return {"root": str(root), "package": "pkg", "backup_dir": str(backup), "changes": changes,
            "jit_invalidations": ["aiter/jit/module_x.so"]}, root, backup


def contents(root, count=3):
    return [(root / "pkg" / f"file{index}.py").read_text() for index in range(count)]


class SimulatedCrash(BaseException):
    """Stands in for the process dying: BaseException, so nothing in txn catches it."""


def apply_crashing_after(monkeypatch, manifest: dict, renames_before_crash: int) -> None:
    """``txn.apply(manifest)`` as if the host died after that many renames, the journal written."""
    real_rename, done = txn._rename, []

    def crashing_rename(source, target):
        if len(done) == renames_before_crash:
            raise SimulatedCrash()
        done.append(target)
        real_rename(source, target)

    monkeypatch.setattr(txn, "_rename", crashing_rename)
    with pytest.raises(SimulatedCrash):
        txn.apply(manifest)
    monkeypatch.setattr(txn, "_rename", real_rename)


@pytest.mark.parametrize("renames_before_crash", [0, 1, 2])
def test_crash_after_k_renames_is_completed_by_recover(tmp_path, monkeypatch, renames_before_crash):
    manifest, root, backup = make_manifest(tmp_path)
    apply_crashing_after(monkeypatch, manifest, renames_before_crash)
    assert (backup / "journal.json").exists()
    k = renames_before_crash
    assert contents(root) == [f"new {i}\n" for i in range(k)] + [f"old {i}\n" for i in range(k, 3)]
    result = txn.recover(backup)
    assert result["recovered"] == "apply"
    assert contents(root) == ["new 0\n", "new 1\n", "new 2\n"]
    assert not (backup / "journal.json").exists()
    txn.revert(backup, root)
    assert contents(root) == ["old 0\n", "old 1\n", "old 2\n"]


def test_the_next_plan_after_a_crash_between_renames_applies(tmp_path, monkeypatch):
    """A host died after one of three renames; the next deploy probed the mix and planned the two files still
    unpatched. Its apply recovers the journal first (which patches those two as well), sees that the backups record
    exactly this change for them, and completes instead of refusing them as changed since the probe."""
    manifest, root, backup = make_manifest(tmp_path)
    apply_crashing_after(monkeypatch, manifest, 1)
    assert contents(root) == ["new 0\n", "old 1\n", "old 2\n"]
    replanned, _, _ = make_manifest(tmp_path / "next")  # the same plan for the files still unpatched
    replanned.update(root=str(root), backup_dir=str(backup))
    for change in replanned["changes"][1:]:
        staged = root / "pkg" / f".{Path(change['path']).name}.next-staged"
        staged.write_bytes(Path(change["staged"]).read_bytes())
        change["staged"] = str(staged)
    replanned["changes"] = replanned["changes"][1:]
    result = txn.apply(replanned)
    assert result["ok"] and result["settled_by_recovery"] == ["pkg/file1.py", "pkg/file2.py"]
    assert result["changed"] == []
    assert contents(root) == ["new 0\n", "new 1\n", "new 2\n"]
    assert not list(root.rglob("*.next-staged")) and not (backup / "journal.json").exists()
    txn.revert(backup, root)
    assert contents(root) == ["old 0\n", "old 1\n", "old 2\n"]


def test_a_file_at_the_new_hash_without_our_record_is_still_refused(tmp_path):
    manifest, root, _ = make_manifest(tmp_path)
    (root / "pkg" / "file0.py").write_bytes(b"new 0\n")  # someone else wrote it; no backup records it
    with pytest.raises(txn.TxnError, match="changed since it was probed"):
        txn.apply(manifest)


def test_stale_current_hash_refuses_before_any_write(tmp_path):
    manifest, root, backup = make_manifest(tmp_path)
    (root / "pkg" / "file2.py").write_text("someone else\n")
    with pytest.raises(txn.TxnError) as raised:
        txn.apply(manifest)
    assert raised.value.path == "pkg/file2.py" and "re-plan" in str(raised.value)
    assert contents(root) == ["old 0\n", "old 1\n", "someone else\n"]
    assert not (backup / "originals").exists()


def test_bad_staged_content_refuses(tmp_path):
    manifest, root, _ = make_manifest(tmp_path)
    Path(manifest["changes"][1]["staged"]).write_text("tampered\n")
    with pytest.raises(txn.TxnError, match="staged content does not hash"):
        txn.apply(manifest)
    assert contents(root) == ["old 0\n", "old 1\n", "old 2\n"]


def test_second_apply_keeps_the_first_original_and_revert_restores_it(tmp_path):
    manifest, root, backup = make_manifest(tmp_path, count=1)
    txn.apply(manifest)
    staged = root / "pkg" / ".file0.py.staged"
    staged.write_text("newer 0\n")
    txn.apply({**manifest, "changes": [{"path": "pkg/file0.py", "expected_sha256": sha(b"new 0\n"),
                                        "staged": str(staged), "new_sha256": sha(b"newer 0\n")}]})
    assert (backup / "originals" / "pkg" / "file0.py").read_text() == "old 0\n"
    result = txn.revert(backup, root)
    assert result["jit_invalidations"] == ["aiter/jit/module_x.so"]
    assert contents(root, 1) == ["old 0\n"]


def test_revert_refuses_a_file_edited_after_patching(tmp_path):
    manifest, root, backup = make_manifest(tmp_path)
    txn.apply(manifest)
    (root / "pkg" / "file1.py").write_text("hand edit\n")
    with pytest.raises(txn.TxnError, match="edited after patching"):
        txn.revert(backup, root)
    assert contents(root) == ["new 0\n", "hand edit\n", "new 2\n"]


def test_cli_prints_one_json_object_and_exit_codes(tmp_path):
    manifest, root, backup = make_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    command = [sys.executable, "-m", "cdna2.host.txn"]
    applied = subprocess.run(command + ["apply", str(tmp_path / "manifest.json")], capture_output=True, text=True,
                             cwd=HOST_DIR.parent.parent)
    assert applied.returncode == 0 and json.loads(applied.stdout)["ok"] is True
    # The same manifest again finds its changes made (the backups record them): done, nothing written.
    again = subprocess.run(command + ["apply", str(tmp_path / "manifest.json")], capture_output=True, text=True,
                           cwd=HOST_DIR.parent.parent)
    assert again.returncode == 0 and json.loads(again.stdout)["settled_by_recovery"] == [
        change["path"] for change in manifest["changes"]]
    (root / "pkg" / "file0.py").write_text("hand edit\n")
    again = subprocess.run(command + ["apply", str(tmp_path / "manifest.json")], capture_output=True, text=True,
                           cwd=HOST_DIR.parent.parent)
    refusal = json.loads(again.stdout)
    assert again.returncode == 1 and refusal["file"] == "pkg/file0.py"
    # pyinfra and the deploy report show a failed command's stderr: the reason must be there, not only in the JSON.
    assert again.stderr == f"txn apply failed: {refusal['error']}\n" and "pkg/file0.py" in again.stderr
    assert applied.stderr == ""


def test_jit_removes_patterns_and_only_stale_locks(tmp_path):
    build = tmp_path / "aiter" / "jit" / "build"
    (build / "module_fmha_v3_fwd" / "blob").mkdir(parents=True)
    (tmp_path / "aiter" / "jit" / "module_fmha_v3_fwd.so").write_bytes(b"so")
    (tmp_path / "aiter" / "jit" / "module_other.so").write_bytes(b"so")
    (build / "lock_module_stale").write_bytes(b"")
    held = build / "lock_module_held"
    held_fd = os.open(held, os.O_CREAT | os.O_EXCL)  # what AITER's FileBaton does while it builds
    try:
        result = jit.invalidate(tmp_path, ["aiter/jit/module_fmha_v3_fwd.so", "aiter/jit/build/module_fmha_v3_fwd"])
    finally:
        os.close(held_fd)
    assert result["removed"] == ["aiter/jit/build/module_fmha_v3_fwd", "aiter/jit/module_fmha_v3_fwd.so"]
    assert result["stale_locks_removed"] == ["aiter/jit/build/lock_module_stale"]
    assert result["locks_held"] == ["aiter/jit/build/lock_module_held"] and held.exists()
    assert (tmp_path / "aiter" / "jit" / "module_other.so").exists()


def test_jit_refuses_patterns_leaving_the_root(tmp_path):
    with pytest.raises(ValueError, match="relative to the site-packages root"):
        jit.invalidate(tmp_path, ["../etc/passwd"])


def install(root: Path, version: str, files: dict[str, str]) -> None:
    """What pip leaves: the package's files and its dist-info (another version's dist-info removed)."""
    for old in root.glob("pkg-*.dist-info"):
        (old / "METADATA").unlink()
        old.rmdir()
    (root / f"pkg-{version}.dist-info").mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: pkg\nVersion: {version}\n"
    (root / f"pkg-{version}.dist-info" / "METADATA").write_text(metadata)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def patch_manifest(root: Path, backup: Path, version: str, edits: dict[str, tuple[str, str]]) -> dict:
    changes = []
    for path, (old, new) in edits.items():
        staged = (root / path).with_name(f".{Path(path).name}.staged")
        staged.write_text(new)
        changes.append({"path": path, "expected_sha256": sha(old.encode()), "staged": str(staged),
                        "new_sha256": sha(new.encode())})
    return {"root": str(root), "package": "pkg", "version": version, "backup_dir": str(backup), "changes": changes,
            "jit_invalidations": []}


def test_backups_follow_the_installed_version_across_an_upgrade(tmp_path):
    """Patched at 1.0, upgraded to 2.0 by pip, patched again: a rollback must give back 2.0's files, not 1.0's."""
    root, backup = tmp_path / "site", tmp_path / "backup"
    install(root, "1.0", {"pkg/a.py": "a 1.0\n", "pkg/b.py": "b 1.0\n"})
    txn.apply(patch_manifest(root, backup, "1.0", {"pkg/a.py": ("a 1.0\n", "a 1.0 patched\n"),
                                                   "pkg/b.py": ("b 1.0\n", "b 1.0 patched\n")}))
    install(root, "2.0", {"pkg/a.py": "a 2.0\n", "pkg/b.py": "b 2.0\n"})  # 2.0's patch set touches a.py only
    applied = txn.apply(patch_manifest(root, backup, "2.0", {"pkg/a.py": ("a 2.0\n", "a 2.0 patched\n")}))
    assert applied["dropped_backups_of_version"] == "1.0"
    state = json.loads((backup / "state.json").read_text())
    assert state["version"] == "2.0" and sorted(state["files"]) == ["pkg/a.py"]
    assert txn.revert(backup, root)["changed"] == ["pkg/a.py"]
    assert [(root / p).read_text() for p in ("pkg/a.py", "pkg/b.py")] == ["a 2.0\n", "b 2.0\n"]


def test_revert_after_a_reinstall_at_another_version_drops_the_backups_and_touches_nothing(tmp_path):
    root, backup = tmp_path / "site", tmp_path / "backup"
    install(root, "1.0", {"pkg/a.py": "a 1.0\n"})
    txn.apply(patch_manifest(root, backup, "1.0", {"pkg/a.py": ("a 1.0\n", "a 1.0 patched\n")}))
    install(root, "2.0", {"pkg/a.py": "a 2.0\n"})
    reverted = txn.revert(backup, root)
    assert reverted["changed"] == [] and "1.0 was patched, but 2.0 is installed now" in reverted["note"]
    assert (root / "pkg/a.py").read_text() == "a 2.0\n"
    assert not (backup / "state.json").exists() and not (backup / "originals").exists()
    # Same version reinstalled (pip --force-reinstall): the backups still hold that version's originals.
    txn.apply(patch_manifest(root, backup, "2.0", {"pkg/a.py": ("a 2.0\n", "a 2.0 patched\n")}))
    install(root, "2.0", {"pkg/a.py": "a 2.0\n"})
    assert txn.revert(backup, root)["changed"] == [] and (root / "pkg/a.py").read_text() == "a 2.0\n"


ADDED = "pkg/configs/gfx90a/triton/DEFAULT.json"


def adding_manifest(tmp_path):
    """A manifest adding ADDED, whose two directories the package has not (its parent pkg/configs has mode 0750)."""
    root, backup = tmp_path / "site", tmp_path / "backup"
    (root / "pkg" / "configs").mkdir(parents=True)
    os.chmod(root / "pkg" / "configs", 0o750)
    directories = absent_directories(root, [ADDED])
    staged = root / f"{txn.staging_place(ADDED, directories)}{txn.STAGED_SUFFIX}-run1"
    staged.write_bytes(b"{}\n")
    return {"root": str(root), "package": "pkg", "backup_dir": str(backup), "directories": directories,
            "changes": [{"path": ADDED, "expected_sha256": None, "staged": str(staged), "new_sha256": sha(b"{}\n")}],
            "jit_invalidations": []}, root, backup


def test_an_added_file_gets_its_directories_recorded_created_and_removed_deepest_first(tmp_path, monkeypatch):
    manifest, root, backup = adding_manifest(tmp_path)
    assert manifest["directories"] == ["pkg/configs/gfx90a", "pkg/configs/gfx90a/triton"]
    assert manifest["changes"][0]["staged"] == f"{root}/pkg/configs/gfx90a--triton--DEFAULT.json.cdna2-staged-run1"
    apply_crashing_after(monkeypatch, manifest, 0)  # killed after the directories were made, before the rename
    assert json.loads((backup / "state.json").read_text())["created_directories"] == manifest["directories"]
    assert (root / "pkg/configs/gfx90a/triton").is_dir() and not (root / ADDED).exists()
    assert txn.recover(backup)["recovered"] == "apply"
    assert (root / ADDED).read_bytes() == b"{}\n"
    assert all(os.stat(root / directory).st_mode & 0o777 == 0o750 for directory in manifest["directories"])
    result = txn.revert(backup, root)
    assert result["changed"] == [ADDED] and result["left_directories"] == [], result
    assert result["removed_directories"] == manifest["directories"], result
    assert sorted(path.relative_to(root).as_posix() for path in root.rglob("*")) == ["pkg", "pkg/configs"]
    assert not backup.exists()


def test_a_created_directory_holding_someone_elses_file_is_left_and_named(tmp_path, capsys):
    manifest, root, backup = adding_manifest(tmp_path)
    assert txn.apply(manifest)["created_directories"] == manifest["directories"]
    (root / "pkg/configs/gfx90a/theirs.json").write_text("{}\n")
    assert txn.main(["revert", "--backup-dir", str(backup), "--root", str(root)]) == 0
    printed = capsys.readouterr()
    result = json.loads(printed.out)
    assert printed.err == f"txn revert: {result['note']}\n"
    assert result["removed_directories"] == ["pkg/configs/gfx90a/triton"], result
    assert result["left_directories"] == ["pkg/configs/gfx90a"], result
    assert f"left {root}/pkg/configs/gfx90a: created by the patch, but something else put files in" in result["note"]
    assert not (root / ADDED).exists() and (root / "pkg/configs/gfx90a/theirs.json").read_text() == "{}\n"
    assert not backup.exists()


def test_a_directory_to_create_that_exists_since_the_probe_refuses_before_any_write(tmp_path):
    manifest, root, backup = adding_manifest(tmp_path)
    (root / "pkg/configs/gfx90a").mkdir()
    with pytest.raises(txn.TxnError, match="gfx90a: exists, the plan expected to create it"):
        txn.apply(manifest)
    assert not (root / "pkg/configs/gfx90a/triton").exists() and Path(manifest["changes"][0]["staged"]).is_file()
    assert not backup.exists()

"""All-or-nothing file transactions for one package on one host. Standard library only: runs on the host.

``apply MANIFEST`` verifies every current file and every staged replacement before touching anything, keeps the
first (pristine) original of each file in the backup directory, journals the renames, then renames the staged files
into place. ``revert`` puts the originals back the same way and drops the backups. ``recover`` (run first by both)
finishes an interrupted transaction from its journal, so a package is never left half-patched; a change that an
earlier apply of the same plan already made (finished so) counts as done in ``apply``, not as a file changed since
the probe. A manifest row with no expected sha256 adds a file (it must be absent); it has no original, and
``revert`` removes it. The manifest's ``directories`` (shallowest first) are the directories the added files need
that the package does not have: each must be absent; ``apply`` records them, then creates them (mode of their
parent) before the renames, and ``revert``, after removing the files, removes them deepest first, each only if
empty (one holding a file of someone else's is left, and the result says so).

Backup directory layout: ``state.json`` (package, its version, root, per file the original and patched sha256, the
JIT outputs to invalidate, the directories created in creation order), ``originals/<path>`` (pristine copies),
``journal.json`` (only while renames are in flight), ``lock`` (removed with the directory once nothing else is in
it). Backups belong to one installed version: when the package has been reinstalled at another version since,
``apply`` starts new ones and ``revert`` finds nothing of ours left to restore; both drop the old backups.

Prints one JSON object on stdout; exit 0 when done, 1 when refused or failed (nothing changed unless it says so).
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import posixpath
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc imports collections: annotations only
    from collections.abc import Collection

from cdna2.host.cli import finish
from cdna2.host.digests import file_sha256
from cdna2.host.distributions import installed_version
from cdna2.host.env_lock import EnvLock
from cdna2.host.shared_env import shared_environment_of
from cdna2.host.state import fsync_directory, write_file_atomically

STATE = "state.json"
JOURNAL = "journal.json"
ORIGINALS = "originals"
# A staged file sits beside its target as <target>.cdna2-staged-<run> (operations/patches.py), or, when the
# transaction creates the target's directory, in the deepest directory that exists (staging_place).
STAGED_SUFFIX = ".cdna2-staged"


def staging_place(relative: str, directories: Collection[str]) -> str:
    """Where the new bytes of ``relative`` wait, relative to the root, before STAGED_SUFFIX and a run's tag: beside
    the target, or, when ``directories`` (those the transaction creates) hold it, in the directory above the
    shallowest of them, named for the path below (a rename within one filesystem still puts it in place)."""
    created = [directory for directory in directories if relative.startswith(directory + "/")]
    if not created:
        return relative
    existing = posixpath.dirname(min(created, key=len))
    below = relative[len(existing) + 1:] if existing else relative
    return posixpath.join(existing, below.replace("/", "--"))


class TxnError(Exception):
    """A refusal or failure; ``path`` names the file at fault when there is one."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


def _rename(source: Path, target: Path) -> None:
    """The one place a staged file replaces its target (tests fail it to simulate a crash mid-transaction)."""
    os.replace(source, target)


def _write_json(path: Path, document: dict) -> None:
    write_file_atomically(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _inside(root: Path, relative: str) -> Path:
    """Resolve ``relative`` under ``root``; refuse absolute paths and any path that leaves the root."""
    if os.path.isabs(relative) or ".." in Path(relative).parts:
        raise TxnError(f"{relative}: must be a relative path inside {root}", relative)
    return root / relative


def _take_lock(backup_dir: Path):
    """The open, locked ``backup_dir/lock``; retried when a holder removed it meanwhile (see _locked)."""
    while True:
        backup_dir.mkdir(parents=True, exist_ok=True)
        try:
            lock = open(backup_dir / "lock", "w")
        except FileNotFoundError:
            continue
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.stat(backup_dir / "lock").st_ino == os.fstat(lock.fileno()).st_ino:
                return lock
        except FileNotFoundError:
            pass
        lock.close()


@contextmanager
def _locked(backup_dir: Path):
    shared = shared_environment_of(backup_dir.parent.parent)
    if shared is not None:  # a shared environment's backups: its mkdir lock serialises every node (shared_env.py)
        with EnvLock(Path(shared)):
            backup_dir.mkdir(parents=True, exist_ok=True)
            try:
                yield
            finally:
                if not any(backup_dir.iterdir()):
                    backup_dir.rmdir()
        return
    lock = _take_lock(backup_dir)
    try:
        yield
    finally:
        # A backup directory with nothing left in it goes, lock and all, so a revert leaves nothing behind that the
        # package's RECORD does not list. Whoever waits on the removed lock sees another inode and takes a new one.
        if not any(entry.name != "lock" for entry in backup_dir.iterdir()):
            (backup_dir / "lock").unlink()
            backup_dir.rmdir()
        lock.close()


def _commit(backup_dir: Path, journal: dict) -> None:
    """Journal, rename every staged file into place, record the state, drop the journal."""
    _write_json(backup_dir / JOURNAL, journal)
    _roll_forward(backup_dir, journal)


def _roll_forward(backup_dir: Path, journal: dict) -> None:
    root = Path(journal["root"])
    if journal["kind"] == "apply":
        for directory in journal.get("directories", []):  # shallowest first
            _make_directory(_inside(root, directory))
    for entry in journal["entries"]:
        target = _inside(root, entry["path"])
        if file_sha256(target) == entry["new_sha256"]:
            continue  # renamed (or removed) before the interruption
        if entry["new_sha256"] is None:  # a file this tool added, reverted: removed
            target.unlink()
            continue
        staged = Path(entry["staged"])
        if file_sha256(staged) != entry["new_sha256"]:
            raise TxnError(f"{target}: neither renamed nor staged ({staged} is missing or changed); cannot finish "
                           f"the {journal['kind']} of {journal['package']}: restore the package by reinstalling it",
                           entry["path"])
        _rename(staged, target)
    if journal["kind"] == "revert":
        for directory in journal.get("directories", []):  # deepest first
            _remove_if_empty(_inside(root, directory))
    touched = {_inside(root, entry["path"]).parent for entry in journal["entries"]}
    touched |= {_inside(root, directory).parent for directory in journal.get("directories", [])}
    for directory in touched:
        if directory.is_dir():
            fsync_directory(directory)
    _finish(backup_dir, journal)


def _make_directory(directory: Path) -> None:
    """Create one directory the transaction adds (done already when a recovery repeats it), with its parent's mode."""
    if directory.is_dir():
        return
    directory.mkdir()
    os.chmod(directory, directory.parent.stat().st_mode & 0o7777)


def _remove_if_empty(directory: Path) -> None:
    """Remove one directory the transaction created; one that holds anything (someone else's file) stays."""
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass  # removed before an interruption
    except OSError:
        if not any(directory.iterdir()):
            raise


def _finish(backup_dir: Path, journal: dict) -> None:
    if journal["kind"] == "apply":
        state = _read_json(backup_dir / STATE)
        for entry in journal["entries"]:
            state["files"][entry["path"]]["patched_sha256"] = entry["new_sha256"]
        _write_json(backup_dir / STATE, state)
        (backup_dir / JOURNAL).unlink()
    else:
        (backup_dir / JOURNAL).unlink()
        shutil.rmtree(backup_dir / ORIGINALS, ignore_errors=True)
        (backup_dir / STATE).unlink(missing_ok=True)
    fsync_directory(backup_dir)


def recover(backup_dir: Path) -> dict:
    """Finish an interrupted apply or revert recorded in ``backup_dir``; a no-op when no journal is there."""
    journal = _read_json(backup_dir / JOURNAL)
    if journal is None:
        return {"ok": True, "action": "recover", "recovered": None}
    _roll_forward(backup_dir, journal)
    return {"ok": True, "action": "recover", "recovered": journal["kind"], "package": journal["package"],
            "files": [entry["path"] for entry in journal["entries"]]}


def _drop_backups(backup_dir: Path) -> None:
    shutil.rmtree(backup_dir / ORIGINALS, ignore_errors=True)
    (backup_dir / STATE).unlink(missing_ok=True)
    fsync_directory(backup_dir)


def _load_state(backup_dir: Path, root: Path, package: str, version: str | None) -> tuple[dict, str | None]:
    """The backup record to apply on, and the version whose backups were dropped to start it (else None)."""
    fresh = {"package": package, "version": version, "root": str(root), "files": {}, "jit_invalidations": []}
    state = _read_json(backup_dir / STATE)
    if state is None:
        return fresh, None
    if state["package"] != package or Path(state["root"]) != root:
        raise TxnError(f"{backup_dir} holds backups of {state['package']} under {state['root']}, not {package} under "
                       f"{root}; use one backup directory per package and root")
    if version is not None and state.get("version") not in (None, version):
        # Reinstalled at another version since it was patched: pip replaced the patched files, so the originals
        # kept belong to an installation that is gone, and restoring them would mix two versions.
        _drop_backups(backup_dir)
        return fresh, state["version"]
    return state, None


def _settled_by_recovery(root: Path, state: dict, changes: list[dict]) -> list[str]:
    """The changes an earlier apply of the same plan already made: the backups record this very original and new
    hash for the file and the file holds the new one. That apply was cut between its renames and ``recover`` just
    finished it, after the probe of this run saw the file still unpatched. Their staged copies are dropped."""
    settled = []
    for change in changes:
        recorded = state["files"].get(change["path"])
        if (recorded is not None and recorded["original_sha256"] == change["expected_sha256"]
                and recorded["patched_sha256"] == change["new_sha256"]
                and file_sha256(_inside(root, change["path"])) == change["new_sha256"]):
            Path(change["staged"]).unlink(missing_ok=True)
            settled.append(change["path"])
    return settled


def _drop_stale_staged(root: Path, changes: list[dict], directories: Collection[str]) -> None:
    """Remove files staged beside this manifest's targets by earlier runs that never applied them (a controller
    killed between upload and apply); ``recover`` has used what a journal needed. Under the lock no other apply
    runs: a file another controller is staging now is either applied by this manifest already, or its apply
    refuses it as missing, changing nothing."""
    ours = {change["staged"] for change in changes}
    for change in changes:
        place = _inside(root, staging_place(change["path"], directories))
        if not place.parent.is_dir():
            continue
        for staged in place.parent.glob(glob.escape(place.name) + STAGED_SUFFIX + "*"):
            if str(staged) not in ours:
                staged.unlink(missing_ok=True)


def _verify_manifest(root: Path, changes: list[dict], directories: Collection[str]) -> None:
    """Every check before anything is written: directories to create absent, current hashes, staged hashes, same
    filesystem."""
    for directory in directories:
        if _inside(root, directory).exists():
            raise TxnError(f"{root / directory}: exists, the plan expected to create it (the tree changed since it was "
                           f"probed): re-plan", directory)
    for change in changes:
        target = _inside(root, change["path"])
        current = file_sha256(target)
        if current != change["expected_sha256"]:
            raise TxnError(f"{target}: sha256 is {current}, the plan expected {change['expected_sha256']}; the file "
                           f"changed since it was probed: re-plan", change["path"])
        staged = Path(change["staged"])
        if file_sha256(staged) != change["new_sha256"]:
            raise TxnError(f"{staged}: staged content does not hash to {change['new_sha256']}; upload it again",
                           change["path"])
        if os.stat(staged).st_dev != os.stat(_existing_ancestor(target)).st_dev:
            raise TxnError(f"{staged}: not on the filesystem of {target}; stage it next to the target so the rename "
                           f"is atomic", change["path"])


def _existing_ancestor(path: Path) -> Path:
    while not path.parent.is_dir():
        path = path.parent
    return path.parent


def _back_up_originals(backup_dir: Path, root: Path, state: dict, changes: list[dict]) -> None:
    """Keep the first original of each file; a later apply never overwrites it (that one is the pristine copy). A
    file the change adds (no expected sha256: it must be absent) has no original; revert removes it."""
    for change in changes:
        path = change["path"]
        if path in state["files"]:
            continue
        target = _inside(root, path)
        if change["expected_sha256"] is None:
            state["files"][path] = {"original_sha256": None, "patched_sha256": None}
            continue
        write_file_atomically(_inside(backup_dir / ORIGINALS, path), target.read_bytes(),
                              mode=target.stat().st_mode & 0o7777)
        state["files"][path] = {"original_sha256": change["expected_sha256"], "patched_sha256": None}
    _write_json(backup_dir / STATE, state)


def apply(manifest: dict) -> dict:
    """Apply one package's change manifest (see the module docstring and cdna2.patches.cli for its shape)."""
    root, backup_dir = Path(manifest["root"]), Path(manifest["backup_dir"])
    with _locked(backup_dir):
        recover(backup_dir)
        _drop_stale_staged(root, manifest["changes"], manifest.get("directories", []))
        state, dropped_version = _load_state(backup_dir, root, manifest["package"], manifest.get("version"))
        settled = _settled_by_recovery(root, state, manifest["changes"])
        changes = [change for change in manifest["changes"] if change["path"] not in settled]
        # Created by an earlier apply that recovery finished (its files are settled): nothing to create again.
        directories = [directory for directory in manifest.get("directories", [])
                       if directory not in state.get("created_directories", [])]
        _verify_manifest(root, changes, directories)
        _back_up_originals(backup_dir, root, state, changes)
        # Recorded before they exist, so a revert after an interruption removes whichever were made.
        state["created_directories"] = state.get("created_directories", []) + directories
        state["jit_invalidations"] = sorted(set(state["jit_invalidations"])
                                            | set(manifest.get("jit_invalidations", [])))
        _write_json(backup_dir / STATE, state)
        for change in changes:  # the new file keeps the mode of the one it replaces (an added one: 0644)
            target = _inside(root, change["path"])
            os.chmod(change["staged"], target.stat().st_mode & 0o7777 if target.exists() else 0o644)
        _commit(backup_dir, {"kind": "apply", "package": manifest["package"], "root": str(root),
                             "directories": directories,
                             "entries": [{"path": c["path"], "staged": c["staged"], "old_sha256": c["expected_sha256"],
                                          "new_sha256": c["new_sha256"]} for c in changes]})
    return {"ok": True, "action": "apply", "package": manifest["package"],
            "changed": [change["path"] for change in changes], "created_directories": directories,
            "settled_by_recovery": settled,
            "backup_dir": str(backup_dir), "dropped_backups_of_version": dropped_version}


def revert(backup_dir: Path, root: Path) -> dict:
    """Restore every original kept in ``backup_dir`` under ``root``, verified, then drop the backups."""
    if not backup_dir.is_dir():
        return {"ok": True, "action": "revert", "package": None, "changed": [], "jit_invalidations": [],
                "note": f"{backup_dir} does not exist: nothing was patched through it"}
    with _locked(backup_dir):
        recover(backup_dir)
        state = _read_json(backup_dir / STATE)
        if state is None:
            return {"ok": True, "action": "revert", "package": None, "changed": [], "jit_invalidations": [],
                    "note": f"{backup_dir} holds no backups: nothing was patched through it"}
        if Path(state["root"]) != root:
            raise TxnError(f"{backup_dir} holds backups for {state['root']}, not {root}")
        installed = installed_version(root, state["package"])
        if state.get("version") is not None and installed != state["version"]:
            _drop_backups(backup_dir)
            return {"ok": True, "action": "revert", "package": state["package"], "changed": [],
                    "jit_invalidations": state["jit_invalidations"],
                    "note": f"{state['package']} {state['version']} was patched, but {installed or 'no version'} is "
                            f"installed now: its reinstall replaced the patched files, so nothing is left to restore; "
                            f"the backups of {state['version']} were dropped"}
        entries = []
        for path, hashes in sorted(state["files"].items()):
            target = _inside(root, path)
            current = file_sha256(target)
            if current == hashes["original_sha256"]:
                continue
            if current != hashes["patched_sha256"]:
                raise TxnError(f"{target}: sha256 {current} is neither the original nor our patched state; it was "
                               "edited after patching: refusing to overwrite it (restore it by hand or reinstall)",
                               path)
            if hashes["original_sha256"] is None:  # added by this tool: removed
                entries.append({"path": path, "staged": None, "old_sha256": current, "new_sha256": None})
                continue
            original = _inside(backup_dir / ORIGINALS, path)
            staged = target.with_name(f".{target.name}.cdna2-revert")
            shutil.copy2(original, staged)
            if file_sha256(staged) != hashes["original_sha256"]:
                raise TxnError(f"{original}: backup does not hash to the recorded original "
                               f"{hashes['original_sha256']}; the backup is damaged: reinstall the package", path)
            entries.append({"path": path, "staged": str(staged), "old_sha256": current,
                            "new_sha256": hashes["original_sha256"]})
        created = state.get("created_directories", [])
        _commit(backup_dir, {"kind": "revert", "package": state["package"], "root": str(root), "entries": entries,
                             "directories": created[::-1]})
    left = [directory for directory in created if _inside(root, directory).is_dir()]
    result = {"ok": True, "action": "revert", "package": state["package"], "changed": [e["path"] for e in entries],
              "removed_directories": [directory for directory in created if directory not in left],
              "left_directories": left, "jit_invalidations": state["jit_invalidations"]}
    if left:
        result["note"] = (f"left {', '.join(str(root / directory) for directory in left)}: created by the patch, but "
                          f"something else put files in since; remove them by hand once they are not needed")
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.txn", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    apply_parser = commands.add_parser("apply", help="apply a change manifest (JSON file)")
    apply_parser.add_argument("manifest", type=Path)
    revert_parser = commands.add_parser("revert", help="restore the originals kept in a backup directory")
    revert_parser.add_argument("--backup-dir", type=Path, required=True)
    revert_parser.add_argument("--root", type=Path, required=True)
    recover_parser = commands.add_parser("recover", help="finish an interrupted transaction")
    recover_parser.add_argument("--backup-dir", type=Path, required=True)
    return parser


# Manifests are named per controller run (operations/patches.py) and kept for a post-mortem; one this old is no
# other run's in flight.
OLD_MANIFEST_S = 3600


def _drop_old_manifests(manifest: Path) -> None:
    for other in manifest.parent.glob("patch-*.json"):
        try:
            if other != manifest and time.time() - other.stat().st_mtime > OLD_MANIFEST_S:
                other.unlink()
        except FileNotFoundError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "apply":
            result = apply(json.loads(args.manifest.read_text(encoding="utf-8")))
            _drop_old_manifests(args.manifest)
        elif args.command == "revert":
            result = revert(args.backup_dir, args.root)
        else:
            with _locked(args.backup_dir):  # the same lock an apply or revert holds (a shared environment's too)
                result = recover(args.backup_dir)
    except TxnError as error:
        result = {"ok": False, "action": args.command, "error": str(error), "file": error.path}
    if result.get("left_directories"):  # done, but the operator has directories to look at
        print(f"txn revert: {result['note']}", file=sys.stderr)
    return finish(f"txn {args.command}", result, None if result["ok"] else result["error"])


if __name__ == "__main__":
    sys.exit(main())

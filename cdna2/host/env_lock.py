"""The lock that serialises the nodes' writes to a shared environment, and the commands the deploy runs on it: the
identity written once, a non-writing node's check, its removal at rollback. Layout and why ``mkdir``:
cdna2/host/shared_env.py. Standard library only: runs on the hosts.

    python -m cdna2.host.env_lock claim --prefix P --id ID --run RUN
    python -m cdna2.host.env_lock check --prefix P --expect JSON
    python -m cdna2.host.env_lock forget --prefix P
    python -m cdna2.host.env_lock hold --state-dir P/.cdna2/state -- ARGV
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from cdna2.host.cli import finish
from cdna2.host.digests import file_sha256, tree_digest
from cdna2.host.shared_env import ENV_DIR, IDENTITY, STATE, environment_dir, read_identity, this_node

LOCK = "lock"
OWNER = "owner.json"
WRITER = "writer.json"  # the run that wrote the environment last, and from which node
HEARTBEAT_S = 2.0
# A holder's heartbeat missing this long means its node is gone (or cut off): 10 missed beats, far beyond an NFS
# server's usual stall. A holder paused that long (SIGSTOP) loses the lock, and its heartbeat ends its process at
# its next beat (LOST_LOCK_EXIT).
STALE_S = 20.0
LOST_LOCK_EXIT = 75
WAIT_S = 900.0  # how long a command waits for another node's command on the environment before giving up


class SharedEnvironmentBusy(RuntimeError):
    """Another node's command held the environment's lock for longer than the wait; the message names it."""


def _publish(directory: Path, name: str, document: dict) -> bool:
    """Write ``document`` whole under ``directory/name`` unless that name exists; True when this call made it."""
    staged = directory / f".{name}.{uuid.uuid4().hex}"
    with open(staged, "x", encoding="utf-8") as stream:
        stream.write(json.dumps(document, sort_keys=True) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    try:
        os.link(staged, directory / name)
        return True
    except FileExistsError:
        return False
    finally:
        staged.unlink()


def claim_identity(prefix: str | Path, identity_id: str) -> dict:
    """The environment's identity: ``identity_id`` (the controller's), written now when it has none; else the one
    written before, or by a writer that won a race."""
    directory = Path(environment_dir(prefix))
    directory.mkdir(mode=0o755, exist_ok=True)
    _publish(directory, IDENTITY, {"id": identity_id, "created_by": this_node()["name"],
                                   "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    identity = read_identity(prefix)
    if identity is None:
        raise OSError(errno.EIO, f"{directory / IDENTITY} is not a valid identity: remove it and run again")
    return identity


def _process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class EnvLock:
    """``with EnvLock(env_dir):`` hold the environment's ``lock/``, waiting up to ``wait_s`` for another holder."""

    def __init__(self, env_dir: Path, wait_s: float = WAIT_S, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S):
        self.lock_dir = env_dir / LOCK
        self.wait_s, self.stale_s, self.heartbeat_s = wait_s, stale_s, heartbeat_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None

    def __enter__(self) -> "EnvLock":
        self.lock_dir.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        seen: tuple | None = None  # (owner file's mtime and token) when first seen, and since when
        since = time.monotonic()
        while True:
            try:
                os.mkdir(self.lock_dir, 0o755)
                break
            except FileExistsError:
                pass
            owner, mark = self._owner()
            if mark != seen:
                seen, since = mark, time.monotonic()
            if self._holder_gone(owner, time.monotonic() - since):
                self._break((owner or {}).get("token"))
                continue
            if time.monotonic() >= deadline:
                raise SharedEnvironmentBusy(
                    f"{self.lock_dir} is held by {describe(owner)}: another node is changing this shared "
                    f"environment; waited {self.wait_s:.0f} s. Run again once it has finished (a holder whose "
                    f"node is gone is taken over after {self.stale_s:.0f} s without its heartbeat)")
            time.sleep(0.2)
        node = this_node()
        owner = {**node, "pid": os.getpid(), "start": _process_start(os.getpid()), "token": self.token,
                 "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(self.lock_dir / OWNER, "x", encoding="utf-8") as stream:
            stream.write(json.dumps(owner, sort_keys=True) + "\n")
        self._beating = threading.Thread(target=self._beat, daemon=True)
        self._beating.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._beating is not None:
            self._beating.join()
        if self.held():
            # Renamed away first: a waiter never finds the lock directory without its owner file mid-removal.
            aside = self.lock_dir.with_name(f"{LOCK}.released-{self.token}")
            os.rename(self.lock_dir, aside)
            shutil.rmtree(aside, ignore_errors=True)

    def held(self) -> bool:
        owner, _ = self._owner()
        return bool(owner) and owner.get("token") == self.token

    def _beat(self) -> None:
        """Touch the owner file every ``heartbeat_s``. A holder that finds its lock taken over (paused, or cut off
        from the filesystem, past ``stale_s``) ends its process at once, like a killed command: what it was writing
        is whole or journalled, and another holder now writes."""
        while not self._stop.wait(self.heartbeat_s):
            if not self.held():
                print(f"{self.lock_dir} was taken over by {describe(self._owner()[0])} while this command (pid "
                      f"{os.getpid()}) held it: stopping here; run again", file=sys.stderr, flush=True)
                os._exit(LOST_LOCK_EXIT)
            try:
                os.utime(self.lock_dir / OWNER)
            except OSError:
                pass  # taken over between the two looks: the next beat stops the process

    def _owner(self) -> tuple[dict | None, tuple | None]:
        """The owner document (None while the holder is still writing it) and a mark that changes with each beat."""
        path = self.lock_dir / OWNER
        try:
            stat = path.stat()
            owner = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None, None
        return owner, (stat.st_mtime_ns, owner.get("token"))

    def _holder_gone(self, owner: dict | None, unchanged_s: float) -> bool:
        node = this_node()
        if owner and owner.get("name") == node["name"] and owner.get("boot_id") == node["boot_id"]:
            return _process_start(owner["pid"]) != owner.get("start")
        return unchanged_s >= self.stale_s

    def _break(self, dead_token: str | None) -> None:
        """Take the dead holder's lock away (``dead_token``: its owner file's token, None when it wrote none). Only
        one of several racing waiters' renames finds it; a waiter whose rename caught a lock another waiter had
        just taken (its decision came from the dead holder's owner file) puts that one back at once."""
        aside = self.lock_dir.with_name(f"{LOCK}.broken-{uuid.uuid4().hex}")
        try:
            os.rename(self.lock_dir, aside)
        except FileNotFoundError:
            return
        try:
            taken = json.loads((aside / OWNER).read_text(encoding="utf-8")).get("token")
        except (OSError, ValueError):
            taken = None
        if taken != dead_token:
            try:
                os.rename(aside, self.lock_dir)
                return
            except OSError:
                pass  # a third holder made a new lock meanwhile; the live one we caught stops at its next beat
        shutil.rmtree(aside, ignore_errors=True)

def describe(owner: dict | None) -> str:
    if not owner:
        return "a command still writing its owner file"
    return f"pid {owner.get('pid')} on node {owner.get('name')} since {owner.get('since')}"


def mark_writer(prefix: Path, run: str) -> dict:
    """Record, under the lock, that ``run`` writes the environment now: what every other node of the run checks
    it reads through its own mount (a node cloned with a copy of the identity would read an older mark)."""
    env_dir = Path(environment_dir(prefix))
    mark = {"run": run, "node": this_node()["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with EnvLock(env_dir):
        staged = env_dir / f".{WRITER}.{uuid.uuid4().hex}"
        staged.write_text(json.dumps(mark, sort_keys=True) + "\n")
        os.replace(staged, env_dir / WRITER)
    return mark


def read_writer(prefix: Path) -> dict | None:
    try:
        return json.loads((Path(environment_dir(prefix)) / WRITER).read_text())
    except (OSError, ValueError):
        return None


def check(prefix: Path, expected: dict, wait_s: float = WAIT_S) -> dict:
    """What a node that did not write the environment checks through its own mount, once no node's command is
    changing it (the lock is taken and given back): the identity the probes found (or, where they found none, one
    the writer wrote: a run's own or a concurrent run's), no patch transaction in flight, and the kernel tree and
    patched files the writer's plan, which is this node's plan too, was to leave."""
    env_dir = Path(environment_dir(prefix))
    identity = read_identity(prefix)
    problems = []
    if identity is None or expected["identity"] not in (None, identity["id"]):
        problems.append(f"{env_dir / IDENTITY} holds {identity and identity['id']}, not the identity "
                        f"{expected['identity'] or '(any)'} its writer {expected['writer']} wrote: this node does not "
                        f"see the shared environment (a local disk at the same path?); give the host its own "
                        f"shared_environment: false, or mount the shared one")
        return {"ok": False, "problems": problems}
    with EnvLock(env_dir, wait_s=wait_s):
        mark = read_writer(prefix)
        if mark is None:
            problems.append(f"{env_dir / WRITER} is missing: no writer has marked the environment; this node does "
                            f"not see the writes of {expected['writer']} (another copy of the environment?)")
        journals = sorted(str(path) for path in (env_dir / STATE / "backups").glob("*/journal.json"))
        problems += [f"{journal}: a patch transaction is unfinished (its writer was cut off); the next deploy "
                     f"finishes it" for journal in journals]
        kernels = expected.get("kernels")
        if kernels:
            found = tree_digest(Path(kernels["hsa_root"]) / "gfx90a")
            if found != kernels["digest"]:
                problems.append(f"{kernels['hsa_root']}/gfx90a: tree digest {found}, the writer's plan leaves "
                                f"{kernels['digest']}")
        for path, sha256 in sorted(expected.get("files", {}).items()):
            found = file_sha256(path)
            if found != sha256:
                problems.append(f"{path}: sha256 {found}, the writer's plan leaves {sha256}")
    # Another controller's run may have written it last (two deploys of one environment at once): each write was
    # whole under the lock, and what this run's plan leaves is there, which is what the checks above prove.
    return {"ok": not problems, "problems": problems, "identity": identity["id"],
            "written_by": mark and (mark["run"] if mark["run"] == expected["run"] else f"another run: {mark['run']}"),
            "checked_files": len(expected.get("files", {})), "checked_kernels": bool(kernels)}


def forget(prefix: Path) -> dict:
    """Take the tool's directory out of the environment (rollback, once nothing of the deploy is left in it)."""
    env_dir = Path(environment_dir(prefix))
    if not env_dir.exists():
        return {"result": "unchanged"}
    aside = env_dir.with_name(f"{ENV_DIR}.removing-{uuid.uuid4().hex}")
    os.rename(env_dir, aside)
    shutil.rmtree(aside)
    return {"result": "removed", "path": str(env_dir)}


def hold(state_dir: Path, argv: list[str]) -> int:
    """Run ``argv`` holding the shared environment's lock (pip, which is not this tool's to make atomic); its exit
    status."""
    with EnvLock(Path(state_dir).parent):
        return subprocess.run(argv).returncode


def main(argv: list[str] | None = None) -> int:
    """``claim --prefix P --id ID --run RUN``: write the identity unless one is there, and this run's writer mark;
    ``hold --state-dir SD -- ARGV``: run ARGV holding the lock; ``check --prefix P --expect JSON``:
    a non-writing node's check (``check``); ``forget --prefix P``: remove ``P/.cdna2``."""
    parser = argparse.ArgumentParser(prog="python -m cdna2.host.env_lock", description=main.__doc__)
    parser.add_argument("action", choices=["claim", "check", "forget", "hold"])
    parser.add_argument("--prefix", type=Path)
    parser.add_argument("--state-dir", type=Path, help="hold: the shared environment's state directory")
    parser.add_argument("--id")
    parser.add_argument("--run", help="claim: the controller run that writes the environment now")
    parser.add_argument("--expect", help="JSON: identity, writer, run, kernels {hsa_root, digest}, "
                                         "files {path: sha256}")
    argv = sys.argv[1:] if argv is None else argv
    # hold's command follows "--", options and all.
    argv, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(argv)
    if args.action == "hold":
        if args.state_dir is None or not command:
            parser.error("hold needs --state-dir and -- ARGV")
        try:
            return hold(args.state_dir, command)
        except SharedEnvironmentBusy as error:
            print(f"shared environment hold failed: {error}", file=sys.stderr)
            return 1
    if args.prefix is None:
        parser.error(f"{args.action} needs --prefix")
    try:
        if args.action == "claim":
            identity = claim_identity(args.prefix, args.id)
            result = {"result": "claimed" if identity["id"] == args.id else "unchanged", "identity": identity,
                      "writer": mark_writer(args.prefix, args.run)}
        elif args.action == "check":
            result = check(args.prefix, json.loads(args.expect))
            if not result["ok"]:
                return finish("shared environment check", result, "; ".join(result["problems"]))
        else:
            result = forget(args.prefix)
    except (OSError, SharedEnvironmentBusy) as error:
        return finish(f"shared environment {args.action}", {"result": "failed", "error": str(error)}, str(error))
    return finish(f"shared environment {args.action}", result)


if __name__ == "__main__":
    sys.exit(main())

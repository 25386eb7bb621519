"""Control the simulated MI210 lab: real sshd hosts on loopback, each in its own mount and UTS namespace.

``./lab/up [N]``, ``./lab/down`` and ``./lab/status`` are thin wrappers over ``python -m lab.labctl``. The lab's
state lives in ``<repo>/.lab/`` (or ``$CDNA2_LAB_DIR``); ``lab.json`` there is the contract with
``inventory/sim.py`` and the tests (fields documented in docs/maintainers/test-lab.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from lab import kinds, mirror, sif_runtime, slurm
from lab.hosts import (ensure_client_key, ensure_controller_paths, known_hosts_text, prepare_host_dir, start_host,
                       user_wheels)
from lab.labstate import HOST_BINDS, LAB_FORMAT, LabPaths, lab_locked, load_lab, progress, save_lab, write_atomically
from lab.logins import LOGINS, ensure_login_users, login_users, remove_login_users
from lab.processes import is_lab_sshd, stop_host

SSH_TIMEOUT_S = 10
HOST_STARTS_AT_ONCE = 4
# What `status` asks each host over SSH: a fixed script, no interpolated values.
PROBE_SCRIPT = r"""printf 'hostname=%s\n' "$(hostname)"
printf 'rocm_version=%s\n' "$(cat /opt/rocm/.info/version)"
printf 'arch=%s\n' "$(/opt/rocm/bin/rocminfo | sed -n 's/^  Name: *\(gfx[0-9a-z]*\).*/\1/p' | head -n 1)"
/opt/venv/bin/python - <<'PROBE_END'
import importlib.metadata as metadata
import sys
print("python=" + sys.version.split()[0])
print("python_prefix=" + sys.prefix)
for name in ("amd-aiter", "triton", "vllm"):
    try:
        print(f"package:{name}=" + metadata.version(name))
    except metadata.PackageNotFoundError:
        pass
PROBE_END
"""


def host_alive(host: dict) -> bool:
    return is_lab_sshd(host["pid"], host["sshd_config"])


def _new_lab(paths: LabPaths, subnet: str, login: str, aiter: str, shared: int) -> dict:
    ssh = {"user": "root", "key": str(paths.client_key), "known_hosts": str(paths.known_hosts), "sudo": False}
    if login == "sudo":
        users = login_users(paths)
        ssh.update(user=users["sudo"], sudo=True, users=users)
    elif login == "user":
        users = login_users(paths, "user")
        ssh.update(user=users["user"], users=users)
    return {
        "format": LAB_FORMAT,
        "lab_dir": str(paths.root),
        "subnet": subnet,
        "login": login,
        "aiter": aiter,
        "shared": shared,
        "ssh": ssh,
        "hosts": [],
    }


def _record(paths: LabPaths, lab: dict, host: dict) -> None:
    """Record a started host at once, so its pid is known to `down` even if a later host fails to start."""
    lab["hosts"] = sorted([h for h in lab["hosts"] if h["name"] != host["name"]] + [host], key=lambda h: h["index"])
    write_atomically(paths.known_hosts, known_hosts_text(lab))
    save_lab(paths, lab)


def check_lab_dir_outside_binds(paths: LabPaths) -> None:
    """A host must see its own config and log: a lab directory under a bound path (say /tmp) would be hidden."""
    for mount_point in HOST_BINDS:
        if paths.root.is_relative_to(mount_point):
            raise SystemExit(f"lab directory {paths.root} is under {mount_point}, which each host replaces with its "
                             f"own; set CDNA2_LAB_DIR to a directory outside {', '.join(HOST_BINDS)}")


def up(paths: LabPaths, count: int, subnet: str | None, login: str | None = None, aiter: str | None = None,
       shared: int | None = None, with_slurm: bool = False, with_sif_runtime: bool = False) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("./lab/up must run as root (it creates mount namespaces and bind mounts)")
    check_lab_dir_outside_binds(paths)
    kinds.check_host_count(count)
    if subnet is not None:
        kinds.check_subnet(subnet)
    with lab_locked(paths):
        lab = load_lab(paths)
        if lab is not None and subnet is not None and lab["subnet"] != subnet:
            raise SystemExit(f"the lab in {paths.root} uses subnet {lab['subnet']}, not {subnet}; "
                             f"run ./lab/down first to change it")
        if lab is not None and login is not None and lab.get("login", "root") != login:
            raise SystemExit(f"the lab in {paths.root} logs in as {lab.get('login', 'root')}, not {login}; "
                             f"run ./lab/down first to change it")
        if lab is not None and aiter is not None and lab.get("aiter", "wheel") != aiter:
            raise SystemExit(f"the lab in {paths.root} holds AITER as a {lab.get('aiter', 'wheel')}, not {aiter}; "
                             f"run ./lab/down first to change it")
        if lab is not None and shared is not None and lab.get("shared", 0) != shared:
            raise SystemExit(f"the lab in {paths.root} has {lab.get('shared', 0)} hosts on a shared environment, "
                             f"not {shared}; run ./lab/down first to change it")
        if lab is not None and with_sif_runtime and not lab.get("sif_runtime"):
            raise SystemExit(f"the lab in {paths.root} was started without --sif-runtime; run ./lab/down first")
        if lab is None:
            lab = _new_lab(paths, subnet or kinds.DEFAULT_SUBNET, login or "root", aiter or "wheel", shared or 0)
            lab["sif_runtime"] = with_sif_runtime
        paths.root.mkdir(parents=True, exist_ok=True)
        ensure_controller_paths()
        ensure_client_key(paths)
        if lab.get("login", "root") != "root":
            ensure_login_users(paths, lab["login"])
        login_user = lab["ssh"]["user"] if lab.get("login") == "user" else None
        if login_user is not None:  # its hosts see the mirror's wheels from their start, made before they start
            ensure_mirror(paths)
            user_wheels(paths)
        recorded = {host["name"]: host for host in lab["hosts"]}
        planned_hosts = kinds.plan_hosts(count, lab["subnet"], lab.get("aiter", "wheel"), lab.get("shared", 0))
        # A --shared lab: the first hosts bind the first one's venv at /opt/venv, a stand-in for an environment on
        # NFS or Lustre (a bind mount is a local disk: its locking and rename guarantees are stronger than theirs).
        shared_venv = paths.host_dir(planned_hosts[0].name) / "venv" if lab.get("shared", 0) else None
        runtime_binds = sif_runtime.install(paths) if lab.get("sif_runtime") else None

        def create(planned: kinds.PlannedHost) -> dict:
            progress(f"{planned.name}: {'restarting' if planned.name in recorded else 'creating'} "
                     f"({planned.kind.key}, {planned.address}:{kinds.PORT})")
            sharing = shared_venv if planned.shares_environment else None
            prepare_host_dir(paths, planned, login_user, sharing)
            host = start_host(paths, planned, login_user, sharing, runtime_binds)
            progress(f"{planned.name}: sshd pid {host['pid']} listening on {planned.address}:{kinds.PORT}")
            return host

        to_start = []
        for planned in planned_hosts:
            host = recorded.get(planned.name)
            if host is not None and host_alive(host):
                progress(f"{planned.name}: running (pid {host['pid']}), left alone")
            else:
                to_start.append(planned)
        # The hosts start side by side (each mostly waits: hard links, ssh-keygen, its sshd's start), after the
        # one whose venv the others bind (its start provisions it). Every host that started is recorded, even
        # when another one failed, so that `down` stops it.
        first = [planned for planned in to_start if shared_venv == paths.host_dir(planned.name) / "venv"]
        for planned in first:
            _record(paths, lab, create(planned))
        with ThreadPoolExecutor(max_workers=HOST_STARTS_AT_ONCE) as pool:
            started = [pool.submit(create, planned) for planned in to_start if planned not in first]
            failures = []
            for future in started:
                try:
                    _record(paths, lab, future.result())
                except Exception as error:
                    failures.append(error)
            if failures:
                raise failures[0]
        for extra in lab["hosts"][count:]:
            progress(f"{extra['name']}: beyond the {count} requested, left as it is (./lab/down stops all)")
        if with_slurm or lab.get("slurm"):
            _ensure_slurm(paths, lab)
        ensure_mirror(paths)
        return lab


def _ensure_slurm(paths: LabPaths, lab: dict) -> None:
    """Slurm's daemons for every lab host; restarted (clean state) when one is gone or a host was (re)started,
    since each slurmd lives in the namespaces of the host it was started for."""
    host_pids = {host["name"]: host["pid"] for host in lab["hosts"]}
    if slurm.running(lab) and lab["slurm"]["host_pids"] == host_pids:
        progress(f"slurm: running (slurmctld pid {lab['slurm']['slurmctld_pid']}), left alone")
        return
    for outcome in slurm.stop(lab):
        progress(outcome)
    try:
        slurm.start(paths, lab)
    finally:  # the pids started so far, so that `down` stops them even if a node did not come up
        save_lab(paths, lab)


def ensure_mirror(paths: LabPaths) -> None:
    if not (paths.mirror / "wheel-matrix.yaml").exists():
        progress(f"building the lab's package mirror in {paths.mirror}")
        mirror.build(paths.mirror)


def down(paths: LabPaths) -> dict:
    with lab_locked(paths):
        lab = load_lab(paths)
        if lab is None:
            if paths.root.exists():  # leftovers of an up that failed before it started any host
                shutil.rmtree(paths.root)
            progress(f"no lab recorded in {paths.state_file}; nothing to stop")
            return {"stopped": {}, "removed": str(paths.root)}
        for outcome in slurm.stop(lab):  # the slurmd live in the hosts' namespaces: they go first
            progress(outcome)
        outcomes = {}
        for host in lab["hosts"]:
            outcomes[host["name"]] = {"pid": host["pid"], "result": stop_host(host)}
            progress(f"{host['name']}: {outcomes[host['name']]['result']}")
        still_running = [host["name"] for host in lab["hosts"] if host_alive(host)]
        if still_running:
            raise SystemExit(f"hosts still running: {', '.join(still_running)}; lab state kept in {paths.root}")
        if lab["ssh"].get("users"):
            remove_login_users(lab["ssh"]["users"])
            progress(f"removed the login users {', '.join(lab['ssh']['users'].values())}")
        shutil.rmtree(paths.root)
        progress(f"removed {paths.root}")
        return {"stopped": outcomes, "removed": str(paths.root)}


def ssh_argv(lab: dict, host: dict, remote_command: str) -> list[str]:
    """An ssh command line to a lab host with the lab's key and known_hosts, host-key checking on."""
    return ["ssh", "-F", "/dev/null", "-i", lab["ssh"]["key"], "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={lab['ssh']['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", "-o", "LogLevel=ERROR",
            "-p", str(host["port"]), f"{lab['ssh']['user']}@{host['address']}", remote_command]


def _parse_probe(output: str) -> dict:
    seen: dict = {"packages": {}}
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key.startswith("package:"):
            seen["packages"][key.removeprefix("package:")] = value
        elif key:
            seen[key] = value
    return seen


def probe_host(lab: dict, host: dict) -> dict:
    row = {key: host[key] for key in ("name", "kind", "address", "port", "pid", "arch", "rocm_version")}
    row["running"] = host_alive(host)
    if not row["running"]:
        row["ssh"] = {"ok": False, "error": f"sshd pid {host['pid']} is not running"}
        return row
    result = subprocess.run(ssh_argv(lab, host, PROBE_SCRIPT), capture_output=True, text=True,
                            timeout=SSH_TIMEOUT_S * 3)
    if result.returncode != 0:
        row["ssh"] = {"ok": False, "error": (result.stderr.strip() or f"ssh exit {result.returncode}")[-500:]}
    else:
        row["ssh"] = {"ok": True, **_parse_probe(result.stdout)}
    return row


def status(paths: LabPaths) -> dict:
    lab = load_lab(paths)
    if lab is None:
        return {"up": False, "lab_dir": str(paths.root), "hosts": []}
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(pool.map(lambda host: probe_host(lab, host), lab["hosts"]))
    return {"up": all(row["running"] and row["ssh"]["ok"] for row in rows), "lab_dir": str(paths.root),
            "hosts": rows}


def _python_env_summary(seen: dict) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in seen.get("packages", {}).items())
    return f"{seen.get('python_prefix', '?')} (Python {seen.get('python', '?')}): {packages}"


def print_status(report: dict) -> None:
    if not report["hosts"]:
        print(f"lab is not up (no {report['lab_dir']}/lab.json); run ./lab/up")
        return
    header = ("NAME", "ADDRESS", "PID", "HOSTNAME(ssh)", "ROCM", "ARCH", "PYTHON ENV")
    rows = []
    for row in report["hosts"]:
        seen = row["ssh"]
        if seen["ok"]:
            rows.append((row["name"], f"{row['address']}:{row['port']}", str(row["pid"]), seen["hostname"],
                         seen["rocm_version"], seen["arch"], _python_env_summary(seen)))
        else:
            state = "running" if row["running"] else "DEAD"
            rows.append((row["name"], f"{row['address']}:{row['port']}", f"{row['pid']} ({state})",
                         f"UNREACHABLE: {seen['error']}", row["rocm_version"], row["arch"], "?"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)) + "  " + r[-1])


def print_hosts(lab: dict) -> None:
    for host in lab["hosts"]:
        print(f"{host['name']:<10} {host['address']}:{host['port']}  pid {host['pid']:<8} {host['kind']:<13} "
              f"{host['arch']}  ROCm {host['rocm_version']} (stand-in)  {host['python_env']}: "
              f"{', '.join(host['packages'])}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="start N hosts (default 3); running hosts are left alone")
    up_parser.add_argument("count", nargs="?", type=int, default=3)
    up_parser.add_argument("--subnet", help=f"first three octets of the hosts' loopback addresses "
                                            f"(default {kinds.DEFAULT_SUBNET}; fixed once the lab exists)")
    up_parser.add_argument("--login", choices=LOGINS, help="how the deploy logs in: root (default), an "
                                                        "unprivileged user with passwordless sudo (sudo), or a "
                                                        "plain user without root or sudo who owns the venv (user); "
                                                        "fixed once the lab exists")
    up_parser.add_argument("--aiter", choices=kinds.AITER_MODES, help="wheel (default): the kinds' AITER wheel; "
                                                                   "develop: every host is kind mi210-develop, its "
                                                                   "AITER a git checkout in develop mode (fixed once "
                                                                   "the lab exists)")
    up_parser.add_argument("--shared", type=int, metavar="N", help="the first N hosts (all mi210-rocm7) mount one "
                                                                "Python environment at /opt/venv, the first one's, "
                                                                "as nodes mount one on NFS (fixed once the lab "
                                                                "exists)")
    up_parser.add_argument("--slurm", action="store_true", help="also start a real Slurm: slurmctld and a slurmd "
                                                                 "in each host's namespaces (lab/slurm.py); "
                                                                 "print the SLURM_CONF to export")
    up_parser.add_argument("--sif-runtime", action="store_true", help="put the lab's stand-in for Apptainer "
                                                                       "(lab/sif_runtime.py, a test double on the "
                                                                       "kernel's squashfs and overlayfs) on every "
                                                                       "host's PATH as apptainer (fixed once the lab "
                                                                       "exists)")
    up_parser.add_argument("--json", action="store_true", help="print lab.json's content on stdout")
    down_parser = commands.add_parser("down", help="stop the recorded hosts and remove the lab's state")
    down_parser.add_argument("--json", action="store_true")
    status_parser = commands.add_parser("status", help="list the hosts, asking each over SSH who it is")
    status_parser.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args, LabPaths.default())
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as error:
        print(f"lab: {args.command} failed: {error}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, paths: LabPaths) -> int:
    if args.command == "up":
        started = time.monotonic()
        lab = up(paths, args.count, args.subnet, args.login, args.aiter, args.shared, args.slurm, args.sif_runtime)
        progress(f"up: {len(lab['hosts'])} host(s) in {time.monotonic() - started:.1f} s")
        if args.json:
            print(json.dumps(lab, indent=2))
        else:
            print_hosts(lab)
            if lab.get("slurm"):
                print(f"export SLURM_CONF={lab['slurm']['conf']}")
        return 0
    if args.command == "down":
        report = down(paths)
        if args.json:
            print(json.dumps(report, indent=2))
        return 0
    report = status(paths)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_status(report)
    return 0 if report["up"] else 1


if __name__ == "__main__":
    sys.exit(main())

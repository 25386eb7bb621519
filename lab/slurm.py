"""A real Slurm for the lab: Debian's slurmctld, one slurmd per lab host, munge, all with the lab's own paths.

Every slurmd is started inside its lab host's mount and UTS namespaces (``nsenter`` into the host's sshd), so a job
step runs "on" that host: its hostname, its /opt/rocm stand-in, its /opt/venv and /tmp. Debian's Slurm 22.05 is
built with multiple-slurmd support, which is what lets several slurmd share this machine: each node line has its
own ``Port``, ``%n`` names each node's spool, pid and log files, and every daemon stays on 127.0.0.1 (a slurmd binds
what the machine's host name resolves to; per-node loopback addresses register but steps then fail with
"Communication connection failure"). Ports are derived from the lab's subnet (so from ``CDNA2_LAB_NET``): the labs of
two checkouts never collide. Nothing is started as a service; every daemon is stopped by the pid the lab recorded.

    ./lab/up 4 --slurm        # hosts, then munged, slurmctld and a slurmd per host
    export SLURM_CONF=.lab/slurm/slurm.conf    # what up prints: the client commands' configuration
    salloc -N 4 --no-shell    # a real allocation of the lab's nodes
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from lab.labstate import LabPaths, progress, write_atomically
from lab.processes import namespace_processes, process_state, wait_gone

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
MUNGEKEY = "/usr/sbin/mungekey"
PARTITION = "lab"
# Ports of one lab: slurmctld at the base, node i's slurmd at base + 1 + i. Eight labs per CDNA2_LAB_NET (by their
# subnet's last octet), 256 nets: 20000 to 60960, below the ephemeral ports.
PORTS_PER_LAB = 20
MAX_NODES = PORTS_PER_LAB - 1
FIRST_PORT = 20000
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# A slurmd that stops answering is declared DOWN after this, and its jobs ended (the killed-slurmd test waits it).
SLURMD_TIMEOUT_S = 10


# Runs inside a lab host's namespaces. slurmd resolves the host's name to bind its port, and a lab host's name is
# known to no resolver: its own /etc/hosts (bound in its mount namespace only) names it 127.0.0.1.
SLURMD_ENTRY_SCRIPT = """set -eu
mount --bind "$1" /etc/hosts
exec "$2" -D -N "$3" -f "$4"
"""


class SlurmUnavailable(RuntimeError):
    """Debian's slurmctld, slurmd, the client commands or munge are not installed: bin/setup installs them."""


def check_installed() -> None:
    missing = [path for path in (SLURMCTLD, SLURMD, MUNGED, MUNGEKEY) if not os.access(path, os.X_OK)]
    missing += [name for name in ("srun", "salloc", "scontrol", "sinfo") if shutil.which(name) is None]
    if missing:
        raise SlurmUnavailable(f"Slurm for the lab is not installed ({', '.join(missing)} missing): run bin/setup")


def slurm_dir(paths: LabPaths) -> Path:
    return paths.root / "slurm"


def config_path(paths: LabPaths) -> Path:
    """The lab's slurm.conf: SLURM_CONF for every client command (srun, salloc, scontrol, sinfo)."""
    return slurm_dir(paths) / "slurm.conf"


def client_environment(paths: LabPaths, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for Slurm's client commands against this lab's controller, outside any allocation."""
    environment = {key: value for key, value in (os.environ if base is None else base).items()
                   if not key.startswith("SLURM_")}
    environment["SLURM_CONF"] = str(config_path(paths))
    return environment


def port_base(subnet: str) -> int:
    """The lab's first port, from its subnet (127.<CDNA2_LAB_NET's octet>.<the lab's>): checkouts side by side each
    have their own CDNA2_LAB_NET, and the labs of one checkout their own subnet, so no two bind the same port (but
    two labs of one checkout whose subnets' last octets are equal modulo 8; the start then fails on the port)."""
    _, net, lab = (int(octet) for octet in subnet.split("."))
    return FIRST_PORT + PORTS_PER_LAB * (net * 8 + lab % 8)


def _cpu_layout() -> dict[str, int]:
    """This machine's CPUs as slurmd finds them: every lab node is this machine, so each declares all of it."""
    cpus = os.cpu_count() or 1
    return {"CPUs": cpus, "Sockets": 1, "CoresPerSocket": cpus, "ThreadsPerCore": 1}


def config_text(paths: LabPaths, subnet: str, node_names: list[str]) -> str:
    root = slurm_dir(paths)
    base = port_base(subnet)
    layout = " ".join(f"{key}={value}" for key, value in _cpu_layout().items())
    lines = [
        "# slurm.conf of the simulated lab (written by lab/slurm.py): one slurmctld, a slurmd per lab host",
        "ClusterName=cdna2lab",
        f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
        f"SlurmctldPort={base}",
        f"SlurmdPort={base + 1}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        # Every daemon and srun on loopback (by default they listen on every interface).
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
        # No cgroups here: processes are tracked by their parentage; a step's processes stay in its slurmd's
        # namespaces.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "SlurmctldTimeout=10",
        "MessageTimeout=5",
        "KillWait=2",
        "InactiveLimit=0",
        "OverTimeLimit=0",
        "JobRequeue=0",
        "MinJobAge=30",
        *(f"NodeName={name} NodeAddr=127.0.0.1 Port={base + 1 + index} {layout} RealMemory=1000 State=UNKNOWN"
          for index, name in enumerate(node_names)),
        f"PartitionName={PARTITION} Nodes={','.join(node_names)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]
    return "\n".join(lines)


def _check_ports_free(base: int, nodes: int) -> None:
    for port in range(base, base + 1 + nodes):
        with socket.socket() as probe:
            # As the daemons bind: a port a stopped daemon left in TIME_WAIT is free, a listening one is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as error:
                raise RuntimeError(f"port {port} of this lab's Slurm (ports {base}-{base + nodes}, from its subnet) "
                                   f"is taken ({error.strerror}): another lab of this CDNA2_LAB_NET whose subnet's "
                                   f"last octet is equal modulo 8, or another program; give this lab another "
                                   f"--subnet") from None


def _alive(pid: int, executable: str) -> bool:
    try:
        # Debian installs the daemons as alternatives (/usr/sbin/slurmctld -> slurmctld-wlm): compare real paths.
        return (os.readlink(f"/proc/{pid}/exe") == os.path.realpath(executable)
                and process_state(pid) not in (None, "Z"))
    except OSError:
        return False


def running(lab: dict) -> bool:
    """True if the lab's recorded munged, slurmctld and every slurmd are still those daemons."""
    recorded = lab.get("slurm")
    if not recorded:
        return False
    return (_alive(recorded["munged_pid"], MUNGED) and _alive(recorded["slurmctld_pid"], SLURMCTLD)
            and all(_alive(pid, SLURMD) for pid in recorded["slurmd_pids"].values()))


def _start_munged(root: Path) -> int:
    munge = root / "munge"
    munge.mkdir(parents=True, exist_ok=True)
    munge.chmod(0o755)  # munged refuses a socket directory others may write to
    key = munge / "munge.key"
    if not key.exists():
        subprocess.run([MUNGEKEY, "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    for stale in (munge / "munge.socket", munge / "munge.socket.lock", munge / "munged.pid"):
        stale.unlink(missing_ok=True)
    subprocess.run([MUNGED, f"--socket={munge / 'munge.socket'}", f"--key-file={key}",
                    f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}", "--force"],
                   check=True, capture_output=True, timeout=30, start_new_session=True)
    return int((munge / "munged.pid").read_text())


def _daemon(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as output:
        # A session of its own, so the daemon outlives `./lab/up` and whatever shell started it.
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                start_new_session=True)


def _node_states(paths: LabPaths) -> dict[str, str]:
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30,
                            env=client_environment(paths))
    if result.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in result.stdout.splitlines() if " " in line)


def wait_idle(paths: LabPaths, node_names: list[str], processes: dict[str, subprocess.Popen] | None = None,
              timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for name, process in (processes or {}).items():
            if process.poll() is not None:
                raise RuntimeError(f"{name}: exited with {process.returncode} while starting; see "
                                   f"{slurm_dir(paths) / 'log'}")
        states = _node_states(paths)
        if all(states.get(name, "").rstrip("*") in ("idle", "mixed", "allocated") for name in node_names):
            return
        time.sleep(0.3)
    raise RuntimeError(f"Slurm nodes not idle after {timeout_s:.0f} s: {states or 'sinfo answered nothing'}; see "
                       f"{slurm_dir(paths) / 'log'}")


def start(paths: LabPaths, lab: dict) -> dict:
    """Start munged, slurmctld and one slurmd per lab host (in that host's namespaces); record their pids in
    ``lab['slurm']`` and return it. A clean controller state each time: no job of an earlier lab comes back."""
    check_installed()
    hosts = lab["hosts"]
    if len(hosts) > MAX_NODES:
        raise ValueError(f"a Slurm lab has at most {MAX_NODES} nodes (its port range), not {len(hosts)}")
    _check_ports_free(port_base(lab["subnet"]), len(hosts))
    root = slurm_dir(paths)
    shutil.rmtree(root / "state", ignore_errors=True)
    for directory in ("state", "spool", "run", "log"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    names = [host["name"] for host in hosts]
    for name in names:
        (root / "spool" / name).mkdir(exist_ok=True)
    write_atomically(config_path(paths), config_text(paths, lab["subnet"], names))
    recorded: dict = {"conf": str(config_path(paths)), "port_base": port_base(lab["subnet"]), "nodes": names,
                      "host_pids": {host["name"]: host["pid"] for host in hosts}, "slurmd_pids": {}}
    lab["slurm"] = recorded
    recorded["munged_pid"] = _start_munged(root)
    conf = str(config_path(paths))
    controller = _daemon([SLURMCTLD, "-D", "-i", "-f", conf], root / "log" / "slurmctld.start.log")
    recorded["slurmctld_pid"] = controller.pid
    processes = {"slurmctld": controller}
    for host in hosts:
        hosts_file = root / "run" / f"hosts-{host['name']}"
        write_atomically(hosts_file, f"127.0.0.1 localhost {host['name']}\n")
        # nsenter without --fork, then exec: the recorded pid is slurmd's, inside the host's namespaces.
        daemon = _daemon(["nsenter", "-t", str(host["pid"]), "-m", "-u", "--", "sh", "-c", SLURMD_ENTRY_SCRIPT, "sh",
                          str(hosts_file), SLURMD, host["name"], conf],
                         root / "log" / f"slurmd-{host['name']}.start.log")
        recorded["slurmd_pids"][host["name"]] = daemon.pid
        processes[f"slurmd {host['name']}"] = daemon
    wait_idle(paths, names, processes)
    progress(f"slurm: slurmctld pid {controller.pid} on 127.0.0.1:{recorded['port_base']}, "
             f"{len(names)} slurmd idle; SLURM_CONF={conf}")
    return recorded


def _stop(pid: int, executable: str, what: str) -> str:
    if not _alive(pid, executable):
        return f"{what}: not running"
    os.kill(pid, signal.SIGTERM)
    if not wait_gone(pid, STOP_TIMEOUT_S):
        os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, STOP_TIMEOUT_S):
            raise RuntimeError(f"{what}: pid {pid} survived SIGKILL")
        return f"{what}: killed pid {pid}"
    return f"{what}: stopped pid {pid}"


def _step_processes(slurmd_pid: int, host_pid: int) -> list[int]:
    """What runs in a slurmd's host namespaces but the host's sshd: its slurmstepd and their tasks, which outlive
    a stopped slurmd."""
    if not _alive(slurmd_pid, SLURMD):
        return []
    return [pid for pid in namespace_processes(slurmd_pid) if pid != host_pid]


def stop(lab: dict) -> list[str]:
    """Stop the recorded daemons: every slurmd first (with the steps still running on its node), then slurmctld,
    munged last."""
    recorded = lab.get("slurm")
    if not recorded:
        return []
    outcomes = []
    for name, pid in recorded["slurmd_pids"].items():
        steps = _step_processes(pid, recorded["host_pids"][name])
        outcomes.append(_stop(pid, SLURMD, f"slurmd {name}"))
        for step in steps:
            try:
                os.kill(step, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if steps:
            outcomes.append(f"slurmd {name}: killed {len(steps)} process(es) of its job steps")
    if "slurmctld_pid" in recorded:
        outcomes.append(_stop(recorded["slurmctld_pid"], SLURMCTLD, "slurmctld"))
    if "munged_pid" in recorded:
        outcomes.append(_stop(recorded["munged_pid"], MUNGED, "munged"))
    return outcomes

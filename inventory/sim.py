"""THE SIMULATED TEST LAB, not a real cluster: your own hosts go in inventory/lab.py.

pyinfra inventory of the simulated lab (docs/maintainers/test-lab.md), read from .lab/lab.json (or
$CDNA2_LAB_DIR/lab.json); the lab's hosts are sshd processes on this machine with stand-in GPUs and ROCm.

Groups: ``mi210`` (gfx90a hosts) and ``mi300x`` (gfx942 hosts). Every host is reached over real SSH with the lab's
own key and known_hosts, host-key checking on. Bring the lab up first: ``./lab/up``.
"""

import sys
from pathlib import Path

from pyinfra.api.exceptions import InventoryError

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # pyinfra executes this file without the repository on sys.path
    sys.path.insert(0, str(_REPO))

from lab.hosts import USER_WHEELS  # noqa: E402 (needs the path set above)
from lab.labctl import host_alive  # noqa: E402
from lab.labstate import LabPaths, load_lab  # noqa: E402

_GROUPS = ("mi210", "mi300x")


def _lab_hosts() -> tuple[dict, list[dict]]:
    paths = LabPaths.default()
    lab = load_lab(paths)
    if lab is None or not lab["hosts"]:
        raise InventoryError(f"the simulated lab is not up (no hosts in {paths.state_file}): run ./lab/up")
    dead = [f"{host['name']} (pid {host['pid']})" for host in lab["hosts"] if not host_alive(host)]
    if dead:
        raise InventoryError(f"lab hosts not running: {', '.join(dead)}: run ./lab/up to restart them")
    unknown = sorted({host["group"] for host in lab["hosts"]} - set(_GROUPS))
    if unknown:
        raise InventoryError(f"{paths.state_file} has hosts in groups {unknown} this inventory does not know")
    return lab, lab["hosts"]


def _host_data(lab: dict, host: dict) -> dict:
    return {
        "ssh_hostname": host["address"],
        "ssh_port": host["port"],
        "ssh_user": lab["ssh"]["user"],
        # A --login sudo lab: an unprivileged login, every command through sudo (as inventory/lab.py documents). A
        # --login user lab: a plain user, no sudo; the state directory is then that user's XDG one (state_dir unset).
        **({"_sudo": True} if lab["ssh"].get("sudo") else {}),
        "ssh_key": lab["ssh"]["key"],
        "ssh_known_hosts_file": lab["ssh"]["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        # The lab's own package mirror (lab/mirror.py): its matrix covers the lab's stand-in ROCm versions and pip
        # installs from its find-links directory only (lab hosts see the controller's filesystem there).
        "wheel_matrix": str(Path(lab["lab_dir"]) / "mirror" / "wheel-matrix.yaml"),
        # A --login user lab's hosts read the wheels at USER_WHEELS (the mirror lies below root's home).
        "wheel_find_links": (USER_WHEELS if lab.get("login") == "user"
                             else str(Path(lab["lab_dir"]) / "mirror" / "wheels")),
        # The lab's GPUs are stand-ins (a scripted rocminfo, no device, no ROCm torch): on a gfx90a host the GPU
        # checks would fail, rightly, so they are declared off here and the report says so.
        "smoke_gpu_checks": False,
        # A --shared lab's hosts whose /opt/venv is the one shared directory (a bind mount standing in for NFS).
        **({"shared_environment": True} if host.get("shared_environment") else {}),
    }


_lab, _hosts = _lab_hosts()
mi210 = [(host["name"], _host_data(_lab, host)) for host in _hosts if host["group"] == "mi210"]
mi300x = [(host["name"], _host_data(_lab, host)) for host in _hosts if host["group"] == "mi300x"]

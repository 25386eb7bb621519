"""Provision MI210 (gfx90a) nodes so that AITER, and vLLM on top of it, serve from the hand-written ASM kernels.

    pyinfra inventory/lab.py deploy.py          # preview with --dry, apply with -y

The play, top to bottom: validate every host's data, probe each host once, then install and pin the wheels,
install translated kernels, patch the arch gates and prove the result, and finally write the cluster report.
pyinfra runs this file once per host; every decision below is taken from that host's probe.
"""

# pyinfra runs this module as a file, not as a package module: imports are absolute from the repository root.
from pyinfra import host, inventory, state

from operations.facts import HostProbe
from operations.preflight import validate_inventory
from operations.report import RunRecorder

from cdna2.report import summarise_probe

report = RunRecorder.install(state, mode="deploy").report

# 1. Validate the data of every host first: one misspelt key anywhere and no host is touched.
validate_inventory(inventory)
report.step(host.name, "validate", "ok")

# 2. Probe the host once (one SSH round trip); every later step decides from this snapshot.
probe = host.get_fact(
    HostProbe,
    target_python=host.data.target_python,
    rocm_root=host.data.rocm_root,
    state_dir=host.data.state_dir,
)
summarise_probe(report.host(host.name), probe)
report.step(host.name, "probe", "ok", f"{probe['gpu']['arch'] or 'no GPU agent'}, ROCm {probe['rocm']['version']}")

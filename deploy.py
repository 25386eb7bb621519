"""Provision MI210 (gfx90a) nodes so that AITER, and vLLM on top of it, serve from the hand-written ASM kernels.

    pyinfra inventory/lab.py deploy.py --dry    # preview every change
    pyinfra -y inventory/lab.py deploy.py       # apply

The play, top to bottom: validate every host's data, probe each host once, install this tool's host agent, then
install and pin the wheels, install the translated kernels, patch the arch gates and prove the result; the cluster
report is written when the run ends. pyinfra runs this file once per host; every decision below is taken from
that host's probe.
"""

# pyinfra runs this module as a file, not as a package module: imports are absolute from the repository root.
from pyinfra import host, inventory, state
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from cdna2.agent import agent_dir
from cdna2.plan import FAIL, PROCEED, kernels_decision, target_env_error
from cdna2.report import FAILED, PLANNED, SKIPPED, UNCHANGED, summarise_probe
from operations.agent import agent_installed, current_agent_bundle
from operations.facts import HostProbe
from operations.kernels import translated_kernels, translated_tree_for
from operations.preflight import validate_inventory
from operations.report import RunRecorder

report = RunRecorder.install(state, mode="deploy").report
data = host.data

# 1. Validate the data of every host first: one misspelt key anywhere and no host is touched.
validate_inventory(inventory)
report.step(host.name, "validate", "ok")

# 2. Probe the host once (one SSH round trip); every later step decides from this snapshot.
probe = host.get_fact(HostProbe, target_python=data.target_python, rocm_root=data.rocm_root,
                      state_dir=data.state_dir, agent_dir=agent_dir(data.state_dir))
summarise_probe(report.host(host.name), probe)
env_error = target_env_error(probe)

if env_error:
    report.step(host.name, "probe", FAILED, env_error)
    python.raise_exception(name="probe: the target Python environment exists", exception=OperationError,
                           message=f"{host.name}: {env_error}")
else:
    report.step(host.name, "probe", "ok", f"{probe['gpu']['arch'] or 'no GPU agent'}, ROCm {probe['rocm']['version']}")

    # 3. The host agent first: the later steps run their on-host halves from it.
    bundle = current_agent_bundle()
    agent_installed(name="agent: host-side modules are current", bundle=bundle, state_dir=data.state_dir,
                    installed_digest=probe["agent"]["digest"])

    # 4. Kernels: translated on the controller once per distinct gfx942 tree, swapped in atomically on the host.
    decision, why = kernels_decision(probe, data.translate_kernels)
    if decision == PROCEED:
        tree = translated_tree_for(host, probe)
        installed = probe["aiter"]["gfx90a_digest"]
        report.step(host.name, "kernels", UNCHANGED if installed == tree.digest else PLANNED,
                    f"{tree.kernels} kernels, tree {tree.digest[:12]}")
        translated_kernels(name="kernels: hsa/gfx90a holds the translated tree", tree=tree,
                           hsa_root=probe["aiter"]["hsa_root"], installed_digest=installed,
                           target_python=data.target_python, state_dir=data.state_dir)
    elif decision == FAIL:
        report.step(host.name, "kernels", FAILED, why)
        python.raise_exception(name="kernels: the host can take translated kernels", exception=OperationError,
                               message=f"{host.name}: {why}")
    else:
        report.step(host.name, "kernels", SKIPPED, why)

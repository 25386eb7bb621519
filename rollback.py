"""Roll every host back to stock AITER and vLLM: the deploy's changes undone, proven against RECORD.

    pyinfra inventory/lab.py rollback.py --dry    # preview what each host would lose
    pyinfra -y inventory/lab.py rollback.py       # roll back

Per host: restore the pristine originals of every patched file, remove hsa/gfx90a (and its previous copy) and
the JIT outputs built from patched inputs, reinstall the pre-deploy triton when `rollback_restore_triton` is set,
and empty the tool's state directory; then check every AITER and vLLM file against its RECORD. A host that was
never provisioned, or only half, gets only what it needs; a second rollback changes nothing.
"""

if __name__ == "__main__":  # `python rollback.py`: say what this file is instead of pyinfra's traceback
    from cdna2.deploy_file import refuse_direct_run
    refuse_direct_run(__file__)


import os

from pyinfra import host, inventory, state

from cdna2.host.probe import SHARED_SOURCE
from cdna2.login import write_access_refusal
from cdna2.plan import sudo_refusal, target_env_error, with_data_arch
from cdna2.reports.run import FAILED, PLANNED, UNCHANGED, summarise_probe
from cdna2.rollback import RollbackPlan, plan_rollback
from cdna2.shared_environments import shared_environment_refusal
from cdna2.translated import load_adaptations
from cdna2.wheels import WheelPlanError, load_matrix, triton_restore_action
from operations.agent import agent_installed, current_agent_bundle
from operations.facts import host_probe
from operations.images import is_container_target
from operations.preflight import environment_claimed_by, probe_announced, validate_inventory
from operations.report import RunRecorder
from operations.rollback import rolled_back, stock_files_verified

report = RunRecorder.install(state, mode="rollback").report
data = host.data
PACKAGES = ["amd-aiter", "vllm"]

# 1. Validate every host's data before touching any.
validate_inventory(inventory)

# 2. Probe: what this host holds of the deploy's work.
probe = probe_announced(inventory, host.name, lambda: host_probe(
    host, data.state_dir, target_python=data.target_python, rocm_root=data.rocm_root))
# The report's arch for an image built without a GPU.
probe, _ = with_data_arch(probe, data.gpu_arch, is_container_target(host))
summarise_probe(report.host(host.name), probe)
env_error = target_env_error(probe)
state_dir = probe["state_dir"]["path"]  # host data's, else the login's default (cdna2/login.py)
kernel_jit = sorted({pattern for adaptation in load_adaptations() for pattern in adaptation["invalidates"]})
shared_dir = os.path.dirname(state_dir) if probe["state_dir"]["source"] == SHARED_SOURCE else None
plan = plan_rollback(probe, probe["state_dir_used"], data.rollback_restore_triton, kernel_jit, shared_dir)
rolled_back_by = None
if env_error and (not plan.empty or sudo_refusal(probe)):  # unprivileged, the probe may miss what there is to undo
    plan.problems.append(env_error)
elif not plan.empty and write_access_refusal(probe):  # found before anything is undone, by path
    plan.problems.append(write_access_refusal(probe))
elif writer := environment_claimed_by(inventory, host.name):
    # A shared environment is rolled back once, by its first host; with shared_environment set, the others only
    # check its files against RECORD afterwards, through their own mounts.
    if shared := shared_environment_refusal(probe, writer, data.shared_environment):
        plan.problems.append(shared)
    else:
        plan, rolled_back_by = RollbackPlan(), writer

# 3. The pip action that restores triton, from the same sources the deploy used.
triton = None
if plan.restore_triton:
    try:
        triton = triton_restore_action(load_matrix(data.wheel_matrix), probe, plan.restore_triton,
                                       index_url=data.wheel_index_url, find_links=data.wheel_find_links)
    except WheelPlanError as error:
        plan.problems.append(str(error))

status = FAILED if plan.problems else (UNCHANGED if plan.empty else PLANNED)
report.step(host.name, "rollback", status, "; ".join(plan.problems or plan.describe()) or (
    f"rolled back once, by {rolled_back_by} (shared environment {probe['python']['prefix']})" if rolled_back_by
    else "nothing to undo"))

# 4. Undo, then prove: the agent in the state dir runs the undo steps and is removed with it.
if not (plan.empty or plan.problems):
    agent_installed(name="agent: host-side modules are current", bundle=current_agent_bundle(),
                    state_dir=state_dir, installed_digest=probe["agent"]["digest"],
                    target_python=data.target_python)
rolled_back(name="rollback: AITER and vLLM are stock again", plan=plan, triton=triton,
            target_python=data.target_python, state_dir=state_dir)
if not env_error:
    stock_files_verified(name="record: every AITER and vLLM file matches RECORD", report=report,
                         packages=PACKAGES, target_python=data.target_python, rocm_root=data.rocm_root,
                         state_dir=state_dir,
                         patched={package: list(backup["files"]) for package, backup in probe["backups"].items()})

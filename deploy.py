"""Provision MI210 (gfx90a) nodes so that AITER, and vLLM on top of it, serve from the hand-written ASM kernels.

    pyinfra inventory/lab.py deploy.py --dry    # preview every change, patches as diffs
    pyinfra -y inventory/lab.py deploy.py       # apply

The play, top to bottom: validate every host's data and this tool's own data files, probe each host once,
install the host agent, then install and pin the wheels, install the translated kernels and patch the arch
gates; the cluster report is written when the run ends. pyinfra runs this file once per host; every decision
below is taken from that host's probe.
"""

if __name__ == "__main__":  # `python deploy.py`: say what this file is instead of pyinfra's traceback
    from cdna2.deploy_file import refuse_direct_run
    refuse_direct_run(__file__)


# pyinfra runs this module as a file, not as a package module: imports are absolute from the repository root.
from pyinfra import host, inventory, state
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from cdna2.bench import deploy_skip_reason, host_cases, load_cases
from cdna2.families import keep_refusal
from cdna2.fp8_configs import PLAN_NAME as CONFIGS_PLAN, installed_hashes, plan_configs, with_config_targets
from cdna2.kernels import Policy as KernelPolicy
from cdna2.login import write_access_refusal
from cdna2.patches import plan_package_once
from cdna2.patches.contents import known_hashes
from cdna2.patches.releases import refused_release
from cdna2.plan import (FAIL, PROCEED, SKIP, arch_skip_reason, data_arch_refusal, deployed_record, develop_checkout,
                        disk_space_problem, hidden_gpu_refusal, installed_kernel_digest, installed_versions,
                        kernels_decision, target_env_error, with_data_arch)
from cdna2.probe_memo import record_memo, remember_records
from cdna2.reports.run import FAILED, PLANNED, SKIPPED, UNCHANGED, plan_step_status, summarise_probe
from cdna2.smoke_proof import window_record_action
from cdna2.shared_environments import CHECKER, WRITER, checker_expectation, role_summary, shared_environment_refusal
from cdna2.triton.hosts import SET as TRITON_SET, opened_ops_refusal
from cdna2.wheels import WheelPlanError
from operations.agent import RUN, agent_installed, current_agent_bundle
from operations.bench import BenchRecorder, benchmarked
from operations.facts import host_probe
from operations.images import is_container_target
from operations.kernels import translated_kernels, translated_tree_or_refusal
from operations.patches import absent_dirs, patched_package, probe_files, transaction_finished
from operations.preflight import (environment_claimed_by, environment_identity, fp8_configs_of, load_data_files,
                                  probe_announced, release_data, validate_inventory)
from operations.report import RunRecorder
from operations.shared import environment_checked, environment_claimed
from operations.smoke import recorded_proof, report_families, reused_proof_summary, smoke_passed
from operations.state import record_needed, recorded
from operations.triton import triton_proof_or_refusal
from operations.wheels import packages as wheel_packages

report = RunRecorder.install(state, mode="deploy").report
data = host.data

# 1. Validate first: every host's data, then the patch sets and the wheel matrix. One error anywhere and no host
#    is touched.
validate_inventory(inventory)
catalog, wheel_plan_for = load_data_files(data)
releases = release_data()
fp8_configs = fp8_configs_of(data)
bench_plan = load_cases() if data.bench_on_deploy else None
report.step(host.name, "validate", "ok")

# 2. Probe the host once (one SSH round trip); every later step decides from this snapshot.
probe = probe_announced(inventory, host.name, lambda: host_probe(
    host, data.state_dir, target_python=data.target_python, rocm_root=data.rocm_root,
    patch_files=with_config_targets({package: catalog.target_files(package) for package in catalog.packages()},
                                    fp8_configs),
    known_contents=known_hashes(), record_memo=record_memo(host.name),
    triton_sources=TRITON_SET in data.optional_patch_sets))
remember_records(host.name, probe)
# The tool's directory on this host: host data's state_dir, else the login's default the probe found there
# (/var/lib/cdna2 for root, the XDG state directory of an unprivileged login); for a shared_environment host, the
# environment's own (<prefix>/.cdna2/state). Nothing outside it and the Python environment is written.
state_dir = probe["state_dir"]["path"]
# An image is built without a GPU: its arch comes from data (gpu_arch) and the GPU checks say why they cannot run.
# Only a container target may have no GPU: any other host showing none with gpu_arch set, or with gfx90a GPUs on its
# PCI bus, is refused below (a broken GPU must not pass for no GPU).
container = is_container_target(host)
arch_refusal = hidden_gpu_refusal(probe, container) or data_arch_refusal(probe, data.gpu_arch, container)
probe, no_gpu_reason = with_data_arch(probe, data.gpu_arch, container)
summarise_probe(report.host(host.name), probe)
report.host(host.name).left_alone = arch_skip_reason(probe)
env_error = target_env_error(probe)
# Plan wheels and kernels now: a host they cannot serve (a ROCm the matrix lacks, no room for the kernel tree) is
# failed before anything on it changes.
wheel_plan = wheel_plan_for(probe) if data.install_wheels and not env_error else None
actions = getattr(wheel_plan, "actions", ())
# Packages this run's wheels step replaces are patched (and AITER translated) from what the probe saw before: next run.
reinstalled = sorted({action.package for action in actions} & set(catalog.packages()))
requirements = [action.requirement for action in actions]
kernels, why = (kernels_decision(probe, data.translate_kernels, installs_aiter="amd-aiter" in reinstalled)
                if not env_error else (SKIP, env_error))
kernel_policy = KernelPolicy.of_host_data(data)
tree, translation_error = (translated_tree_or_refusal(host, probe, kernel_policy)
                           if kernels == PROCEED and "amd-aiter" not in reinstalled else (None, None))
wheel_error = str(wheel_plan) if isinstance(wheel_plan, WheelPlanError) else None
# Families the smoke step withheld from the tree (cdna2/host/families.py) leave it as installed for this comparison.
installed_digest = installed_kernel_digest(probe, data.smoke_keep_unproven_families)
needs_upload = tree is not None and installed_digest != tree.digest
space_error = disk_space_problem(probe, tree.archive.stat().st_size, tree.tree_bytes) if needs_upload else None
# A login that may not write where the run must (a read-only environment, a directory of another owner) is
# refused here, by path, before anything changes.
write_error = None if env_error else write_access_refusal(probe)
# One environment seen by several hosts (a shared filesystem) is written by the first of them in inventory order
# (writer None: this host). With shared_environment set on both, this host checks it after the writer and tests its
# own GPUs; else it is refused.
writer = environment_claimed_by(inventory, host.name)
writes = writer is None
shared_error = shared_environment_refusal(probe, writer, data.shared_environment and bool(writer) and
                                          inventory.get_host(writer).data.shared_environment)
# A release refused by name (cdna2/data/releases.yaml) is refused here, before anything changes.
release_error = refused_release(releases, probe["distributions"])
# The patch plans too, from the probe: a package whose sets cannot be planned on the text installed (a release no
# variant was written for whose text moved, a file edited outside our sites) fails the host here, before anything
# on it changes, not after its wheels and kernels. A package this run's wheels step replaces is planned next run.
skip_patches = (arch_skip_reason(probe) or (None if data.apply_patches else "apply_patches is off for this host"))
patch_plans = {} if env_error or skip_patches else {
    package: plan_package_once(catalog, package, found["version"], *probe_files(probe, package),
                               data.optional_patch_sets, checkout=develop_checkout(found),
                               absent_dirs=absent_dirs(probe, package))
    for package in catalog.packages() for found in [probe["distributions"].get(package)]
    if found is not None and package not in reinstalled}
patch_error = "; ".join(f"patches {package}: {'; '.join(plan.reasons)}" for package, plan in patch_plans.items()
                        if plan_step_status(plan.status) == FAILED) or None
# A set requiring one of another package (vLLM's Triton gate, AITER's Triton configs) needs both in host data, on a
# host whose packages are patched.
requires_error = "; ".join(f"optional_patch_sets: {unmet}: add it to this host's optional_patch_sets, or remove the "
                           f"set that requires it" for unmet in catalog.unmet_requirements(data.optional_patch_sets)
                           if patch_plans) or None
# AITER's Triton configs hold for the host's own Triton tree and triton where the controller's compile proof of that
# tree (once per distinct tree and triton per run; committed or cached where it can be) derives exactly them.
triton_proof, triton_error = triton_proof_or_refusal(host, probe, catalog, patch_plans.get("amd-aiter"), requirements)
# A vLLM site opening an op whose kernels (their config chosen in code) failed that proof refuses its set.
triton_error = triton_error or opened_ops_refusal(host.name, triton_proof, catalog, patch_plans.get("vllm"))
problem = (env_error or write_error or shared_error or arch_refusal or release_error or requires_error or patch_error
           or triton_error or wheel_error or translation_error or space_error
           or keep_refusal(data.smoke_keep_unproven_families))

if problem:
    report.step(host.name, "preflight", FAILED, problem)
    # The message goes to the exception positionally: OperationError takes no keyword arguments.
    python.raise_exception(OperationError, f"{host.name}: {problem}; nothing on it was changed",
                           name="preflight: the host can be provisioned")
else:
    arch = probe["gpu"]["arch"] or "no GPU agent"
    identity = environment_identity(inventory, probe) if data.shared_environment else None
    if identity:
        report.host(host.name).details["shared_environment"] = role_summary(
            WRITER if writes else CHECKER, writer or host.name, probe, identity)
    by_writer = f"written by {writer} (shared environment {probe['python']['prefix']})"
    # What this run changes in the environment (step names; the patch plans with their site-packages apart): a host
    # that shares it and does not write it plans the same from the same files, issues none of it, and checks the
    # writer's result instead.
    env_changes, changed_plans = [], []
    report.step(host.name, "probe", "ok", f"{arch} ({no_gpu_reason}), ROCm {probe['rocm']['version']}" if no_gpu_reason
                else f"{arch}, ROCm {probe['rocm']['version']}")

    # From here on, an operation is issued only where the probe shows work for it: a host that already holds
    # what this run would give it gets no operation at all (pyinfra's per-operation cost is paid per host).

    # 3. The host agent first: the later steps run their on-host halves from it.
    agent = current_agent_bundle()
    if probe["agent"]["digest"] != agent.digest and (writes or not data.shared_environment):
        agent_installed(name="agent: host-side modules are current", bundle=agent, state_dir=state_dir,
                        installed_digest=probe["agent"]["digest"], target_python=data.target_python)

    # What the host had before the first deploy: rollback restores triton from it.
    baseline = installed_versions(probe)
    if writes and record_needed("baseline", baseline, probe["state"], once=True):
        recorded(name="state: the pre-deploy baseline is recorded", key="baseline", value=baseline,
                 current_state=probe["state"], target_python=data.target_python, state_dir=state_dir, once=True)

    # 4. Wheels before kernels and patches: those work on the AITER and vLLM that end up installed.
    if wheel_plan is None:
        report.step(host.name, "wheels", SKIPPED, "install_wheels is off for this host")
    else:
        report.step(host.name, "wheels", PLANNED if actions else UNCHANGED, "; ".join(requirements) or "as planned")
        report.host(host.name).package_changes(requirements)
        env_changes += ["wheels"] if actions else []
        if actions and writes:
            wheel_packages(name="wheels: ROCm-matched wheels, triton 3.7.1 last", plan=wheel_plan,
                           state_dir=state_dir)

    # The probe describes the packages found before this run; one the wheels step replaces is handled next run.
    stale = f"{', '.join(reinstalled)} (re)installed by this run: run the deploy again to translate and patch"

    # 5. Kernels: translated on the controller once per distinct gfx942 tree, swapped in atomically on the host.
    if tree is not None:
        report.step(host.name, "kernels", PLANNED if needs_upload else UNCHANGED,
                    f"{tree.kernels} kernels, tree {tree.digest[:12]}; {tree.hazard_summary()}")
        report.host(host.name).details["kernels"] = tree.report_details()
        if tree.hazard_policy == "permissive":
            report.host(host.name).notes.append(
                f"kernel_hazard_policy permissive: {tree.hazard_verdicts['short-straight-line']} kernels short of "
                "gfx90a's MFMA wait states in straight-line code are installed")
        env_changes += ["kernels"] if needs_upload else []
        if needs_upload and writes:
            translated_kernels(name="kernels: hsa/gfx90a holds the translated tree", tree=tree,
                               hsa_root=probe["aiter"]["hsa_root"], installed_digest=installed_digest,
                               site_packages=probe["distributions"]["amd-aiter"]["location"],
                               target_python=data.target_python, state_dir=state_dir)
    elif kernels == FAIL:
        report.step(host.name, "kernels", FAILED, why)
        python.raise_exception(OperationError, f"{host.name}: {why}",
                               name="kernels: the host can take translated kernels")
    else:
        report.step(host.name, "kernels", SKIPPED, stale if kernels == PROCEED else why)

    # 6. Patches: per package, the sets that match the installed text, all or nothing (planned before the preflight).
    patch_sets = {}
    for package in host.loop(catalog.packages()):
        found = probe["distributions"].get(package)
        if found is None:
            continue
        step = f"patches {package}"
        if skip_patches or package in reinstalled:
            report.step(host.name, step, SKIPPED, skip_patches or stale)
            continue
        plan = patch_plans[package]
        report.host(host.name).details[step] = plan.to_json()
        if package == "amd-aiter" and triton_proof:
            report.host(host.name).details["triton proof"] = {
                key: triton_proof[key] for key in ("triton", "tree_digest", "host", "source", "seconds", "reused")}
        patch_sets[package] = plan.sets
        status = plan_step_status(plan.status)
        report.step(host.name, step, status, ", ".join(f"{name} (variant {plan.variants[name]})" for name in plan.sets)
                    or "; ".join(plan.reasons))
        report.host(host.name).notes.extend(f"{step}: {note}" for note in
                                            plan.notes + list(plan.declined.values()) + [f"audit: {finding}" for
                                                                                         finding in plan.audit])
        if status != UNCHANGED:
            env_changes.append(step)
            changed_plans.append((found["location"], plan))
        if status != UNCHANGED and writes:  # to apply (a plan that cannot be made failed the host in preflight)
            patched_package(name=f"{step}: arch gates open for gfx90a", plan=plan, site_packages=found["location"],
                            target_python=data.target_python, state_dir=state_dir)
        # Patched already, but by a transaction killed before it dropped its journal: finish it (an apply would).
        journalled = (probe["backups"].get(package) or {}).get("journal") and status == UNCHANGED
        if journalled:
            report.step(host.name, step, PLANNED, f"finish the transaction journalled in "
                                                  f"{probe['backups'][package]['backup_dir']}")
            env_changes.append(f"{step} journal")
        if journalled and writes:
            transaction_finished(name=f"{step}: an interrupted transaction is finished",
                                 backup_dir=probe["backups"][package]["backup_dir"],
                                 target_python=data.target_python, state_dir=state_dir)

    # 6b. Tuned MI210 block-FP8 configs (fp8_block_configs) into vLLM's config directory, written like patches.
    if fp8_configs and "vllm" in patch_sets:
        files, _ = probe_files(probe, "vllm")
        plan = plan_configs(fp8_configs, files, (probe["backups"].get(CONFIGS_PLAN) or {}).get("files", {}))
        status = plan_step_status(plan.status)
        report.step(host.name, "fp8 configs", status, "; ".join(plan.reasons) or f"{len(fp8_configs)} files")
        if status != UNCHANGED:
            env_changes.append("fp8 configs")
            changed_plans.append((probe["distributions"]["vllm"]["location"], plan))
        if status != UNCHANGED and writes:
            patched_package(name="fp8 configs: vLLM has the tuned MI210 block-FP8 configs", plan=plan,
                            site_packages=probe["distributions"]["vllm"]["location"],
                            target_python=data.target_python, state_dir=state_dir)

    # 6c. A shared environment: its writer marks it as written by this run (and gives it its identity, once); every
    #     other host of it, once the writer is done, checks through its own mount that it holds what the plan leaves.
    if identity and env_changes:
        environment_claimed(name="shared environment: this run writes it", writer=writer, identity_id=identity,
                            prefix=probe["python"]["prefix"], target_python=data.target_python, state_dir=state_dir)
        if not writes:
            report.host(host.name).hand_over(by_writer)
            report.step(host.name, "shared environment", PLANNED, by_writer)
            kernels_left = tree and {"hsa_root": probe["aiter"]["hsa_root"], "digest": tree.digest}
            environment_checked(name="shared environment: the writer's result is here", writer=writer,
                                expectation=checker_expectation((probe["python"]["identity"] or {}).get("id"), writer,
                                                                RUN, kernels_left, changed_plans),
                                prefix=probe["python"]["prefix"], target_python=data.target_python,
                                state_dir=state_dir)

    # 7. Prove it on gfx90a hosts, once per state they are left in. The smoke test is told the arch the probe saw:
    #    on a gfx90a host a GPU that cannot be used fails it (and no pass is recorded); never "passed" without one.
    deployed = deployed_record(probe, requirements, tree and tree.digest, patch_sets,
                               tree and kernel_policy.record(tree.hazard_audit_version),
                               installed_hashes(fp8_configs) if "vllm" in patch_sets else None)
    if data.smoke_keep_unproven_families:  # what a pass proves depends on it: families it keeps are not withheld
        deployed["kept_families"] = sorted(data.smoke_keep_unproven_families)
    gpu_checks = data.smoke_gpu_checks and not no_gpu_reason  # whether GPU checks can run: part of what a pass proves
    if not data.smoke_tests:
        report.step(host.name, "smoke", SKIPPED, "smoke_tests is off for this host")
    elif skip_patches or reinstalled:
        report.step(host.name, "smoke", SKIPPED, skip_patches or stale)
    elif not state.ops[host] and (proof := recorded_proof(deployed, gpu_checks, probe["state"])):
        # No operation changes the host this run: the pass recorded for this very state still proves it.
        report.step(host.name, "smoke", "ok", reused_proof_summary(proof))
        report_families(report, host.name, proof.get("families"))
    else:
        smoke_passed(name="smoke: the host proves the gfx90a ASM path", report=report, deployed=deployed,
                     current_state=probe["state"],
                     site_packages=probe["distributions"]["amd-aiter"]["location"],
                     target_python=data.target_python, state_dir=state_dir, host_arch=probe["gpu"]["arch"],
                     gpu_checks=gpu_checks, no_gpu_reason=no_gpu_reason, hsa_root=probe["aiter"]["hsa_root"],
                     keep_families=data.smoke_keep_unproven_families,
                     window_record=window_record_action(patch_sets, bool(data.shared_environment), writes),
                     vllm_site_packages=(probe["distributions"].get("vllm") or {}).get("location"))

    # 8. Record what the host now holds, for verify.py and rollback.py (not when a package of this run is stale).
    if writes and not reinstalled and record_needed("deployed", deployed, probe["state"]):
        recorded(name="state: the deployed state is recorded", key="deployed", value=deployed,
                 current_state=probe["state"], target_python=data.target_python, state_dir=state_dir)

    # 9. Benchmarks, only where the host data asks (bench_on_deploy; bench.py runs them on demand): after the smoke
    #    step, which must have passed in this run with its GPU checks, so that a figure is the proven ASM path's.
    if bench_plan is not None:
        benchmarked(name="bench: the host's figures are measured",
                    bench=BenchRecorder.install(state, bench_plan, on_deploy=True).report, report=report,
                    skip_reason=deploy_skip_reason(probe["gpu"]["arch"], gpu_checks, reinstalled),
                    cases=host_cases(bench_plan["cases"], deployed),
                    site_packages=(probe["distributions"].get("amd-aiter") or {}).get("location"),
                    target_python=data.target_python, state_dir=state_dir, host_arch=probe["gpu"]["arch"],
                    after_smoke_step=True)

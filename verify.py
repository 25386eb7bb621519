"""Report drift on every host, read-only: exit non-zero when any host is not as the last deploy left it.

    pyinfra -y inventory/lab.py verify.py

Per host, a fresh probe (with every AITER and vLLM file compared to its RECORD) is compared with the `deployed`
record the deploy wrote there: AITER, vLLM, torch or triton upgraded or replaced underneath us, a patch lost or a
patched file edited, kernels missing or altered, or made under another kernel policy (kernel_hazard_policy,
pad_mfma_hazards, int8_k32_split) or MFMA wait-state audit version than the host's data and this tool give now; and
gfx90a GPUs on the PCI bus that neither rocminfo nor the KFD topology lists any more (their driver failed). Nothing
on any host changes; run the deploy to repair (a failed driver first).

A node whose data names ``sif_image`` runs a Singularity/Apptainer image with the layer ``python -m cdna2.images
deploy`` wrote beside it: there the smoke test, GPU checks included, runs inside the node's ``singularity`` or
``apptainer`` with that layer, and the report names the runtime, its version and both files' SHA-256.
"""

if __name__ == "__main__":  # `python verify.py`: say what this file is instead of pyinfra's traceback
    from cdna2.deploy_file import refuse_direct_run
    refuse_direct_run(__file__)


from pyinfra import host, inventory, state

from cdna2.drift import checkout_changes, find_drift
from cdna2.host.checkouts import checkout_path
from cdna2.host.families import verdict_line
from cdna2.fp8_configs import with_config_targets
from cdna2.kernels import Policy as KernelPolicy
from cdna2.patches import plan_package_once
from cdna2.patches.contents import known_hashes
from cdna2.plan import develop_checkout, hidden_gpu_refusal, sudo_refusal, with_data_arch
from cdna2.reports.run import FAILED, summarise_probe
from operations.facts import host_probe
from operations.images import is_container_target
from operations.patches import probe_files
from operations.preflight import fp8_configs_of, load_data_files, validate_inventory
from operations.report import RunRecorder
from operations.smoke import report_families, smoke_passed_inside_image
from operations.verify import drift_free

report = RunRecorder.install(state, mode="verify").report
data = host.data

validate_inventory(inventory)
catalog, _ = load_data_files(data)

probe = host_probe(host, data.state_dir, target_python=data.target_python, rocm_root=data.rocm_root,
                   patch_files=with_config_targets({package: catalog.target_files(package)
                                                    for package in catalog.packages()}, fp8_configs_of(data)),
                   record_check=catalog.packages(), known_contents=known_hashes())
container = is_container_target(host)
# gfx90a GPUs on the PCI bus without an agent (a driver that failed since the deploy): not as deployed, files or not.
hidden_gpu = hidden_gpu_refusal(probe, container)
# The report's arch for an image built without a GPU.
probe, _ = with_data_arch(probe, data.gpu_arch, container)
summarise_probe(report.host(host.name), probe)

if data.sif_image:
    # The node runs an image with its layer: what was deployed lives there, and is checked inside the runtime.
    smoke_passed_inside_image(name="verify: the image's smoke test passes inside its runtime", report=report,
                              image=data.sif_image, host_arch=probe["gpu"]["arch"],
                              gpu_checks=data.smoke_gpu_checks)
    if hidden_gpu:
        drift_free(name="verify: the node's GPUs are all usable", drift=[hidden_gpu])
else:
    deployed_sets = ((probe["state"] or {}).get("deployed") or {}).get("patch_sets", {})
    plans = {}
    for package in deployed_sets:
        found = probe["distributions"].get(package)
        if found is not None:
            files, record = probe_files(probe, package)
            optional = [name for name in deployed_sets[package] if name in catalog.optional_sets()]
            plans[package] = plan_package_once(catalog, package, found["version"], files, record, optional,
                                               checkout=develop_checkout(found))

    refusal = sudo_refusal(probe)  # unprivileged, the probe cannot see what the deploy left
    drift = [refusal] if refusal else find_drift(probe, plans, KernelPolicy.of_host_data(data).record())
    drift += [hidden_gpu] if hidden_gpu else []
    if (((probe["state"] or {}).get("deployed") or {}).get("kernel_hazards") or {}).get("policy") == "permissive":
        report.host(host.name).notes.append("kernels installed under kernel_hazard_policy permissive: kernels short "
                                            "of gfx90a's MFMA wait states in straight-line code may be among them")
    for package, status in sorted(probe["record_check"].items()):
        if "git" in status and not status["error"]:  # a develop checkout: the operator's own changes are named only
            _, others = checkout_changes(status, {checkout_path(path) for path in catalog.target_files(package)})
            if others:
                report.host(host.name).notes.append(f"{package} checkout {status['git']}: differ from git HEAD, not "
                                                    f"ours (left as they are): {', '.join(others[:10])}")
    # The kernel families as the last smoke test on this host judged them (withheld ones are gone from hsa/gfx90a).
    families = ((probe["state"] or {}).get("smoke") or {}).get("families")
    report_families(report, host.name, families)
    if (probe["aiter"] or {}).get("gfx90a_digest"):
        report.host(host.name).notes.append(f"kernel {verdict_line(families)}" if families else
                                            "kernel families: unproven, no smoke verdict is recorded on this host")
    report.step(host.name, "verify", FAILED if drift else "ok", "; ".join(drift) or "as deployed")
    drift_free(name="verify: the host is as deployed", drift=drift)

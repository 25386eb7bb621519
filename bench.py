"""Benchmark every provisioned gfx90a host, correctness first: per host figures and speedups, the slow hosts named.

    pyinfra -y inventory/lab.py bench.py       # run, then read reports/bench-latest.md
    pyinfra inventory/lab.py bench.py --dry    # which hosts would run the benchmarks, and why the others would not

Per host: a fresh probe, then the cases of ``cdna2/data/bench-cases.yaml`` run by the host agent
(``cdna2/host/bench.py``), each checked against a reference before it is timed. Only a gfx90a host that this tool
provisioned and whose smoke pass (with its GPU checks) is recorded for its deployed state runs them; every other
host is skipped, with the reason, in the bench report. Nothing on any host changes but the host agent, brought up
to date when it predates this checkout. A case that is wrong, crashed, hung or failed fails its host.

A node whose data names ``sif_image`` runs a Singularity/Apptainer image with its layer, where no smoke pass can be
recorded: there the smoke test, GPU checks included, runs inside the node's ``singularity`` or ``apptainer`` with
the layer first, and the cases run there only when it passes (with the GPU checks off, every case is skipped,
saying so); both reports name the runtime, its version and both files' SHA-256.
"""

if __name__ == "__main__":  # `python bench.py`: say what this file is instead of pyinfra's traceback
    from cdna2.deploy_file import refuse_direct_run
    refuse_direct_run(__file__)


# pyinfra runs this module as a file, not as a package module: imports are absolute from the repository root.
from pyinfra import host, inventory, state
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from cdna2.bench import host_cases, load_cases, skip_reason
from cdna2.plan import hidden_gpu_refusal, target_env_error, with_data_arch
from cdna2.reports.run import FAILED, summarise_probe
from operations.agent import agent_installed, current_agent_bundle
from operations.bench import BenchRecorder, benchmarked, benchmarked_inside_image
from operations.facts import host_probe
from operations.images import is_container_target
from operations.preflight import validate_inventory
from operations.report import RunRecorder

report = RunRecorder.install(state, mode="bench").report
data = host.data

# 1. Validate every host's data and the cases before any host runs anything.
validate_inventory(inventory)
plan = load_cases()
bench = BenchRecorder.install(state, plan).report

# 2. Probe: arch, the tool's recorded state (deployed, smoke pass), where AITER is.
probe = host_probe(host, data.state_dir, target_python=data.target_python, rocm_root=data.rocm_root)
state_dir = probe["state_dir"]["path"]  # host data's, else the login's default (cdna2/login.py)
container = is_container_target(host)
# gfx90a GPUs on the PCI bus without an agent: a broken GPU, never "skipped".
hidden_gpu = hidden_gpu_refusal(probe, container)
probe, _ = with_data_arch(probe, data.gpu_arch, container)
summarise_probe(report.host(host.name), probe)
reason = skip_reason(probe["gpu"]["arch"], probe["state"])
aiter = probe["distributions"].get("amd-aiter")
# A host that would run the cases must still have its environment and AITER (else it drifted since its smoke pass);
# a node that runs an image has both in the image and its layer, checked inside its runtime.
problem = hidden_gpu or (None if reason or data.sif_image else target_env_error(probe) or (
    None if aiter else "amd-aiter is no longer installed in the target environment: run verify.py, then the deploy"))

if problem:
    report.step(host.name, "bench", FAILED, problem)
    bench.fail(host.name, problem)
    python.raise_exception(OperationError, f"{host.name}: {problem}", name="bench: the host can be benchmarked")
elif data.sif_image:
    # 3. The node runs an image with its layer: its smoke test inside the runtime first, then the cases there.
    benchmarked_inside_image(name="bench: the image's figures are measured inside its runtime", bench=bench,
                             report=report, image=data.sif_image, cases=plan["cases"],
                             host_arch=probe["gpu"]["arch"], gpu_checks=data.smoke_gpu_checks)
else:
    # 3. The agent runs the cases: bring it up to date where it predates this checkout (not on skipped hosts).
    agent = current_agent_bundle()
    if not reason and probe["agent"]["digest"] != agent.digest:
        agent_installed(name="agent: host-side modules are current", bundle=agent, state_dir=state_dir,
                        installed_digest=probe["agent"]["digest"], target_python=data.target_python)
    # 4. Run, judge, record.
    benchmarked(name="bench: the host's figures are measured", bench=bench, report=report, skip_reason=reason,
                cases=host_cases(plan["cases"], (probe["state"] or {}).get("deployed")),
                site_packages=(aiter or {}).get("location"),
                target_python=data.target_python, state_dir=state_dir, host_arch=probe["gpu"]["arch"])

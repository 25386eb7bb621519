"""Job steps of the current allocation as a way to run commands on its nodes: ``srun`` command lines, and telling
Slurm's own refusals from a command's exit status.

A step on one node is ``srun --overlap --jobid=J -w NODE -N1 -n1``: ``--overlap`` shares the job's CPUs, memory and
GPUs with its other steps (without it a second step waits or is refused), ``-n1`` one task (``--overlap`` across
nodes can fail with "error-configuring-interconnect" otherwise). Where the allocation has GPUs, a step that asks
for none is refused ("Invalid generic resource (gres) specification"), so the node's GPUs are requested. srun exits
with the task's status (128 + signal when killed); when Slurm itself refuses or ends the step, srun says so on stderr
in lines of its own (``srun: error: ...``, ``slurmstepd: error: *** STEP ... CANCELLED ...``), which is how the two
are told apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from cdna2.slurm.allocation import SlurmError

JOB_ID_VARIABLE = "SLURM_JOB_ID"
# The GPUs per node of the allocation, where it was made with --gpus-per-node (e.g. "8" or "mi250:8").
GPUS_PER_NODE_VARIABLE = "SLURM_GPUS_PER_NODE"
# srun's line for a task that ran and exited non-zero (or was killed): the command's own failure, not Slurm's.
TASK_EXIT = re.compile(r"^srun: error: [^:]+: tasks? [0-9,-]+: (Exited with exit code \d+|Killed|Terminated|"
                       r"Segmentation fault|Aborted)")
# Lines in which Slurm itself speaks: srun's errors, and slurmstepd ending the step (time limit, node failure).
# slurmstepd names itself "slurmstepd-<node>" in these lines.
SLURM_LINE = re.compile(r"^(srun: error: |srun: Job step aborted|srun: Force Terminated|"
                        r"slurmstepd(-[^:]+)?: error: \*\*\* )")


def job_of(environ: Mapping[str, str]) -> str:
    """The allocation's job id, from this shell (salloc and sbatch set it)."""
    job = environ.get(JOB_ID_VARIABLE, "").strip()
    if not job.isdigit():
        raise SlurmError(f"not inside a Slurm allocation: {JOB_ID_VARIABLE} is not set, and the Slurm connector "
                         f"reaches nodes through the allocation's job steps. Run inside one (salloc -N <nodes> "
                         f"..., then the command in that shell), or reach the nodes over SSH where the cluster "
                         f"allows it (CDNA2_SLURM_TRANSPORT=ssh)")
    return job


def gpus_of(environ: Mapping[str, str]) -> int | None:
    """The GPUs each node of the allocation holds, when it was made with --gpus-per-node; else None."""
    found = re.search(r"(\d+)$", environ.get(GPUS_PER_NODE_VARIABLE, "").strip())
    return int(found.group(1)) if found else None


def _common(job: str, gpus: int | None) -> list[str]:
    return ["srun", "--overlap", f"--jobid={job}", "--quiet", *([f"--gpus-per-node={gpus}"] if gpus else [])]


def node_step_argv(job: str, node: str, command: str, gpus: int | None = None) -> list[str]:
    """One task on ``node`` running ``command`` with sh; stdin (srun's) goes to it byte for byte."""
    return [*_common(job, gpus), "-w", node, "-N1", "-n1", "sh", "-c", command]


def fanout_step_argv(job: str, nodes: list[str], script: str, *args: str, gpus: int | None = None) -> list[str]:
    """One task on each of ``nodes`` at once, each line of output labelled with its task (``--label``), no stdin:
    a single step, whatever the number of nodes."""
    return [*_common(job, gpus), "-w", ",".join(nodes), f"-N{len(nodes)}", f"-n{len(nodes)}", "--ntasks-per-node=1",
            "--label", "--input=none", "sh", "-c", script, "sh", *args]


def slurm_refusal(returncode: int, stderr_lines: list[str]) -> str | None:
    """Slurm's own words when it refused, or ended, the step rather than the command exiting; None when the
    command ran and its exit status is its own."""
    if returncode == 0:
        return None
    said = [line.strip() for line in stderr_lines if SLURM_LINE.match(line.strip()) and not
            TASK_EXIT.match(line.strip())]
    return "; ".join(dict.fromkeys(said)) or None


def job_state(scontrol_show_job: str) -> dict[str, str]:
    """``JobState``, ``NodeList`` and the other KEY=VALUE fields of ``scontrol show job -o J``."""
    return dict(field.split("=", 1) for field in scontrol_show_job.split() if "=" in field)


def steps_summary(counts: dict) -> dict:
    """The report's account of a run's job steps (``connectors.slurm.job_steps()``), with its one line of text."""
    latencies = sorted(counts["latencies_s"])
    median = latencies[len(latencies) // 2] if latencies else 0.0
    text = (f"Slurm job steps: {counts['steps']} ({counts['fanout_steps']} across nodes, for "
            f"{counts['fanout_nodes']} node runs; {counts['node_steps']} on one node); median step "
            f"{median * 1000:.0f} ms")
    return {"kind": "slurm", **{key: value for key, value in counts.items() if key != "latencies_s"},
            "median_step_s": round(median, 4), "text": text}

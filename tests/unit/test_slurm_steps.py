"""The srun command lines, Slurm's refusals told from a command's exit, and the fan-out's framing (cdna2/slurm/).

The stderr lines are those Debian's Slurm 22.05 printed in the lab (tests/lab/test_slurm.py runs them for real);
the fan-out's task script runs here under sh with a node name set as slurmstepd sets it, its labelled output
interleaved as srun's ``--label`` interleaves tasks.
"""

from __future__ import annotations

import subprocess

import pytest

from cdna2.slurm import fanout
from cdna2.slurm.allocation import SlurmError
from cdna2.slurm.steps import fanout_step_argv, gpus_of, job_of, node_step_argv, slurm_refusal


@pytest.mark.parametrize("returncode, stderr, refusal", [
    (0, ["warning from the command"], None),
    (3, ["srun: error: mi210-c: task 0: Exited with exit code 3"], None),
    (137, ["srun: error: mi210-c: task 0: Killed"], None),
    (1, ["srun: error: Unable to create step for job 7: Requested node configuration is not available"],
     "srun: error: Unable to create step for job 7: Requested node configuration is not available"),
    (233, ["srun: error: Task launch for StepId=7.0 failed on node mi210-d: Communication connection failure",
           "srun: error: Application launch failed: Communication connection failure"],
     "srun: error: Task launch for StepId=7.0 failed on node mi210-d: Communication connection failure; "
     "srun: error: Application launch failed: Communication connection failure"),
    (143, ["slurmstepd-mi210-b: error: *** STEP 2.0 ON mi210-b CANCELLED AT 2026-12-07T14:09:18 DUE TO TIME LIMIT ***"],
     "slurmstepd-mi210-b: error: *** STEP 2.0 ON mi210-b CANCELLED AT 2026-12-07T14:09:18 DUE TO TIME LIMIT ***"),
], ids=["success", "the command's exit", "the command killed", "no step", "node lost", "time limit"])
def test_slurms_own_words_are_told_from_the_commands_exit(returncode: int, stderr: list[str],
                                                          refusal: str | None) -> None:
    assert slurm_refusal(returncode, stderr) == refusal


def test_steps_share_the_allocation_and_ask_for_its_gpus() -> None:
    assert node_step_argv("12", "nid001007", "true", gpus=8) == [
        "srun", "--overlap", "--jobid=12", "--quiet", "--gpus-per-node=8", "-w", "nid001007", "-N1", "-n1", "sh",
        "-c", "true"]
    argv = fanout_step_argv("12", ["a", "b"], "SCRIPT", "MAP", "T1")
    assert argv[argv.index("-w"):] == ["-w", "a,b", "-N2", "-n2", "--ntasks-per-node=1", "--label", "--input=none",
                                       "sh", "-c", "SCRIPT", "sh", "MAP", "T1"]
    assert gpus_of({"SLURM_GPUS_PER_NODE": "mi250:8"}) == 8 and gpus_of({}) is None
    assert job_of({"SLURM_JOB_ID": "4711"}) == "4711"
    with pytest.raises(SlurmError, match="not inside a Slurm allocation: SLURM_JOB_ID is not set"):
        job_of({})


def _task(node: str, arguments: list[str]) -> list[str]:
    """The fan-out's task script as one task of a step runs it, its lines labelled like srun --label's."""
    result = subprocess.run(["sh", "-c", fanout.TASK_SCRIPT, "sh", *arguments], capture_output=True, text=True,
                            env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"}, check=True, timeout=60)
    return result.stdout.splitlines()


def test_each_node_runs_its_own_command_and_gets_its_own_result_back() -> None:
    commands = {
        "nid001007": "printf 'state /home/a/nodes/nid001007\\n'; printf 'oops\\n' >&2; exit 3",
        "nid001011": "printf 'state /home/a/nodes/nid001011\\n'; printf 'oops\\n' >&2; exit 3",
        "nid001012": "printf 'other'",
    }
    ((nodes, arguments),) = fanout.step_batches(commands)
    assert nodes == sorted(commands) and len(arguments) == 3, "equal templates are passed once"
    lines = {node: _task(node, arguments) for node in nodes}
    # srun interleaves the tasks' lines, each with its task number
    labelled = [f"{task:3}: {line}" for index in range(max(map(len, lines.values())))
                for task, node in enumerate(nodes) if index < len(lines[node]) for line in [lines[node][index]]]
    found = fanout.results("\n".join(labelled))
    assert found["nid001007"] == fanout.NodeResult("nid001007", 3, "state /home/a/nodes/nid001007\n", "oops\n")
    assert found["nid001011"].stdout == "state /home/a/nodes/nid001011\n"
    assert found["nid001012"] == fanout.NodeResult("nid001012", 0, "other", "")


def test_a_cut_frame_is_no_result_and_a_command_with_the_token_is_not_gathered() -> None:
    whole = [f"0: {line}" for line in _task("n1", fanout.step_batches({"n1": "echo hi", "n2": "echo hi"})[0][1])]
    assert fanout.results("\n".join(whole)) == {"n1": fanout.NodeResult("n1", 0, "hi\n", "")}
    assert fanout.results("\n".join(whole[:-1])) == {}, "no end mark: the task did not finish its frame"
    assert fanout.step_batches({"n1": f"echo {fanout.NODE_TOKEN}", "n2": "true"}) is None

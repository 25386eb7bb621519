"""One job step for a command the nodes run alike: each node's command, output and exit status, framed.

The controller hands every node of a phase its own command; where those commands are the same but for the node's
own name (a state directory per node, say), they are one template: the node's name is replaced by a token the
command does not contain, and each task puts its own name back (``$SLURMD_NODENAME``), so a node runs exactly the
command it was given. Each task runs it with its output captured, then prints a frame: its node name, the exit
status, stdout and stderr in base64 lines (short lines: srun interleaves the tasks' output line by line, each
labelled with its task number by ``--label``). ``results`` rebuilds each node's output from its task's lines.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

NODE_TOKEN = "@CDNA2_SLURM_NODE@"
_MARK = "CDNA2-FANOUT"
# Run by every task of the step: $1 the command template.
TASK_SCRIPT = f"""node="${{SLURMD_NODENAME:?not in a Slurm job step}}"
command=$(printf '%s\\n' "$1" | sed "s/{NODE_TOKEN}/$node/g")
out=$(mktemp) && err=$(mktemp) || exit 70
sh -c "$command" </dev/null >"$out" 2>"$err"
status=$?
printf '{_MARK} node %s\\n{_MARK} status %s\\n{_MARK} stdout\\n' "$node" "$status"
base64 <"$out"
printf '{_MARK} stderr\\n'
base64 <"$err"
printf '{_MARK} end\\n'
rm -f "$out" "$err"
"""
_LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")


@dataclass(frozen=True)
class NodeResult:
    node: str
    status: int
    stdout: str
    stderr: str


def template_of(command: str, node: str) -> str | None:
    """``command`` with ``node``'s name as the token, or None when it cannot be one (the token is in it)."""
    if NODE_TOKEN in command:
        return None
    return command.replace(node, NODE_TOKEN)


def results(labelled_stdout: str) -> dict[str, NodeResult]:
    """Each node's result from the step's labelled output; a node whose frame is missing or cut is absent."""
    lines_of_task: dict[str, list[str]] = {}
    for line in labelled_stdout.splitlines():
        labelled = _LABELLED.match(line)
        if labelled:
            lines_of_task.setdefault(labelled.group(1), []).append(labelled.group(2))
    found = {}
    for lines in lines_of_task.values():
        result = _frame(lines)
        if result is not None:
            found[result.node] = result
    return found


def _frame(lines: list[str]) -> NodeResult | None:
    if len(lines) < 4 or not lines[0].startswith(f"{_MARK} node ") or lines[-1] != f"{_MARK} end":
        return None
    try:
        status = int(lines[1].removeprefix(f"{_MARK} status "))
        split = lines.index(f"{_MARK} stderr")
    except ValueError:
        return None
    decode = lambda chunk: base64.b64decode("".join(chunk)).decode("utf-8", errors="replace")  # noqa: E731
    return NodeResult(node=lines[0].removeprefix(f"{_MARK} node "), status=status, stdout=decode(lines[3:split]),
                      stderr=decode(lines[split + 1:-1]))

"""One job step for the commands several nodes run at once: each node's command, output and exit status, framed.

Each node of the step has its own command, passed as arguments of the step. The commands a phase gives its nodes are
mostly the same but for the node's own name (a state directory per node, say), so each is made a template: the
node's name is replaced by a token the command does not contain, and each task puts its own name back
(``$SLURMD_NODENAME``); equal templates are passed once, with a map of which node runs which, so a node runs exactly
the command it was given and the step's size grows with the distinct commands, not the nodes. Each task runs its
command with its output captured, then prints a frame: its node name, the exit status, stdout and stderr in base64
lines (short lines: srun interleaves the tasks' output line by line, each labelled with its task number by
``--label``). ``results`` rebuilds each node's output from its task's lines.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

NODE_TOKEN = "@CDNA2_SLURM_NODE@"
_MARK = "CDNA2-FANOUT"
# The arguments of one step, at most: Linux takes 2 MiB of arguments and environment for a program, and at most
# 128 KiB in one argument (a probe is about 70 KiB).
STEP_ARGUMENT_BYTES = 1 << 20
ARGUMENT_BYTES = (128 << 10) - 1
# Run by every task of the step: $1 the map "node=index ...", then the templates ($2 is index 1).
TASK_SCRIPT = f"""node="${{SLURMD_NODENAME:?not in a Slurm job step}}"
index=$(printf '%s\\n' "$1" | tr ' ' '\\n' | sed -n "s/^$node=//p")
[ -n "$index" ] || {{ echo "no command for node $node in this step" >&2; exit 70; }}
eval "template=\\"\\${{$((index + 1))}}\\""
command=$(printf '%s\\n' "$template" | sed "s/{NODE_TOKEN}/$node/g")
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


def step_batches(commands: dict[str, str]) -> list[tuple[list[str], list[str]]] | None:
    """``commands`` (node -> its command) as the nodes and arguments of as few steps as the argument limits allow
    (usually one); None when a command cannot be passed this way (it holds the token, or is too long for one
    argument), and each node then runs its own step."""
    batches: list[tuple[list[str], list[str]]] = []
    nodes: list[str] = []
    templates: dict[str, int] = {}
    size = 0
    for node in sorted(commands):
        template = template_of(commands[node], node)
        if template is None or len(template.encode()) > ARGUMENT_BYTES:
            return None
        if template not in templates and size + len(template.encode()) > STEP_ARGUMENT_BYTES and nodes:
            batches.append(_batch(nodes, templates, commands))
            nodes, templates, size = [], {}, 0
        if template not in templates:
            templates[template] = len(templates) + 1
            size += len(template.encode())
        nodes.append(node)
    batches.append(_batch(nodes, templates, commands))
    return batches


def _batch(nodes: list[str], templates: dict[str, int], commands: dict[str, str]) -> tuple[list[str], list[str]]:
    index_of = " ".join(f"{node}={templates[template_of(commands[node], node)]}" for node in nodes)
    return nodes, [index_of, *templates]


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

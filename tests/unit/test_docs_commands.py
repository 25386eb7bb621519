"""Docs that cannot rot: every command shown in README.md, docs/**/*.md and bench/README.md is checked against the
repository, and those pages carry no issue numbers and no work-log headings.

The rules (docs/maintainers/test-lab.md repeats them for authors of pages):

1. Only fenced blocks marked ```sh are read; one command per line, a trailing backslash continues it, `#` starts
   a comment, and `|`, `&&`, `||` and `;` separate commands.
2. Notation that is not shell: `[...]` marks optional words (its brackets are dropped), `{a,b,c}` alternatives
   (each is checked), and a word with `<`, `>`, `...`, `$`, `~`, `*` or written in capitals (INVENTORY, SRC,
   CONFIG.json) is a placeholder: no path or flag check applies to it.
3. Our tools are checked in full, wherever they stand in a command (also after srun, salloc, env, time...):
   - `pyinfra` (any path to it): every deploy file or inventory named that is a repository path must exist, and
     every flag must be listed by `pyinfra --help`;
   - `python -m cdna2|releases|lab[.module] ...` (any python): the subcommand words must exist and every flag
     must be listed by `python -m MODULE SUBCOMMAND... --help`;
   - `python FILE.py`, where FILE is ours: the file must exist;
   - `lab/up`, `lab/down`, `lab/status`, `bench/*`: the script must exist and every flag be listed by its `--help`;
   - `bin/*`: the script must exist; flags of `bin/lab-deploy` must be pyinfra's (it passes them on), of `bin/test`
     pytest's, of any other its own (named in its text).
4. Other programs (srun, salloc, sbatch, singularity, apptainer, module, docker, ssh, pip, git, ...): only the
   repository paths they name are checked.
5. A repository path is a word whose first component is a top-level file or directory of this repository (for
   example `inventory/lab.py`, `docs/slurm.md`, `deploy.py`); it must exist, unless it is a placeholder (rule 2) or
   lies under `reports/` or `.venv/`, which runs create.
6. The target of every relative Markdown link of those pages names a file or directory that exists.
7. In the whole text of those pages: no issue numbers ("issue 12", "#12") and no work-log words ("Session 4").
   An upstream project's issue is cited as owner/repo#N (ROCm/aiter#4389), which is allowed.
"""

from __future__ import annotations

import functools
import json
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CREATED_BY_RUNS = ("reports", ".venv")
OUR_PACKAGES = ("cdna2", "releases", "lab")  # python -m PACKAGE[.module]: checked by its --help
OUTSIDE_FLAG_SOURCES = {"bin/lab-deploy": "pyinfra", "bin/test": "pytest"}
RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)#\s]+)(?:#[^)\s]*)?\)")
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+|(?<![\w&#/])#\d+\b", re.I)
WORK_LOG = re.compile(r"\bsession\s+\d+\b", re.I)
SEPARATORS = {"|", "&&", "||", ";"}


def pages() -> list[Path]:
    found = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [page for page in found if page.exists()]


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    words: tuple[str, ...]

    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {' '.join(self.words)}"


def sh_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command text) of every command in the page's ```sh blocks, continuation lines joined."""
    lines, inside, pending, start = [], False, "", 0
    for number, text in enumerate(page.read_text().splitlines(), 1):
        stripped = text.strip()
        if stripped.startswith("```"):
            inside = not inside and stripped == "```sh"
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    return lines


def commands(page: Path) -> list[Command]:
    found = []
    for number, text in sh_lines(page):
        lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word in SEPARATORS:
                if words:
                    found.append(Command(page, number, tuple(words)))
                words = []
            else:
                words.append(word)
    return found


def is_placeholder(word: str) -> bool:
    bare = re.sub(r"[^A-Za-z]", "", word.split("=")[-1].split("/")[0].split(".")[0])
    return (any(mark in word for mark in ("<", ">", "...", "$", "~", "*"))
            or (bare != "" and bare.isupper() and len(bare) > 1))


def unbracket(words: tuple[str, ...]) -> list[list[str]]:
    """The command's words with optional brackets dropped, one list per {a,b} alternative."""
    plain = [w.strip("[]") for w in words if w.strip("[]")]
    variants = [plain]
    for index, word in enumerate(plain):
        alternatives = re.fullmatch(r"\{([\w,-]+)\}", word)
        if alternatives:
            variants = [[*v[:index], choice, *v[index + 1:]] for v in variants
                        for choice in alternatives.group(1).split(",")]
    return variants


@functools.cache
def top_level() -> frozenset[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    return frozenset(path.split("/")[0] for path in listed)


def repository_path(word: str) -> str | None:
    """The word as a repository path, or None when it is not one (rule 5)."""
    path = word.split("=", 1)[-1].removeprefix("./").rstrip("/")
    first = path.split("/")[0]
    if is_placeholder(word) or first in CREATED_BY_RUNS or first not in top_level() or path.startswith("-"):
        return None
    return path


@functools.cache
def help_text(*argv: str) -> str:
    result = subprocess.run([*argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"`{' '.join(argv)} --help` failed: {result.stderr[-1000:]}"
    return result.stdout


def flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("-") and w != "-" and not is_placeholder(w)]


def unlisted(flag_words: list[str], text: str) -> list[str]:
    return [f for f in flag_words if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]


def python_module(words: list[str], start: int) -> str | None:
    program = Path(words[start]).name
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and words[start + 1:start + 2] == ["-m"]:
        return words[start + 2] if len(words) > start + 2 else None
    return None


def is_ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in OUR_PACKAGES


def python_file(words: list[str], start: int) -> str | None:
    """`python FILE.py`: the file, which is ours (a deploy file or a script of this repository)."""
    following = words[start + 1:start + 2]
    if re.fullmatch(r"python(3(\.\d+)?)?", Path(words[start]).name) and following and \
            following[0].endswith(".py") and not is_placeholder(following[0]):
        return following[0].removeprefix("./")
    return None


def tool_start(words: list[str]) -> int | None:
    """Where our tool starts in the command, after any outside launcher (srun, env, time ...)."""
    for index, word in enumerate(words):
        program = word.removeprefix("./")
        if Path(program).name == "pyinfra" or program.split("/")[0] in ("bin", "lab", "bench") and \
                "/" in program and not program.endswith((".md", ".yaml", ".json")):
            return index
        if is_ours(python_module(words, index)):
            return index
        if python_file(words, index):
            return index
    return None


def check_tool(words: list[str]) -> list[str]:
    """Problems of our tool's command (rule 3), empty when there are none."""
    program = words[0].removeprefix("./")
    rest = words[1:]
    if Path(program).name == "pyinfra":
        return unlisted(flags(rest), help_text(sys.executable, "-m", "pyinfra"))
    module = python_module(words, 0)
    if is_ours(module):
        argv = [sys.executable, "-m", module]
        rest = words[3:]
        # Words are subcommands while the parser reached so far has subcommands (argparse lists them first under
        # "positional arguments", as COMMAND or {a,b}); a lowercase word after that is an argument.
        while rest and re.fullmatch(r"[a-z][a-z0-9-]*", rest[0]) and \
                re.search(r"positional arguments:\n\s+(COMMAND|\{[\w,-]+\})", help_text(*argv)):
            listed = help_text(*argv)
            if not re.search(rf"(?<![\w-]){re.escape(rest[0])}(?![\w-])", listed.split("options:")[0]):
                return [f"`{' '.join(argv[2:])}` has no subcommand `{rest[0]}`"]
            argv.append(rest.pop(0))
        return unlisted(flags(rest), help_text(*argv))
    script = python_file(words, 0)
    if script is not None:
        return [] if (REPO / script).is_file() else [f"{script}: no such file in the repository"]
    if not (REPO / program).is_file():
        return []  # reported with the other missing paths
    if program.startswith("bin/"):
        source = OUTSIDE_FLAG_SOURCES.get(program)
        if source is None:
            return unlisted(flags(rest), (REPO / program).read_text())
        return unlisted(flags(rest), help_text(sys.executable, "-m", source))
    return unlisted(flags(rest), help_text(str(REPO / program)))


def problems_of(command: Command) -> list[str]:
    problems = []
    for words in unbracket(command.words):
        missing = [w for w in words if (path := repository_path(w)) and not (REPO / path).exists()]
        problems += [f"{w}: no such file in the repository" for w in missing]
        start = tool_start(words)
        if start is not None:
            problems += check_tool(words[start:])
    return problems


def all_commands() -> list[Command]:
    return [command for page in pages() for command in commands(page)]


def test_every_command_in_the_docs_names_existing_paths_and_flags():
    checked = all_commands()
    ours = [c for c in checked if any(tool_start(words) is not None for words in unbracket(c.words))]
    assert len(checked) >= 20 and len(ours) >= 10, f"too few commands found ({len(checked)}, ours {len(ours)})"
    problems = [f"{command.where()}\n    {problem}" for command in checked for problem in problems_of(command)]
    assert problems == [], "commands in the docs that would fail (rules: tests/unit/test_docs_commands.py):\n" + \
        "\n".join(problems)


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` that name nothing."""
    return [target for target in RELATIVE_LINK.findall(page.read_text()) if not (page.parent / target).exists()]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_in_the_docs_resolves(page):
    assert broken_links(page) == []


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](here.md) [gone](gone.md#part) [web](https://example.org/x.md) [top](#top)\n")
    (tmp_path / "here.md").write_text("")
    assert broken_links(page) == ["gone.md"]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_no_issue_numbers_or_work_log_in_the_docs(page):
    found = [f"{page.relative_to(REPO)}:{number}: {match.group(0)!r} in {text.strip()[:100]}"
             for number, text in enumerate(page.read_text().splitlines(), 1)
             for pattern in (ISSUE_NUMBER, WORK_LOG) for match in pattern.finditer(text)]
    assert found == []


# The checker itself, on commands written to fail: each rule must be able to fire.
@pytest.mark.parametrize("text, expected", [
    (".venv/bin/pyinfra inventory/lab.py deploy.py --dry", []),
    (".venv/bin/pyinfra inventory/nowhere.py deploy.py", ["inventory/nowhere.py: no such file in the repository"]),
    (".venv/bin/pyinfra inventory/lab.py deploy.py --dryrun", ["--dryrun"]),
    ("srun -N 2 .venv/bin/python -m cdna2 translate SRC DST --hazard-policy strict", []),
    ("srun -N 2 .venv/bin/python -m cdna2 translate SRC DST --no-such-flag", ["--no-such-flag"]),
    (".venv/bin/python -m cdna2 translate src/gfx942 out --report out.json", []),
    (".venv/bin/python -m cdna2 patch port --set aiter-asm-paths --site-packages site", []),
    (".venv/bin/python -m cdna2 patch prot --site-packages site", ["`cdna2 patch` has no subcommand `prot`"]),
    (".venv/bin/python -m cdna2 patch {plan,check} --site-packages DIR [--set NAME ...]", []),
    (".venv/bin/python -m releases explainn --config CONFIG.json", ["`releases` has no subcommand `explainn`"]),
    ("./lab/up 10 --shared 8 && ./lab/down", []),
    (".venv/bin/python -m lab.labctl up 2 --login user", []),
    (".venv/bin/python -m lab.labctl up --logn user", ["--logn"]),
    ("./lab/up --sharedd 8", ["--sharedd"]),
    ("bin/lab-deploy --dry", []),
    ("bin/nothing", ["bin/nothing: no such file in the repository"]),
    ("singularity exec IMAGE.sif .venv/bin/pyinfra inventory/slurm.py deploy.py --limitt x", ["--limitt"]),
    ("module load rocm && python3 verify.py", []),
    ("python3 verifyy.py", ["verifyy.py: no such file in the repository"]),
])
def test_the_checker_finds_what_it_must(tmp_path, text, expected):
    page = tmp_path / "page.md"
    page.write_text(f"```sh\n{text}   # a comment\n```\n")
    found = [problem for command in commands(page) for problem in problems_of(command)]
    assert len(found) == len(expected) and all(e in p for e, p in zip(expected, found)), found


def test_issue_numbers_and_work_log_words_are_caught():
    assert ISSUE_NUMBER.search("fixed in issue 12") and ISSUE_NUMBER.search("see #31")
    assert WORK_LOG.search("## Session 12: the final bench")
    assert not ISSUE_NUMBER.search("[the report](#the-report) and &#8212;")
    assert not ISSUE_NUMBER.search("upstream: ROCm/aiter#4389 and vllm-project/vllm#34641")


def test_every_host_data_key_is_in_the_inventories_page_with_its_default():
    """docs/inventories.md lists every key the schema accepts, and each default of group_data/all.py as it is."""
    keys = json.loads((REPO / "cdna2/schemas/host-data-1.0.json").read_text())["properties"]
    page = (REPO / "docs" / "inventories.md").read_text()
    rows = {key: line for line in page.splitlines() if line.startswith("| `")
            for key in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert sorted(set(keys) - set(rows)) == []
    defaults = {k: v for k, v in runpy.run_path(str(REPO / "group_data/all.py")).items() if k in keys}
    assert len(defaults) >= 20
    for key, value in defaults.items():
        shown = [f"`{value}`", f'`"{value}"`'] if isinstance(value, str) else [f"`{value!r}`"]
        assert any(text in rows[key].split("|")[2] for text in shown), f"{key}: default {shown[0]} not in {rows[key]}"

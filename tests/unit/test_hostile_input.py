"""Hostile input: every value that reaches a shell is either refused by a schema or quoted, and every refusal
happens before anything changes.

Injected commands all try to create a marker file; each test proves the marker never appears.
"""

from __future__ import annotations

import hashlib
import json
import runpy
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import PyinfraError

import operations.preflight as preflight
from cdna2.host import txn
from cdna2.hostdata import problems_for, schema
from cdna2.kernels import translate_tree
from cdna2.patches import catalog as patch_catalog
from operations.agent import agent_command
from operations.facts import HostProbe
from tests.unit.kernels.conftest import BF16_MFMA, build_code_object, llvm_tools  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]

# A file or directory name that is a shell program if anything splices it into a command line unquoted; the marker
# it creates is relative, so every test runs its commands from the directory the `marker` fixture watches.
HOSTILE_NAME = "we ird'$(touch pwned)\";touch pwned;`touch pwned`"


def shell_payloads(marker: Path) -> list[str]:
    return [f"x; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"x && touch {marker}",
            f"x | touch {marker}", f"x\ntouch {marker}", f"x' ; touch {marker} ; '"]


@pytest.fixture
def defaults() -> dict:
    """group_data/all.py as pyinfra reads it: its public module-level names."""
    namespace = runpy.run_path(str(ROOT / "group_data/all.py"))
    return {key: value for key, value in namespace.items() if not key.startswith("__")}


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), f"an injected command ran: {path} exists"


def _string_keys() -> list[str]:
    """Every host-data key whose value may be a string (these are the ones that can carry a shell payload)."""
    keys = []
    for key, definition in schema()["properties"].items():
        options = definition.get("anyOf", [definition])
        if any(option.get("type") == "string" or "$ref" in option for option in options):
            keys.append(key)
    return sorted(keys)


@pytest.mark.parametrize("key", _string_keys())
def test_every_string_data_key_refuses_shell_metacharacters(defaults: dict, marker: Path, key: str) -> None:
    for payload in shell_payloads(marker):
        problems = problems_for("mi210-a", dict(defaults, **{key: payload}))
        assert [problem.key for problem in problems] == [key], f"{key}={payload!r} was accepted"


def test_a_data_key_carrying_a_command_is_an_unknown_key(defaults: dict, marker: Path) -> None:
    problems = problems_for("mi210-a", dict(defaults, **{f"x; touch {marker}": True}))
    assert [str(problem) for problem in problems] == [f"host mi210-a: data key `x; touch {marker}`: unknown data key"]


@pytest.mark.parametrize("key, value", [
    ("state_dir", ["/var/lib/cdna2"]), ("state_dir", 7), ("ssh_port", 22.5), ("ssh_port", True),
    ("translate_kernels", "false"), ("translate_kernels", 0), ("optional_patch_sets", "ck-int8-gemm"),
    ("optional_patch_sets", [1]), ("wheel_matrix", 3), ("torch_version", 2.11),
])
def test_wrong_types_are_refused(defaults: dict, key: str, value) -> None:
    problems = problems_for("mi210-a", dict(defaults, **{key: value}))
    assert problems and {problem.key for problem in problems} == {key}, problems


def fake_interpreter(directory: Path) -> Path:
    """A stand-in for the host's Python (none of its modules are needed): prints the argv it was given as JSON."""
    directory.mkdir(parents=True)
    program = directory / "python"
    program.write_text("#!/usr/bin/python3\nimport json, os, sys\n"
                       "print(json.dumps({'argv': sys.argv[1:], 'pythonpath': os.environ.get('PYTHONPATH')}))\n")
    program.chmod(0o755)
    return program


def test_agent_commands_quote_every_value_through_a_real_shell(tmp_path: Path, marker: Path) -> None:
    # The schema would refuse these values; this proves the second line of defence: the quoting itself.
    hostile = tmp_path / HOSTILE_NAME
    python = fake_interpreter(hostile / "bin")
    state_dir = str(hostile / "state")
    arguments = [f"x; touch {marker}", "two words", "it's", '"$HOME"']
    command = agent_command(str(python), state_dir, "kernels", "install", *arguments)
    result = subprocess.run(["/bin/sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True,
                            cwd=marker.parent)
    assert json.loads(result.stdout) == {"argv": ["-B", "-m", "cdna2.host.kernels", "install", *arguments],
                                         "pythonpath": f"{state_dir}/agent"}


def test_probe_command_passes_hostile_options_through_as_data(tmp_path: Path, marker: Path) -> None:
    hostile = tmp_path / HOSTILE_NAME
    python = fake_interpreter(hostile / "bin")
    options = {"target_python": str(python), "rocm_root": f"/opt/rocm; touch {marker}",
               "state_dir": f"$(touch {marker})", "agent_dir": f"`touch {marker}`",
               "patch_files": {"vllm": [f"a'b; touch {marker}.py"]}}
    command = HostProbe().command(**options)
    result = subprocess.run(["/bin/sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True,
                            cwd=marker.parent)
    argv = json.loads(result.stdout)["argv"]
    assert argv[0] == "-c" and argv[2] == options["agent_dir"]
    sent = {key: value for key, value in options.items() if key != "agent_dir"}  # the agent dir is argv[2] alone
    assert json.loads(argv[4]) == dict(sent, record_check=[], known_contents=[], record_memo={},
                                       shared_environment=False, triton_sources=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _package(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "gate.py").write_text("arch = 'gfx942'\n")
    return root


@pytest.mark.parametrize("row", ["../outside.py", "/etc/hostname", "pkg/../../outside.py"])
def test_txn_manifest_rows_outside_the_tree_are_refused_before_any_write(tmp_path: Path, row: str) -> None:
    root = _package(tmp_path / "site")
    (tmp_path / "outside.py").write_text("not ours\n")
    staged = root / "pkg" / "gate.py.cdna2-staged"
    staged.write_text("arch = 'gfx90a'\n")
    backup_dir = tmp_path / "backups" / "pkg"
    manifest = {"root": str(root), "package": "pkg", "backup_dir": str(backup_dir), "jit_invalidations": [],
                "changes": [{"path": "pkg/gate.py", "expected_sha256": sha256(root / "pkg" / "gate.py"),
                             "staged": str(staged), "new_sha256": sha256(staged)},
                            {"path": row, "expected_sha256": sha256(tmp_path / "outside.py"),
                             "staged": str(staged), "new_sha256": sha256(staged)}]}
    with pytest.raises(txn.TxnError, match="must be a relative path inside"):
        txn.apply(manifest)
    assert (root / "pkg" / "gate.py").read_text() == "arch = 'gfx942'\n", "the valid row was not applied either"
    assert (tmp_path / "outside.py").read_text() == "not ours\n"
    assert not (backup_dir / "originals").exists() and not (backup_dir / "journal.json").exists()


@pytest.fixture
def hostile_tree(tmp_path: Path, build_code_object, marker: Path, monkeypatch) -> Path:
    """A gfx942 tree whose file names are shell programs, plus a valid kernel, a corrupt one and a truncated one."""
    src = tmp_path / "hsa" / "gfx942"
    monkeypatch.chdir(marker.parent)
    family = src / HOSTILE_NAME
    built = build_code_object(tmp_path / "ok_bf16.co", "v_mov_b32_e32 v0, v1", "s_nop 1", BF16_MFMA)
    family.mkdir(parents=True)
    good = built.rename(family / "ok bf16 'k'.co")
    data = good.read_bytes()
    (family / "x; touch pwned.co").write_bytes(data[:64] + bytes(len(data) - 64))  # ELF header, then zeros
    (family / "truncated.co").write_bytes(data[: len(data) // 3])
    (family / "kernels.csv").write_text("knl_name,knl_file\nk1,ok bf16 'k'.co\n"
                                        "k2,x; touch pwned.co\nk3,truncated.co\n")
    return src


def test_corrupt_code_objects_and_hostile_names_are_reported_without_a_crash(hostile_tree: Path,
                                                                               tmp_path: Path) -> None:
    dst = tmp_path / "hsa" / "gfx90a"
    report = translate_tree(hostile_tree, dst, jobs=1)
    family = next(hostile_tree.iterdir()).name
    statuses = {Path(relpath).name: entry["status"] for relpath, entry in report["kernels"].items()}
    assert statuses == {"ok bf16 'k'.co": "written", "x; touch pwned.co": "error",
                        "truncated.co": "error"}
    written = sorted(path.name for path in (dst / family).iterdir())
    assert written == ["kernels.csv", "ok bf16 'k'.co"], "only the valid kernel (and its manifest) is written"
    assert (dst / family / "kernels.csv").read_text() == "knl_name,knl_file\nk1,ok bf16 'k'.co\n"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["gfx90a", "gfx942"], "no staging left behind"


def test_patch_set_breaking_its_schema_stops_the_run_before_any_host(tmp_path: Path, monkeypatch) -> None:
    broken = tmp_path / "patchsets"
    broken.mkdir()
    for source in patch_catalog.DEFAULT_PATCHSET_DIR.glob("*.yaml"):
        (broken / source.name).write_text(source.read_text())
    (broken / "vllm-attention-gate.yaml").write_text(
        (broken / "vllm-attention-gate.yaml").read_text() + "\nrun_before: 'touch /tmp/pwned'\n")
    monkeypatch.setattr(patch_catalog, "DEFAULT_PATCHSET_DIR", broken)
    preflight._catalog.cache_clear()
    try:
        with pytest.raises(PyinfraError, match=r"invalid data file, no host was changed: .*vllm-attention-gate.yaml"):
            preflight.load_data_files(_Data(wheel_matrix=None))
    finally:
        preflight._catalog.cache_clear()


@pytest.mark.parametrize("document, fragment", [
    ("rocm: [1, 2]\n", "wheel-matrix.yaml"),
    ("{{{ not yaml", "not valid YAML"),
    ("format: '1.0'\nunknown_key: true\n", "wheel-matrix.yaml"),
])
def test_wheel_matrix_breaking_its_schema_stops_the_run_before_any_host(tmp_path: Path, document: str,
                                                                         fragment: str) -> None:
    matrix = tmp_path / "wheel-matrix.yaml"
    matrix.write_text(document)
    preflight._matrix.cache_clear()
    try:
        with pytest.raises(PyinfraError, match=f"invalid data file, no host was changed: .*{fragment}"):
            preflight.load_data_files(_Data(wheel_matrix=str(matrix)))
    finally:
        preflight._matrix.cache_clear()


class _Data:
    """Just the attribute load_data_files reads before it validates (pyinfra's HostData is not needed for that)."""

    def __init__(self, wheel_matrix: str | None):
        self.wheel_matrix = wheel_matrix

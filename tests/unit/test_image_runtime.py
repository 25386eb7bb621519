"""The smoke test and the bench cases inside an image's runtime on a node (cdna2/images/runtime.py): the commands it
sends run here by a real shell, against files laid out as ``python -m cdna2.images deploy`` leaves them. No
Singularity/Apptainer can run here: ``FAKE_RUNTIME`` is a test double for one (it records its arguments and prints a
report)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cdna2.host.digests import file_sha256
from cdna2.images.layer import LayerFiles, launch_arguments
from cdna2.images.runtime import (RuntimeCheckError, bench_command, hash_command, hash_problem, launch_of,
                                  probe_command, read_probe, read_report, smoke_command)

SITE = "opt/venv/lib/python3.11/site-packages"
REPORT = {"passed": 3, "failed": 0, "wrong": 0, "skipped": 1,
          "checks": [{"name": "gfx90a_tree", "kind": "static", "status": "passed", "detail": "178 code objects"}]}
# Test double for singularity/apptainer: --version, and exec, which records its arguments and prints a smoke report.
FAKE_RUNTIME = f"""#!/bin/sh
if [ "$1" = --version ]; then echo "$(basename "$0") version 9.9-fake"; exit 0; fi
printf '%s\\n' "$@" > "$RUNTIME_ARGS"
echo 'runtime chatter'
echo '{json.dumps(REPORT)}'
echo 'a warning after the report' >&2
"""


@pytest.fixture
def node(tmp_path) -> dict:
    """A node's view: an image with its layer and record on a shared directory, a PATH without any runtime."""
    files = LayerFiles(tmp_path / "shared" / "vllm.sif")
    files.image.parent.mkdir()
    files.image.write_bytes(b"SIF image bytes")
    files.layer.write_bytes(b"layer bytes")
    files.record.write_text(json.dumps({
        "image_sha256": file_sha256(files.image), "layer_sha256": file_sha256(files.layer), "layer": files.layer.name,
        "files": [f"{SITE}/aiter_meta/hsa/gfx90a/fmha.co", "var/lib/cdna2/state.json"]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return {"files": files, "bin": bin_dir, "home": tmp_path / "home", "args": tmp_path / "runtime-args",
            "env": {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
                    "RUNTIME_ARGS": str(tmp_path / "runtime-args")}}


def with_runtime(node: dict, name: str) -> Path:
    path = node["bin"] / name
    path.write_text(FAKE_RUNTIME)
    path.chmod(0o755)
    return path


def on_node(node: dict, command: str) -> list[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=node["env"],
                          check=True).stdout.splitlines()


def unhashed_launch(node: dict):
    image = str(node["files"].image)
    return launch_of("n1", image, read_probe(on_node(node, probe_command(image))))


def launch(node: dict):
    """The launch as verify.py gets it on a node whose files the hashing node found as recorded."""
    found = unhashed_launch(node)
    assert hash_problem(found, on_node(node, hash_command(found))) is None
    return found


def test_the_smoke_test_runs_inside_the_runtime_on_the_records_launch_line(node):
    runtime = with_runtime(node, "apptainer")
    found = launch(node)
    files = node["files"]
    assert (found.runtime, found.version) == (str(runtime), "apptainer version 9.9-fake")
    assert (found.python, found.site_packages) == ("/opt/venv/bin/python", f"/{SITE}")
    report = read_report("n1", found, on_node(node, smoke_command(found, "gfx90a", True, "3.7.1")), "smoke")
    assert report == REPORT
    jit = node["home"] / ".cache" / "cdna2-aiter-jit" / file_sha256(files.layer)[:16]
    assert jit.is_dir()  # made on the node before the runtime binds it
    assert node["args"].read_text().splitlines() == [
        "exec", *launch_arguments(str(files.layer), str(files.image), str(jit)),
        "/usr/bin/env", "PYTHONPATH=/var/lib/cdna2/agent", "/opt/venv/bin/python", "-B", "-m", "cdna2.host.smoke",
        "--site-packages", f"/{SITE}", "--state-dir", "/var/lib/cdna2", "--host-arch", "gfx90a",
        "--expect-triton", "3.7.1", "--json"]


def test_the_bench_cases_run_inside_the_runtime_on_the_records_launch_line(node):
    with_runtime(node, "singularity")
    found = launch(node)
    files, cases = node["files"], [{"name": "prefill_4x1024", "kind": "prefill"}]
    assert read_report("n1", found, on_node(node, bench_command(found, "gfx90a", cases)), "bench") == REPORT
    jit = node["home"] / ".cache" / "cdna2-aiter-jit" / file_sha256(files.layer)[:16]
    assert node["args"].read_text().splitlines() == [
        "exec", *launch_arguments(str(files.layer), str(files.image), str(jit)),
        "/usr/bin/env", "PYTHONPATH=/var/lib/cdna2/agent", "/opt/venv/bin/python", "-B", "-m", "cdna2.host.bench",
        "--site-packages", f"/{SITE}", "--state-dir", "/var/lib/cdna2", "--host-arch", "gfx90a",
        "--cases-json", json.dumps(cases, sort_keys=True), "--json", "--skip-unapplied-patch-sets"]


def test_a_layer_whose_agent_predates_an_option_names_the_redeploy(node):
    """A layer deployed by an older controller carries an agent whose argparse refuses the options this one passes
    (bench's --skip-unapplied-patch-sets came later): the error says so and names the redeploy, not "no report"."""
    with_runtime(node, "apptainer")
    found = launch(node)
    # Test double for the old agent inside the runtime: the real argparse, without the newer option.
    (node["bin"] / "apptainer").write_text(
        "#!/bin/sh\nexec python3 -c 'import argparse; argparse.ArgumentParser(prog=\"bench\").parse_args()' "
        "--skip-unapplied-patch-sets\n")
    with pytest.raises(RuntimeCheckError) as raised:
        read_report("n1", found, on_node(node, bench_command(found, "gfx90a", [{"name": "prefill_4x1024"}])),
                    "bench")
    assert str(raised.value) == (
        f"n1: {found.layer}: the agent this layer carries is older than this controller (bench: error: unrecognized "
        f"arguments: --skip-unapplied-patch-sets): deploy the layer again (`python -m cdna2.images deploy "
        f"{found.image}`), then rerun")


def test_singularity_is_preferred_as_the_wrapper_prefers_it(node):
    with_runtime(node, "apptainer")
    singularity = with_runtime(node, "singularity")
    assert launch(node).runtime == str(singularity)


COMMANDS = [lambda found: smoke_command(found, "gfx90a", True, "3.7.1"),
            lambda found: bench_command(found, "gfx90a", [{"name": "prefill_4x1024"}])]


def test_each_files_identity_is_read_on_the_node_as_stat_gives_it(node):
    with_runtime(node, "apptainer")
    found = launch(node)
    for path, identity in ((node["files"].layer, found.layer_identity), (node["files"].image, found.image_identity)):
        status = path.stat()
        assert identity == (f"{status.st_ino} {status.st_size} {status.st_mtime_ns // 10**9}."
                            f"{status.st_mtime_ns % 10**9:09d} {status.st_ctime_ns // 10**9}."
                            f"{status.st_ctime_ns % 10**9:09d}")


@pytest.mark.parametrize("command", COMMANDS, ids=["smoke", "bench"])
def test_files_whose_identity_is_the_hashed_one_run_without_being_hashed_again(node, command):
    with_runtime(node, "apptainer")
    found = launch(node)
    hashed = node["bin"] / "sha256sum"  # a test double that records any call: none may come after the hashing
    hashed.write_text(f"#!/bin/sh\necho called >> {node['bin'] / 'sha256sum-calls'}\nexec /usr/bin/sha256sum\n")
    hashed.chmod(0o755)
    assert read_report("n1", found, on_node(node, command(found)), "smoke") == REPORT
    assert not (node["bin"] / "sha256sum-calls").exists()


def test_a_layer_edited_by_hand_before_the_run_fails_by_name_and_the_image_is_not_read(node):
    with_runtime(node, "apptainer")
    node["files"].layer.write_bytes(b"layer bytes, edited")
    found = unhashed_launch(node)
    output = on_node(node, hash_command(found))
    assert [line.split("=")[0] for line in output] == ["file0"]  # the layer only: the image is not read
    assert hash_problem(found, output) == (
        f"{node['files'].layer}: SHA-256 differs from {node['files'].record} (edited, or copied incompletely): not "
        "run; copy the files again, or roll the layer back and deploy again")


def test_an_image_that_differs_from_its_record_fails_by_name(node):
    with_runtime(node, "apptainer")
    node["files"].image.write_bytes(b"another image")
    found = unhashed_launch(node)
    assert hash_problem(found, on_node(node, hash_command(found))).startswith(
        f"{node['files'].image}: SHA-256 differs from {node['files'].record}")


def test_a_hash_that_cannot_be_read_is_no_pass(node):
    with_runtime(node, "apptainer")
    found = unhashed_launch(node)
    broken = node["bin"] / "sha256sum"  # a test double for a sha256sum that fails silently
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert hash_problem(found, on_node(node, hash_command(found))).startswith(
        f"{node['files'].layer}: could not be read to check its SHA-256 against {node['files'].record}")
    assert hash_problem(found, []).startswith(f"{node['files'].layer}: could not be read")  # no output at all


def test_a_file_written_while_it_is_hashed_is_no_pass(node):
    with_runtime(node, "apptainer")
    found = unhashed_launch(node)
    # A test double for sha256sum that appends to the layer, then hashes what it was given: the bytes it reads
    # are the recorded ones, the file after it is not.
    writer = node["bin"] / "sha256sum"
    writer.write_text(f"#!/bin/sh\nsum=$(/usr/bin/sha256sum)\nprintf x >> {node['files'].layer}\necho \"$sum\"\n")
    writer.chmod(0o755)
    assert hash_problem(found, on_node(node, hash_command(found))).startswith(
        f"{node['files'].layer}: changed while its SHA-256 was checked (identity {found.layer_identity}, then "
        f"{found.layer_identity}, then ")


def _edited_in_place_keeping_size_and_mtime(path: Path) -> None:
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    with open(path, "r+b") as file:
        file.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # what a user can set back; the ctime moves on
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)


def _replaced_by_rename(path: Path) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(path.read_bytes())  # the same bytes, even: another file
    os.utime(staged, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    staged.rename(path)


@pytest.mark.parametrize("change", [_edited_in_place_keeping_size_and_mtime, _replaced_by_rename,
                                    lambda path: path.unlink()], ids=["edited-in-place", "replaced", "removed"])
@pytest.mark.parametrize("which", ["layer", "image"])
@pytest.mark.parametrize("command", COMMANDS, ids=["smoke", "bench"])
def test_a_file_changed_after_it_was_hashed_fails_by_name_and_the_runtime_never_runs(node, command, which, change):
    """Hashed on one node, then changed before this node's launch: its identity is no longer the hashed one."""
    with_runtime(node, "apptainer")
    found = launch(node)
    path = getattr(node["files"], which)
    change(path)
    with pytest.raises(RuntimeCheckError) as raised:
        read_report("n1", found, on_node(node, command(found)), "smoke")
    hashed = found.layer_identity if which == "layer" else found.image_identity
    assert str(raised.value).startswith(
        f"n1: {path}: not the file whose SHA-256 matched {node['files'].record} in this run (identity {hashed}, now ")
    assert not node["args"].exists()


@pytest.mark.parametrize("change, message", [
    (lambda node: None, "n1: neither singularity nor apptainer is on the node's PATH"),
    (lambda node: node["files"].record.unlink(), "no layer record beside the image"),
    (lambda node: node["files"].image.unlink(), "no such file on the node"),
    (lambda node: node["files"].record.write_text('{"layer": "vllm.gfx90a-layer.sqsh"}'),
     "not a layer record this tool wrote"),
])
def test_what_cannot_run_inside_the_runtime_fails_by_name(node, change, message):
    change(node)  # and no runtime on the PATH: the record's faults are named first
    with pytest.raises(RuntimeCheckError) as raised:
        launch(node)
    assert message in str(raised.value) and str(raised.value).startswith("n1: ")


def test_a_runtime_that_prints_no_report_fails_with_its_own_words(node):
    runtime = with_runtime(node, "apptainer")
    runtime.write_text('#!/bin/sh\n[ "$1" = --version ] && echo apptainer 1 && exit 0\n'
                       'echo "FATAL: container creation failed" >&2\nexit 255\n')  # its words on stderr
    found = launch(node)
    with pytest.raises(RuntimeCheckError, match="printed no smoke report; its output ends: FATAL: container"):
        read_report("n1", found, on_node(node, smoke_command(found, None, False, "3.7.1")), "smoke")

"""Singularity/Apptainer images as deploy targets: a read-only gfx90a layer beside a .sif, never inside it.

The image is the lab's (lab/sif.py: a Debian root with the lab's venv at /opt/venv, real amd-aiter
0.1.7.post2.dev18 and vLLM 0.26.0, packed by the spec-written test helper), cached per machine and hard-linked into
each test's directory. No container runtime exists here: the kernel's SquashFS and overlay filesystems, mounted in a
private mount namespace as root, stand in for it (``python -m cdna2.images``). One deploy is shared by the tests
that read its result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from cdna2.host.digests import file_sha256
from cdna2.images.layer import LayerFiles, pack_layer
from lab import images, kinds, sif as lab_sif, sif_runtime, wheelhouse
from lab.labstate import LabPaths
from tests.lab.conftest import run_lab_command
from tests.lab.deploy_runner import REPO, run_in_allocation, run_pyinfra

pytestmark = [pytest.mark.containers, pytest.mark.slow]

SYLABS = REPO / "tests" / "unit" / "fixtures" / "sylabs-sif"
# Away from the shared lab (.10), scratch labs (.20 up) and the others; its Slurm's ports from .90 % 8, not the Slurm
# lab's (.80, tests/lab/test_slurm.py)
RUNTIME_LAB_SUBNET = f"{kinds.LAB_NET}.90"
RUNTIME_NODES = ["mi210-a", "mi210-b"]


def images_cli(*args: str, timeout: int = 1200, env: dict | None = None) -> tuple[int, dict, str]:
    """``python -m cdna2.images ARGS --json``: exit status, the JSON result, stderr."""
    result = subprocess.run([sys.executable, "-m", "cdna2.images", *args, "--json"], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout, env=env)
    return result.returncode, json.loads(result.stdout), result.stderr


def listing(directory: Path) -> dict[str, str]:
    return {path.name: file_sha256(path) for path in sorted(directory.iterdir())}


@pytest.fixture(scope="session")
def wheel_options() -> list[str]:
    # The lab's matrix (its ROCm stand-in's versions) and its wheelhouse, where triton 3.7.1 is: the layer carries it.
    return ["--wheels", str(wheelhouse.wheel(wheelhouse.TRITON_PINNED).parent),
            "--wheel-matrix", str(images.wheel_matrix())]


@pytest.fixture(scope="session")
def cached_image() -> Path:
    if os.geteuid() != 0 or shutil.which("mksquashfs") is None:
        pytest.skip("image targets mount the image's root: they need root and squashfs-tools (bin/setup)")
    return lab_sif.venv_sif()


def image_copy(cached: Path, directory: Path) -> Path:
    """The cached image in ``directory`` as vllm.sif: a hard link (the same bytes, which nothing may change)."""
    image = directory / "vllm.sif"
    try:
        os.link(cached, image)
    except OSError:
        shutil.copyfile(cached, image)
    return image


@pytest.fixture(scope="session")
def deployed(cached_image, wheel_options) -> dict:
    # Not under /tmp: the runtime lab's host sees this directory as nodes see a shared filesystem (it has its own /tmp)
    directory = wheelhouse.cache_root() / "scratch-sif" / uuid.uuid4().hex[:12]
    directory.mkdir(parents=True)
    try:
        image = image_copy(cached_image, directory)
        before = file_sha256(image)
        status, outcome, stderr = images_cli("deploy", str(image), *wheel_options)
        assert status == 0, stderr[-5000:]
        yield {**outcome, "sha256_before": before, "path": image}
    finally:
        shutil.rmtree(directory)


@pytest.fixture(scope="module", autouse=True)
def early_deploys(request, cached_image, wheel_options, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The deploy of an image without AITER, started in a thread of its own as this module starts when a selected
    test reads it (``aiterless_deploy``): a deploy waits on mounts, pip and pyinfra as much as it computes, and this
    one shares nothing with the module's other deploys (its own image copy, mounts and scratch)."""
    wanted = any("aiterless_deploy" in item.fixturenames for item in request.session.items
                 if getattr(item, "module", None) is request.module)
    directory = tmp_path_factory.mktemp("aiterless")

    def deploy() -> tuple[Path, str, tuple[int, dict, str]]:
        image = image_copy(lab_sif.venv_sif(with_aiter=False), directory)
        before = file_sha256(image)
        return image, before, images_cli("deploy", str(image), *wheel_options)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-deploys") as pool:
        yield {"aiterless": pool.submit(deploy)} if wanted else {}


@pytest.fixture(scope="module")
def aiterless_deploy(early_deploys) -> tuple[Path, str, tuple[int, dict, str]]:
    """The image without AITER, its SHA-256 before the deploy, and the deploy's answer (images_cli)."""
    return early_deploys["aiterless"].result()


def test_the_layer_holds_only_what_the_deploy_changed(deployed):
    files = LayerFiles(deployed["path"])
    assert deployed["status"] == "written" and files.layer.exists() and files.wrapper.exists()
    assert file_sha256(files.layer) == deployed["layer_sha256"] == json.loads(files.record.read_text())["layer_sha256"]
    listed = subprocess.run(["unsquashfs", "-lln", "-d", "", str(files.layer)], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    # "-rw-r--r-- 0/0 1234 2023-11-14 22:13 /path" (a whiteout: "crw-r--r-- 0/0 0, 0 ..."; a link: "... -> target")
    in_layer = sorted(re.search(r" \d\d:\d\d /(.*?)(?: -> .*)?$", line)[1] for line in listed if line[:1] in "-lc")
    assert in_layer == deployed["files"]
    site = "opt/venv/lib/python3.11/site-packages/"
    gfx90a = [name for name in in_layer if name.startswith(site + "aiter_meta/hsa/gfx90a/")]
    assert len([name for name in gfx90a if name.endswith(".co")]) == 178
    assert {site + "vllm/_aiter_ops.py", site + "triton-3.7.1.dist-info/METADATA",
            "var/lib/cdna2/state.json"} <= set(in_layer)
    # Nothing of the image that stayed as it was, and none of the run's scratch.
    assert not [name for name in in_layer if "/gfx942/" in name or name.startswith(("tmp/", "root/"))
                or "__pycache__" in name or name.endswith("lease.json")]


def test_image_and_layer_pass_the_static_smoke_and_patch_check_with_the_images_python(deployed):
    status, result, stderr = images_cli("check", str(deployed["path"]))
    assert status == 0 and result["status"] == "ok", stderr[-3000:]
    checks = {check["name"]: check for check in result["smoke"]["checks"]}
    for name in ("gfx90a_tree", "code_objects_gfx90a", "manifests_complete", "patch_sets_applied", "record_pristine",
                 "triton_version"):
        assert checks[name]["status"] == "passed", checks[name]
    assert result["smoke"]["failed"] == 0 and result["python"] == "3.11"
    assert all(check["detail"].startswith("skipped: no GPU") for check in checks.values() if check["kind"] == "gpu")
    patched = {entry["package"]: entry for entry in result["patch_check"]["packages"]}
    assert {"amd-aiter", "vllm"} <= set(patched)


def test_a_rerun_changes_nothing(deployed, wheel_options):
    directory = deployed["path"].parent
    before = {path.name: path.stat().st_mtime_ns for path in directory.iterdir()}
    status, outcome, stderr = images_cli("deploy", str(deployed["path"]), *wheel_options)
    assert status == 0 and outcome["status"] == "unchanged", stderr[-3000:]
    assert {path.name: path.stat().st_mtime_ns for path in directory.iterdir()} == before


def test_the_wrapper_runs_the_runtime_with_the_layer_read_only_and_a_jit_dir_per_user(deployed, tmp_path):
    # A stand-in for singularity/apptainer (neither can run here): it prints the arguments it was given.
    runtime = tmp_path / "runtime-stand-in"
    runtime.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    runtime.chmod(0o755)
    files = LayerFiles(deployed["path"])
    home = tmp_path / "home"
    result = subprocess.run([str(files.wrapper), "exec", "python", "-c", "pass"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(home), "CDNA2_RUNTIME": str(runtime)},
                            check=True)
    jit = home / ".cache" / "cdna2-aiter-jit" / deployed["layer_sha256"][:16]
    assert result.stdout.splitlines() == [
        "exec", "--overlay", f"{files.layer}:ro", "--bind", str(jit), "--env", f"AITER_JIT_DIR={jit}",
        "--env", "VLLM_ROCM_USE_AITER_FP4BMM=0", "--env", "VLLM_ROCM_USE_AITER_FP8BMM=0", str(files.image),
        "python", "-c", "pass"]
    assert jit.is_dir()


def test_a_layer_edited_by_hand_is_refused_by_name_and_nothing_is_written(deployed, wheel_options):
    files = LayerFiles(deployed["path"])
    data = bytearray(files.layer.read_bytes())
    original = data[-1]
    data[-1] ^= 0xFF
    files.layer.write_bytes(bytes(data))
    try:
        before = listing(files.image.parent)
        for action in (("deploy", str(files.image), *wheel_options), ("check", str(files.image))):
            status, result, _ = images_cli(*action)
            assert status == 1 and result["error"].startswith(f"{files.layer}: edited since it was written")
        assert listing(files.image.parent) == before
    finally:
        data[-1] = original
        files.layer.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def runtime_lab() -> dict:
    """Two lab hosts with the lab's stand-in for Apptainer on their PATH (./lab/up --sif-runtime), reached over SSH
    and through the lab's real Slurm (--slurm), as LUMI's nodes are. They share one Python environment (--shared:
    one venv to build, not two; the checks run with the image's own Python). Both see the image's directory at the
    same path: the machine's own filesystem, outside what each host binds for itself (/tmp, /opt/venv, ...)."""
    lab_dir = wheelhouse.cache_root() / "scratch-labs" / f"sif-runtime-{uuid.uuid4().hex[:12]}"
    try:
        run_lab_command("up", str(len(RUNTIME_NODES)), "--shared", str(len(RUNTIME_NODES)), "--slurm",
                        "--sif-runtime", "--subnet", RUNTIME_LAB_SUBNET, lab_dir=lab_dir)
        yield {**json.loads((lab_dir / "lab.json").read_text()), "paths": LabPaths(lab_dir)}
    finally:
        run_lab_command("down", lab_dir=lab_dir, check=False)


@pytest.mark.lab
def test_verify_and_bench_run_inside_the_runtime_on_the_nodes_and_name_it(deployed, runtime_lab, tmp_path,
                                                                         monkeypatch):
    """verify.py in a Slurm allocation of both nodes (inventory/slurm.py), the image and its layer on the directory
    both see: the smoke test runs inside the runtime on each node (the lab's stand-in) with the layer; the GPU
    checks are skipped (the lab's GPUs are stand-ins), the static ones pass. The image and the layer are hashed on
    one node; the other checks their identity only. bench.py over SSH runs the same smoke test inside the runtime
    first, then skips every case with that reason, both reports naming the runtime. verify.py with the layer edited
    by hand fails every node, naming the layer."""
    monkeypatch.setenv("CDNA2_LAB_DIR", runtime_lab["lab_dir"])
    files = LayerFiles(deployed["path"])
    arguments = ("-y", "verify.py", "--data", f"sif_image={files.image}")
    run = run_in_allocation(runtime_lab, *arguments, report_dir=tmp_path, nodes=len(RUNTIME_NODES))
    assert run.returncode == 0, run.output[-3000:]
    hashed_by = {run.row(node)["details"]["runtime"].pop("hashed_by") for node in RUNTIME_NODES}
    assert len(hashed_by) == 1 and hashed_by <= set(RUNTIME_NODES), hashed_by  # one node read the files
    (hasher,) = hashed_by
    # The hashing node's own step, and no other step on one node alone: the node's probe, the runtime's probe and
    # the smoke test are one step across both nodes each.
    steps = run.report["transport"]
    assert (steps["node_steps_by_node"], steps["fanout_steps"], steps["fanout_nodes"]) == ({hasher: 1}, 3, 6), steps
    for node in RUNTIME_NODES:
        row = run.row(node)
        runtime = row["details"]["runtime"]
        identities = runtime.pop("image_identity"), runtime.pop("layer_identity")
        assert identities == (identity(files.image), identity(files.layer))
        assert runtime == {
            "runtime": f"{sif_runtime.PATH_DIR}/apptainer", "version": sif_runtime.VERSION_LINE,
            "image": str(files.image), "image_sha256": deployed["sha256_before"], "layer": str(files.layer),
            "layer_sha256": deployed["layer_sha256"], "python": "/opt/venv/bin/python",
            "site_packages": "/opt/venv/lib/python3.11/site-packages"}
        assert row["steps"]["verify"]["status"] == "ok"
        assert row["steps"]["verify"]["detail"].startswith(f"smoke inside {sif_runtime.VERSION_LINE}: ")
        # The packages and Python shown are the image's, as the smoke test inside it read them, not the node's own.
        assert row["python"] == f"/opt/venv/bin/python (inside {files.image})"
        assert row["packages"] == row["details"]["smoke"]["versions"]
        assert (row["packages"]["amd-aiter"], row["packages"]["triton"]) == ("0.1.7.post2.dev18", "3.7.1")
        checks = {check["name"]: check for check in row["details"]["smoke"]["checks"]}
        for name in ("gfx90a_tree", "code_objects_gfx90a", "manifests_complete", "patch_sets_applied",
                     "triton_version"):
            assert checks[name]["status"] == "passed", checks[name]
        gpu = [check for check in checks.values() if check["kind"] == "gpu"]
        assert gpu and all(check["status"] == "skipped" for check in gpu)

    benched = run_pyinfra("-y", "bench.py", *arguments[2:], "--data", "smoke_gpu_checks=false", "--limit",
                          "mi210-a", report_dir=tmp_path)
    assert benched.returncode == 0, benched.output[-3000:]
    entry = next(entry for entry in json.loads((tmp_path / "bench-latest.json").read_text())["hosts"]
                 if entry["host"] == "mi210-a")
    assert entry["runtime"] == benched.row("mi210-a")["details"]["runtime"]
    assert (entry["runtime"]["hashed_by"], entry["runtime"]["runtime"]) == (
        "mi210-a", f"{sif_runtime.PATH_DIR}/apptainer")
    reason = f"the smoke test inside {sif_runtime.VERSION_LINE} ran without GPU checks (smoke_gpu_checks is off"
    assert entry["status"] == "skipped" and entry["reason"].startswith(reason), entry
    assert entry["cases"] and all(case["status"] == "skipped" for case in entry["cases"])
    assert benched.row("mi210-a")["steps"]["smoke"]["detail"].startswith(f"inside {sif_runtime.VERSION_LINE}: ")
    assert benched.row("mi210-a")["steps"]["smoke"]["status"] == "ok"
    assert benched.row("mi210-a")["steps"]["bench"]["status"] == "skipped"
    assert (f"- mi210-a: {sif_runtime.VERSION_LINE} ({sif_runtime.PATH_DIR}/apptainer), {files.image} (SHA-256 "
            f"{deployed['sha256_before']}) with {files.layer}") in (tmp_path / "bench-latest.md").read_text()

    data = bytearray(files.layer.read_bytes())
    data[-1] ^= 0xFF
    files.layer.write_bytes(bytes(data))
    try:
        edited = run_in_allocation(runtime_lab, *arguments, report_dir=tmp_path, nodes=len(RUNTIME_NODES))
    finally:
        data[-1] ^= 0xFF
        files.layer.write_bytes(bytes(data))
    assert edited.returncode != 0, edited.output[-3000:]
    details = {node: edited.row(node)["steps"]["verify"] for node in RUNTIME_NODES}
    assert all(detail["status"] == "failed" for detail in details.values()), details
    # One node hashed the edited layer; the other has its verdict, both name the layer and its record.
    assert all(detail["detail"].startswith(f"{node}: {files.layer}: SHA-256 differs from {files.record}")
               for node, detail in details.items()), details
    assert sum(detail["detail"].endswith("which sees the same file)") for detail in details.values()) == 1, details


def identity(path: Path) -> str:
    """What the nodes read as the file's identity (cdna2.images.runtime.IDENTITY): inode, size, mtime, ctime (ns)."""
    status = path.stat()
    return (f"{status.st_ino} {status.st_size} {status.st_mtime_ns // 10**9}.{status.st_mtime_ns % 10**9:09d} "
            f"{status.st_ctime_ns // 10**9}.{status.st_ctime_ns % 10**9:09d}")


def test_the_runtime_stand_in_honours_the_layers_whiteouts_and_opaque_directories(cached_image, tmp_path):
    """lab/sif_runtime.py (a test double for Apptainer) with a layer holding both: the whited-out file is gone, the
    opaque directory shows only the layer's files, the root is read-only, a --bind is writable, --env is set."""
    tree = tmp_path / "layer"
    (tree / "etc").mkdir(parents=True)
    os.mknod(tree / "etc" / "debian_version", 0o644 | stat.S_IFCHR, os.makedev(0, 0))  # an overlayfs whiteout
    (tree / "usr/share/doc").mkdir(parents=True)
    os.setxattr(tree / "usr/share/doc", "trusted.overlay.opaque", b"y")
    (tree / "usr/share/doc/only-this").write_text("the layer's\n")
    layer = tmp_path / "layer.sqsh"
    pack_layer(tree, layer, lab_sif.EPOCH)
    (tmp_path / "bound").mkdir()

    def stand_in(*arguments: str) -> list[str]:
        result = subprocess.run([sys.executable, "-P", str(REPO / "lab" / "sif_runtime.py"), "exec", *arguments],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    # The image alone has both: the file, and a /usr/share/doc of many packages.
    assert int(stand_in(str(cached_image), "/bin/sh", "-ec", "test -f /etc/debian_version; ls /usr/share/doc | wc -l"
                        )[0]) > 10
    script = ("test ! -e /etc/debian_version; ls /usr/share/doc; echo $GREETING; "
              "touch /etc/x 2>/dev/null || echo read-only; touch /root/.cache/bound/y && echo bound")
    assert stand_in("--overlay", f"{layer}:ro", "--env", "GREETING=hello", "--bind",
                    f"{tmp_path / 'bound'}:/root/.cache/bound", str(cached_image), "/bin/sh", "-ec", script) == [
        "only-this", "hello", "read-only", "bound"]
    assert (tmp_path / "bound" / "y").exists()


def test_rollback_leaves_no_layer_and_a_new_deploy_writes_the_same_bytes(deployed, wheel_options):
    """Last of the shared deploy's tests: it removes the layer, then writes it again from the image alone."""
    image = deployed["path"]
    status, result, _ = images_cli("rollback", str(image))
    assert status == 0 and sorted(Path(path).name for path in result["removed"]) == [
        "vllm.gfx90a-layer.json", "vllm.gfx90a-layer.sqsh", "vllm.gfx90a-run.sh"]
    assert [path.name for path in image.parent.iterdir()] == ["vllm.sif"]
    status, outcome, stderr = images_cli("deploy", str(image), *wheel_options)
    assert status == 0 and outcome["status"] == "written", stderr[-3000:]
    assert outcome["layer_sha256"] == deployed["layer_sha256"]  # reproducible: same image, same tool, same bytes
    assert file_sha256(image) == deployed["sha256_before"] == outcome["image_sha256"]


def test_a_dry_run_shows_the_diffs_and_writes_nothing(cached_image, wheel_options, tmp_path):
    image = image_copy(cached_image, tmp_path)
    status, outcome, stderr = images_cli("deploy", str(image), "--dry", *wheel_options)
    assert status == 0 and outcome["status"] == "dry", stderr[-3000:]
    assert "+++ " in stderr and "gfx90a" in stderr  # the patch plans' unified diffs
    assert [path.name for path in tmp_path.iterdir()] == ["vllm.sif"]


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_text("#!/bin/sh\necho hello\n"), "not a SIF file"),
    (lambda path: path.write_bytes((SYLABS / "one-group.sif").read_bytes()[:38000]), "truncated SIF file"),
    (lambda path: shutil.copyfile(SYLABS / "one-group.sif", path),
     "the image has no Python at /opt/venv/bin/python"),
])
def test_an_image_that_cannot_get_a_layer_is_refused_naming_the_file(tmp_path, cached_image, make, message):
    image = tmp_path / "broken.sif"
    make(image)
    status, result, stderr = images_cli("deploy", str(image), timeout=120)
    assert status == 1 and result["error"].startswith(f"{image}: ") and message in result["error"], stderr
    assert [path.name for path in tmp_path.iterdir()] == ["broken.sif"]


def test_an_image_without_aiter_is_refused_unless_wheels_are_given(tmp_path, cached_image):
    # A root with a real Python interpreter and an empty venv site-packages: no amd-aiter in it.
    root = tmp_path / "root"
    (root / "opt/venv/bin").mkdir(parents=True)
    (root / "opt/venv/lib/python3.11/site-packages").mkdir(parents=True)
    shutil.copy(os.path.realpath(sys.executable), root / "opt/venv/bin/python")
    squashfs = tmp_path / "root.squashfs"
    pack_layer(root, squashfs, lab_sif.EPOCH)
    directory = tmp_path / "images"
    directory.mkdir()
    image = directory / "no-aiter.sif"
    lab_sif.pack_sif(squashfs, image)
    status, result, _ = images_cli("deploy", str(image), timeout=120)
    assert status == 1 and result["error"].startswith(f"{image}: no amd-aiter in opt/venv/lib/python3.11/site-packages")
    assert "--wheels DIR" in result["error"] and [path.name for path in directory.iterdir()] == ["no-aiter.sif"]


def test_an_image_without_aiter_gets_the_matrix_aiter_and_triton_in_its_layer(aiterless_deploy):
    # LUMI's current images have no AITER: the wheels step installs the matrix's amd-aiter and triton 3.7.1 into
    # the layer, and a second run inside the same root translates and patches it.
    image, before, (status, outcome, stderr) = aiterless_deploy
    assert status == 0 and outcome["status"] == "written", stderr[-3000:]
    site = "opt/venv/lib/python3.11/site-packages/"
    assert {site + "amd_aiter-0.1.7.post2.dev18.dist-info/RECORD", site + "triton-3.7.1.dist-info/RECORD",
            site + "vllm/_aiter_ops.py"} - set(outcome["files"]) == {site + "vllm/_aiter_ops.py"}  # no vLLM there
    assert len([name for name in outcome["files"] if "/hsa/gfx90a/" in name and name.endswith(".co")]) == 178
    status, result, stderr = images_cli("check", str(image))
    assert status == 0 and result["status"] == "ok", stderr[-3000:]
    assert file_sha256(image) == before


def test_an_image_whose_rocm_the_matrix_does_not_cover_is_refused_by_name(cached_image, tmp_path):
    # The packaged matrix cut down to its ROCm 6.3 entry: the image's ROCm (the lab's 7.14.0 stand-in) is not in it.
    packaged = yaml.safe_load((REPO / "cdna2/data/wheel-matrix.yaml").read_text())
    packaged["rocm"] = [entry for entry in packaged["rocm"] if entry["version"] == "6.3"]
    matrix = tmp_path / "wheel-matrix.yaml"
    matrix.write_text(yaml.safe_dump(packaged))
    directory = tmp_path / "images"
    directory.mkdir()
    image = image_copy(lab_sif.venv_sif(with_aiter=False), directory)
    status, result, _ = images_cli("deploy", str(image), "--wheels", str(tmp_path), "--wheel-matrix", str(matrix))
    # The image first, then the deploy's own refusal (of the host pyinfra saw: the image's root, mounted).
    assert status == 1 and result["error"].startswith(f"{image}: the deploy inside the image failed: @chroot/")
    assert "ROCm 7.14.0 (from /opt/rocm/.info/version) is not in the wheel matrix" in result["error"]
    assert [path.name for path in directory.iterdir()] == ["vllm.sif"]

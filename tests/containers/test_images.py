"""Container images and running containers as deploy targets, on a real engine (issue 15).

One deploy of the lab's base image is shared by the tests that read its result; the others start from the base
image or the tagged result themselves. Every run goes through pyinfra's own ``@docker`` connector.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.containers.conftest import all_image_ids, deploy_image, image_tag_for, run_in_image
from tests.lab.deploy_runner import run_pyinfra

pytestmark = [pytest.mark.lab, pytest.mark.containers]

PORTABLE_KERNELS = 178  # of amd-aiter 0.1.7.post2.dev18, before the hazard policy (tests/unit/kernels/test_real_tree.py)

# Run inside an image: the gfx90a tree (kernel count and digest), the patched vLLM gate, the triton version.
INSPECT_SCRIPT = """
import json, sys, sysconfig
from importlib import metadata
from pathlib import Path
from cdna2.host.digests import file_sha256, tree_digest
site = Path(sysconfig.get_paths()["purelib"])
patched = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
hsa = site / "aiter_meta" / "hsa" / "gfx90a"
gate = (site / "vllm" / "_aiter_ops.py").read_text()
print(json.dumps({
    "kernels": sorted(str(p.relative_to(hsa)) for p in hsa.rglob("*.co")) if hsa.is_dir() else None,
    "digest": tree_digest(hsa) if hsa.is_dir() else None,
    "gate": "def is_aiter_attention_supported() -> bool:" in gate,
    "triton": metadata.version("triton"),
    "patched_files": {path: file_sha256(site / path) for path in patched},
    "lease": json.loads(lease.read_text()) if (lease := Path("/var/lib/cdna2/lease.json")).exists() else None,
}))
"""

# Run inside an image: every amd-aiter and vllm file against its RECORD, and what is left of the deploy.
RECORD_SCRIPT = """
import json, sysconfig
from importlib import metadata
from pathlib import Path
from cdna2.host.distributions import record_mismatches
site = Path(sysconfig.get_paths()["purelib"])
result = {}
for name in ("amd-aiter", "vllm"):
    dist = metadata.distribution(name)
    result[name] = record_mismatches(site, dist.read_text("RECORD"))
result["gfx90a"] = (site / "aiter_meta" / "hsa" / "gfx90a").exists()
state_dir = Path("/var/lib/cdna2")
result["state_dir"] = sorted(p.name for p in state_dir.iterdir()) if state_dir.exists() else []
print(json.dumps(result))
"""


def image_row(run, source: str) -> dict:
    return run.row(f"@docker/{source}")


def test_deploy_tags_the_committed_image_and_reports_it(deployed, base_image, docker):
    row = image_row(deployed, base_image)
    outcome = row["details"]["image"]
    tag = image_tag_for(base_image)
    assert outcome["source"] == base_image and outcome["source_id"] == docker.image_id(base_image)
    assert outcome["tag"] == tag and outcome["action"] == "tag"
    inspected = json.loads(docker.run("image", "inspect", tag))[0]
    assert tag in inspected["RepoTags"]
    assert inspected["Id"] == outcome["result_id"] == outcome["committed_id"] != outcome["source_id"]
    assert row["steps"]["image"]["status"] == "changed"
    assert tag in row["steps"]["image"]["detail"] and base_image in row["steps"]["image"]["detail"]


def test_the_arch_comes_from_data_and_gpu_checks_say_why_they_are_skipped(deployed, base_image):
    row = image_row(deployed, base_image)
    assert row["arch"] == "gfx90a" and row["gpus"] == []  # the image's rocminfo finds no GPU without /dev/kfd
    gpu_checks = [check for check in row["details"]["smoke"]["checks"] if check["kind"] == "gpu"]
    assert gpu_checks and all(check["status"] == "skipped" for check in gpu_checks)
    assert all(check["detail"].startswith("skipped: no GPU at build time") for check in gpu_checks)
    assert row["details"]["smoke"]["failed"] == 0 and row["details"]["smoke"]["passed"] > 0


def test_the_tagged_image_holds_the_translated_tree_and_the_patched_gate(deployed, base_image):
    row = image_row(deployed, base_image)
    # Every file the patch plans changed, with the hash the plan gave its patched text.
    patched = {change["path"]: change["new_sha256"] for package in ("amd-aiter", "vllm")
               for change in row["details"][f"patches {package}"]["changes"]}
    seen = json.loads(run_in_image(image_tag_for(base_image), INSPECT_SCRIPT, json.dumps(patched)))
    assert len(patched) >= 2 and seen["patched_files"] == patched
    # amd-aiter 0.1.7.post2.dev18 has 178 portable kernels; the hazard policy withholds some (13 by default).
    kernels = row["details"]["kernels"]
    assert len(seen["kernels"]) == kernels["kernels"] == PORTABLE_KERNELS - kernels["withheld"]
    assert seen["digest"].startswith(re.search(r"tree ([0-9a-f]{12})", row["steps"]["kernels"]["detail"])[1])
    assert seen["gate"] is True and seen["triton"] == "3.7.1"
    # The run lease was bound to the build container (docker exec has no sshd to bind it to).
    assert seen["lease"]["connection"]["container"] is True and seen["lease"]["connection"]["pid"] == 1
    before = json.loads(run_in_image(base_image, INSPECT_SCRIPT))
    assert before["kernels"] is None and before["gate"] is False and before["triton"] == "3.7.0"


def test_redeploying_the_tagged_image_changes_nothing_and_keeps_the_tag(deployed, base_image, docker, tmp_path):
    tag = image_tag_for(base_image)
    tagged_id, images_before = docker.image_id(tag), all_image_ids(docker)
    run = deploy_image("deploy.py", tag, tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    row = image_row(run, tag)
    assert row["changes"] == [] and row["status"] == "ok"
    assert "Starting operation" not in run.output  # no operation at all: the probe alone
    assert row["details"]["image"]["action"] == "source" and row["steps"]["image"]["status"] == "unchanged"
    assert docker.image_id(tag) == tagged_id and all_image_ids(docker) == images_before


def test_verify_on_the_tagged_image_is_clean_and_leaves_no_image(deployed, base_image, docker, tmp_path):
    tag = image_tag_for(base_image)
    images_before = all_image_ids(docker)
    run = deploy_image("verify.py", tag, tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    assert image_row(run, tag)["steps"]["verify"] == {"status": "ok", "detail": "as deployed"}
    assert all_image_ids(docker) == images_before


def test_rollback_of_the_tagged_image_gives_a_record_pristine_image(deployed, base_image, docker, tmp_path):
    tag, stock_tag = image_tag_for(base_image), "local/vllm-mi210:rolled-back"
    run = deploy_image("rollback.py", tag, tmp_path, "--data", f"rollback_image_tag={stock_tag}")
    assert run.returncode == 0, run.output[-3000:]
    outcome = image_row(run, tag)["details"]["image"]
    assert outcome["tag"] == stock_tag and docker.image_id(stock_tag) == outcome["result_id"] != docker.image_id(tag)
    seen = json.loads(run_in_image(stock_tag, RECORD_SCRIPT))
    for package in ("amd-aiter", "vllm"):
        assert seen[package]["checked"] > 1000, seen[package]
        assert not seen[package]["mismatched"] and not seen[package]["missing"], seen[package]
    assert seen["gfx90a"] is False and seen["state_dir"] == []
    docker.run("image", "rm", stock_tag)


def test_a_dry_run_leaves_no_image_and_no_tag(base_image, docker, tmp_path):
    tag = "local/vllm-mi210:dry-run-must-not-exist"
    images_before = all_image_ids(docker)
    run = deploy_image("deploy.py", base_image, tmp_path, "--dry", "--data", f"image_tag={tag}")
    assert run.returncode == 0, run.output[-3000:]
    assert "docker build complete, image ID" in run.output  # pyinfra did commit one
    assert image_row(run, base_image)["details"]["image"]["action"] == "remove"
    assert all_image_ids(docker) == images_before and docker.image_id(tag) is None


def test_a_failing_run_leaves_no_tag_and_no_image(base_image, docker, tmp_path):
    tag = "local/vllm-mi210:failed-run-must-not-exist"
    images_before = all_image_ids(docker)
    run = deploy_image("deploy.py", base_image, tmp_path, "--data", f"image_tag={tag}",
                       "--data", "target_python=/opt/missing/bin/python")
    assert run.returncode != 0
    row = image_row(run, base_image)
    assert row["status"] == "failed" and "target Python /opt/missing/bin/python is missing" in " ".join(
        step["detail"] for step in row["steps"].values())
    assert row["details"]["image"]["action"] == "remove"
    assert all_image_ids(docker) == images_before and docker.image_id(tag) is None


def test_a_running_container_is_patched_in_place_and_left_running(base_image, docker, tmp_path, monkeypatch):
    name = "cdna2-test-vllm-serve"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    docker.run("run", "-d", "--network", "none", "--name", name, base_image, "sleep", "infinity")
    # STAND-IN for a container started with --device=/dev/kfd: the image's stand-in rocminfo then lists its MI210s.
    docker.run("exec", name, "touch", "/dev/kfd")
    try:
        images_before = all_image_ids(docker)
        monkeypatch.setenv("CDNA2_CONTAINERS", name)
        # The data says gfx942: the GPU the probe finds wins. Its GPUs are stand-ins, so the GPU checks are off.
        stand_in_gpus = ("--data", "gpu_arch=gfx942", "--data", "smoke_gpu_checks=false")
        run = run_pyinfra("-y", "deploy.py", "--limit", "containers", *stand_in_gpus,
                          inventory="inventory/images.py", report_dir=tmp_path)
        assert run.returncode == 0, run.output[-3000:]
        row = run.row(f"@docker/{name}")
        assert row["arch"] == "gfx90a" and len(row["gpus"]) == 2 and "AMD Instinct MI210" in row["gpus"][0]
        gpu_checks = [check for check in row["details"]["smoke"]["checks"] if check["kind"] == "gpu"]
        assert gpu_checks and all(check["detail"] == "skipped: GPU checks are off for this host (smoke_gpu_checks)"
                                  for check in gpu_checks)
        assert row["steps"]["image"]["status"] == "changed" and "left running" in row["steps"]["image"]["detail"]
        assert row["steps"]["kernels"]["status"] == "changed" and row["steps"]["patches vllm"]["status"] == "changed"
        assert json.loads(docker.run("container", "inspect", name))[0]["State"]["Running"] is True
        assert all_image_ids(docker) == images_before  # nothing committed
        hsa = "/opt/venv/lib/python3.11/site-packages/aiter_meta/hsa/gfx90a"
        inside = subprocess.run(["docker", "exec", name, "sh", "-c", f"find {hsa} -name '*.co' | wc -l"],
                                capture_output=True, text=True, check=True)
        assert int(inside.stdout) == row["details"]["kernels"]["kernels"]
        again = run_pyinfra("-y", "deploy.py", "--limit", "containers", *stand_in_gpus,
                            inventory="inventory/images.py", report_dir=tmp_path)
        assert again.returncode == 0 and again.row(f"@docker/{name}")["changes"] == []
    finally:
        docker.run("rm", "-f", name)

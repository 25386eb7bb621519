"""The lab mirror, and a plan's pip commands run for real against it in a throwaway venv.

This is the lab scenario without SSH: the real host probe reads a venv holding triton 3.7.0, the planner plans from
the lab's matrix with the mirror as the only source, the plan's exact argv lists run, and the import check passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cdna2.host import importcheck
from cdna2.probe_payload import PROBE_BOOTSTRAP, PROBE_PAYLOAD
from cdna2.wheels import load_matrix, plan_wheels
from lab import mirror, wheelhouse

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built_mirror(tmp_path_factory) -> Path:
    return mirror.build(tmp_path_factory.mktemp("mirror") / "mirror")


def test_mirror_holds_what_the_lab_matrix_names(built_mirror):
    names = {path.name for path in (built_mirror / "wheels").iterdir()}
    for requirement in (wheelhouse.AITER, wheelhouse.TRITON_BROKEN, wheelhouse.TRITON_PINNED, mirror.LAB_VLLM):
        assert wheelhouse.wheel(requirement).name in names, requirement
    assert any(name.startswith("pandas-") for name in names), "amd-aiter's dependencies must be in the mirror"
    matrix = load_matrix(built_mirror / "wheel-matrix.yaml")
    assert matrix.rocm_versions() == list(mirror.lab_rocm_versions())
    assert all(entry.package("torch") is None for entry in matrix.entries), "the lab matrix leaves torch out"
    triton_page = (built_mirror / "simple" / "triton" / "index.html").read_text()
    assert "triton-3.7.0-" in triton_page and "triton-3.7.1-" in triton_page and "#sha256=" in triton_page


def run_probe(python: Path, rocm_root: Path, tmp_path: Path) -> dict:
    options = json.dumps({"target_python": str(python), "rocm_root": str(rocm_root),
                          "state_dir": str(tmp_path / "state"), "patch_files": {}})
    result = subprocess.run([str(python), "-c", PROBE_BOOTSTRAP, "", PROBE_PAYLOAD, options], capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


def pip_from_mirror(python: Path, find_links: Path, *requirements: str) -> None:
    subprocess.run(["env", "PIP_CONFIG_FILE=/dev/null", str(python), "-m", "pip", "install", "--isolated", "-q",
                    "--no-index", "--find-links", str(find_links), "--no-deps", *requirements], check=True)


def run_plan(plan) -> None:
    for action in plan.actions:
        result = subprocess.run(list(action.argv), capture_output=True, text=True)
        assert result.returncode == 0, f"{action.description}\n{result.stderr[-3000:]}"


def test_a_triton_370_host_ends_with_371_from_the_mirror_only(built_mirror, tmp_path):
    rocm_root = tmp_path / "rocm"
    (rocm_root / ".info").mkdir(parents=True)
    (rocm_root / ".info" / "version").write_text("6.4.3-120\n")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    find_links = built_mirror / "wheels"
    pip_from_mirror(python, find_links, wheelhouse.AITER, wheelhouse.TRITON_BROKEN)
    matrix = load_matrix(built_mirror / "wheel-matrix.yaml")

    # find-links mode: pip runs with --no-index, so the mirror directory is its only source.
    plan = plan_wheels(matrix, run_probe(python, rocm_root, tmp_path), find_links=str(find_links))
    assert [action.requirement for action in plan.actions] == ["triton==3.7.1"]
    run_plan(plan)
    after = run_probe(python, rocm_root, tmp_path)
    assert after["distributions"]["triton"]["version"] == "3.7.1"
    assert plan_wheels(matrix, after, find_links=str(find_links)).actions == (), "a second run must plan nothing"
    check = subprocess.run([str(python), "-I", "-c", Path(importcheck.__file__).read_text()],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert {c["module"]: c["status"] for c in json.loads(check.stdout)["checks"]} == {
        "triton": "passed", "triton.runtime.autotuner": "passed", "aiter": "unavailable"}

    # index mode: the served PEP 503 index is the only place pip asks.
    pip_from_mirror(python, find_links, wheelhouse.TRITON_BROKEN)
    with mirror.MirrorServer(built_mirror) as server:
        plan = plan_wheels(matrix, run_probe(python, rocm_root, tmp_path), index_url=server.url)
        run_plan(plan)
        requested = server.requested_paths
    assert run_probe(python, rocm_root, tmp_path)["distributions"]["triton"]["version"] == "3.7.1"
    assert "/simple/triton/" in requested and any(path.startswith("/wheels/triton-3.7.1-") for path in requested)

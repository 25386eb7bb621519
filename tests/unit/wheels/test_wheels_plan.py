"""The wheel planner: every branch of plan_wheels, on the packaged matrix and on small matrices written here."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdna2.wheels import (DEFAULT_MATRIX_PATH, Matrix, WheelPlanError, load_matrix, pins_from_host_data,
                          plan_wheels, version_satisfies)

REPO = Path(__file__).resolve().parents[3]
PYTHON = "/opt/venv/bin/python"
ISOLATED_PIP = ["env", "PIP_CONFIG_FILE=/dev/null", PYTHON, "-m", "pip", "install", "--isolated", "--no-input",
                "--disable-pip-version-check", "--progress-bar", "off", "--no-cache-dir"]
PYPI = "https://pypi.org/simple"


def probe(rocm: str | None = "6.4.3", python_version: str = "3.11.7", **distributions) -> dict:
    """A probe as cdna2/host/probe.py reports it, with the distributions given as name=version."""
    found = {name: None for name in ("amd-aiter", "torch", "triton", "vllm", "rocm-sdk-core")}
    for key, version in distributions.items():
        name = key.replace("_", "-")
        found[name] = None if version is None else {"name": name, "version": version, "location": "/x"}
    return {
        "python": {"path": PYTHON, "target": PYTHON, "target_exists": True, "is_target": True,
                   "version": python_version, "abi": "cp311"},
        "rocm": {"version": rocm, "raw": rocm, "source": "/opt/rocm/.info/version" if rocm else None},
        "distributions": found,
    }


def matching_probe(**overrides) -> dict:
    """A ROCm 6.4.3 host that already holds exactly what the packaged matrix names."""
    versions = {"torch": "2.9.0+rocm6.4", "amd_aiter": "0.1.7.post2.dev18", "triton": "3.7.1"}
    versions.update(overrides)
    return probe(**versions)


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix()


def write_matrix(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "wheel-matrix.yaml"
    path.write_text(yaml.safe_dump({"$schema": "wheel-matrix-1.0.json", "rocm": entries}))
    return path


LAB_ENTRY = {
    "version": "6.4", "python": ["3.11"],
    "amd_aiter": {"version": "0.1.7.post2.dev18", "index_url": PYPI},
    "vllm": {"version": "0.26.0", "index_url": PYPI, "no_deps": True},
    "triton": {"version": "3.7.1", "index_url": PYPI, "no_deps": True},
}


def test_nothing_to_do_gives_an_empty_plan(matrix):
    plan = plan_wheels(matrix, matching_probe())
    assert plan.actions == (), f"a host that matches must get no pip command: {plan.to_json()}"
    assert plan.entry_version == "6.4" and plan.python == PYTHON


def test_triton_370_is_replaced_by_371_and_nothing_else(matrix):
    plan = plan_wheels(matrix, matching_probe(triton="3.7.0"))
    assert [action.package for action in plan.actions] == ["triton"]
    action = plan.actions[0]
    assert list(action.argv) == ISOLATED_PIP + ["--index-url", PYPI, "--no-deps", "triton==3.7.1"]
    assert "SIGSEGV" in action.description and "replaces the installed 3.7.0" in action.description


def test_a_triton_whose_install_was_cut_short_is_installed_again_over_it(matrix):
    cut_short = matching_probe()
    cut_short["distributions"]["triton"].update(complete=False, metadata_dir="/x/triton-3.7.1.dist-info")
    plan = plan_wheels(matrix, cut_short)
    assert [action.package for action in plan.actions] == ["triton"], "the same version, yet not installed"
    action = plan.actions[0]
    assert list(action.argv) == ISOLATED_PIP + ["--index-url", PYPI, "--no-deps", "--ignore-installed",
                                                "triton==3.7.1"]
    assert "/x/triton-3.7.1.dist-info has no RECORD: an install cut short" in action.description
    complete = matching_probe()
    complete["distributions"]["triton"]["complete"] = True
    assert plan_wheels(matrix, complete).actions == ()


def test_fresh_host_installs_everything_in_order_with_triton_last(matrix):
    plan = plan_wheels(matrix, probe())
    assert [action.package for action in plan.actions] == ["torch", "amd-aiter", "triton"]
    torch, aiter, triton = plan.actions
    assert list(torch.argv) == ISOLATED_PIP + ["--index-url", "https://download.pytorch.org/whl/rocm6.4",
                                               "torch==2.9.0+rocm6.4"]
    assert list(aiter.argv) == ISOLATED_PIP + ["--index-url", PYPI, "amd-aiter==0.1.7.post2.dev18"]
    assert triton.argv[-1] == "triton==3.7.1" and "not installed" in triton.description


def test_triton_is_reinstalled_last_when_anything_before_it_is_installed(matrix):
    plan = plan_wheels(matrix, matching_probe(amd_aiter="0.1.6"))
    assert [action.package for action in plan.actions] == ["amd-aiter", "triton"]
    assert "reinstalled last" in plan.actions[1].description


def test_local_labels_decide_whether_torch_matches(matrix):
    cpu_build = plan_wheels(matrix, matching_probe(torch="2.9.0+cpu"))
    assert [action.package for action in cpu_build.actions] == ["torch", "triton"], \
        "a CPU build of the same release is not the ROCm build the matrix names"
    assert version_satisfies("2.11.0+rocm7.14.0", "2.11.0")
    assert version_satisfies("3.7.1", "3.7.1.0")
    assert not version_satisfies("2.11.0", "2.11.0+rocm7.14.0")
    assert not version_satisfies("2.11.0+rocm7.2", "2.11.0+rocm7.14.0")
    assert not version_satisfies("not a version", "2.11.0")


def test_a_triton_with_a_local_label_of_the_pinned_release_is_kept(matrix):
    assert plan_wheels(matrix, matching_probe(triton="3.7.1+rocm7.14")).actions == ()


def test_distribution_names_are_normalised(matrix):
    host = matching_probe()
    host["distributions"]["AMD_Aiter"] = host["distributions"].pop("amd-aiter")
    host["distributions"]["Triton"] = host["distributions"].pop("triton")
    assert plan_wheels(matrix, host).actions == ()


def test_unknown_rocm_names_the_version_and_the_matrix(matrix):
    with pytest.raises(WheelPlanError) as raised:
        plan_wheels(matrix, matching_probe() | {"rocm": {"version": "5.7.1", "source": "/opt/rocm/.info/version"}})
    message = str(raised.value)
    assert "ROCm 5.7.1" in message and str(DEFAULT_MATRIX_PATH) in message, message


def test_missing_rocm_is_refused(matrix):
    with pytest.raises(WheelPlanError, match="ROCm version is unknown"):
        plan_wheels(matrix, probe(rocm=None))


def test_most_specific_entry_wins(tmp_path):
    specific = copy.deepcopy(LAB_ENTRY) | {"version": "6.4.3"}
    specific["triton"] = {"version": "3.7.1", "index_url": "https://mirror.example/simple", "no_deps": True}
    matrix = load_matrix(write_matrix(tmp_path, [LAB_ENTRY, specific]))
    assert plan_wheels(matrix, probe(rocm="6.4.3")).entry_version == "6.4.3"
    assert plan_wheels(matrix, probe(rocm="6.4.1")).entry_version == "6.4"


def test_python_outside_the_entry_is_refused(matrix):
    with pytest.raises(WheelPlanError, match=r"Python 3\.9 is not among"):
        plan_wheels(matrix, matching_probe() | {"python": probe(python_version="3.9.18")["python"]})


def test_missing_target_environment_is_refused(matrix):
    host = probe()
    host["python"] = host["python"] | {"path": "/usr/bin/python3", "target_exists": False}
    with pytest.raises(WheelPlanError, match="target Python /opt/venv/bin/python does not exist"):
        plan_wheels(matrix, host)


def test_pins_override_the_matrix(matrix):
    plan = plan_wheels(matrix, matching_probe(), pins={"torch_version": "2.8.0+rocm6.4", "aiter_version": None})
    assert [action.requirement for action in plan.actions] == ["torch==2.8.0+rocm6.4", "triton==3.7.1"]
    pinned_triton = plan_wheels(matrix, matching_probe(), pins={"triton_version": "3.7.2"})
    assert [action.requirement for action in pinned_triton.actions] == ["triton==3.7.2"]


def test_a_pin_to_the_broken_triton_is_refused(matrix):
    with pytest.raises(WheelPlanError, match="3.7.0.*SIGSEGV"):
        plan_wheels(matrix, matching_probe(), pins={"triton_version": "3.7.0"})


def test_a_pin_for_a_package_the_entry_does_not_manage_is_refused(matrix):
    with pytest.raises(WheelPlanError, match="names no torch index"):
        plan_wheels(matrix, probe(rocm="7.14.0"), pins={"torch_version": "2.11.0"})


def test_torch_is_left_alone_where_the_entry_does_not_manage_it(matrix):
    plan = plan_wheels(matrix, probe(rocm="7.14.0", torch="2.11.0+rocm7.14.0", amd_aiter="0.1.7.post2.dev18",
                                     triton="3.7.0"))
    assert [action.package for action in plan.actions] == ["triton"]


def test_mirror_find_links_only_uses_no_index(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, [LAB_ENTRY]))
    plan = plan_wheels(matrix, probe(triton="3.7.0"), find_links="/srv/wheels", install_vllm=True)
    assert [action.package for action in plan.actions] == ["amd-aiter", "vllm", "triton"]
    for action in plan.actions:
        sources = list(action.argv[len(ISOLATED_PIP):-1])
        assert sources[:3] == ["--no-index", "--find-links", "/srv/wheels"], action.argv
        assert PYPI not in action.argv, "a mirror host must not name the matrix's index"
    assert list(plan.actions[1].argv[-2:]) == ["--no-deps", "vllm==0.26.0"]


def test_mirror_index_url_replaces_every_index_and_the_wheel_file(tmp_path):
    entry = copy.deepcopy(LAB_ENTRY)
    entry["amd_aiter"]["wheel"] = "https://github.example/amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
    matrix = load_matrix(write_matrix(tmp_path, [entry]))
    direct = plan_wheels(matrix, probe())
    assert direct.actions[0].requirement == entry["amd_aiter"]["wheel"]
    mirrored = plan_wheels(matrix, probe(), index_url="http://127.0.0.1:8099/simple")
    assert mirrored.actions[0].requirement == "amd-aiter==0.1.7.post2.dev18"
    assert all(list(action.argv[len(ISOLATED_PIP):len(ISOLATED_PIP) + 2]) ==
               ["--index-url", "http://127.0.0.1:8099/simple"] for action in mirrored.actions)
    both = plan_wheels(matrix, probe(), index_url="http://127.0.0.1:8099/simple", find_links="/srv/wheels")
    assert both.sources == ("--index-url", "http://127.0.0.1:8099/simple", "--find-links", "/srv/wheels")


def test_vllm_is_managed_only_when_asked(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, [LAB_ENTRY]))
    untouched = plan_wheels(matrix, probe(amd_aiter="0.1.7.post2.dev18", triton="3.7.1", vllm="0.23.0"))
    assert untouched.actions == ()
    managed = plan_wheels(matrix, probe(amd_aiter="0.1.7.post2.dev18", triton="3.7.1", vllm="0.23.0"),
                          install_vllm=True)
    assert [action.requirement for action in managed.actions] == ["vllm==0.26.0", "triton==3.7.1"]
    with pytest.raises(WheelPlanError, match="install_vllm` is false"):
        plan_wheels(matrix, probe(), pins={"vllm_version": "0.26.0"})


def test_install_vllm_without_a_matrix_vllm_is_refused(matrix):
    with pytest.raises(WheelPlanError, match="offers no vLLM"):
        plan_wheels(matrix, matching_probe(), install_vllm=True)


def test_a_source_build_of_aiter_is_not_overwritten(matrix):
    host = matching_probe()
    host["distributions"]["amd-aiter"] = {"name": "aiter", "version": "0.1.19", "location": "/src/aiter"}
    with pytest.raises(WheelPlanError, match="source build"):
        plan_wheels(matrix, host)
    assert plan_wheels(matrix, host, pins={"aiter_version": "0.1.19"}).actions == ()


def test_a_develop_checkout_of_aiter_is_left_to_its_operator(matrix):
    host = matching_probe(triton="3.7.0")
    host["distributions"]["amd-aiter"] = {"name": "amd-aiter", "version": "0.1.19", "location": "/src/aiter",
                                          "install_mode": "develop"}
    assert [action.package for action in plan_wheels(matrix, host).actions] == ["triton"]


def test_cli_prints_the_plan_as_json(tmp_path):
    probe_file = tmp_path / "probe.json"
    probe_file.write_text(json.dumps(matching_probe(triton="3.7.0")))
    result = subprocess.run([sys.executable, "-c", "import sys; from cdna2 import wheels; import argparse; "
                             "p = argparse.ArgumentParser(); wheels.register(p.add_subparsers()); "
                             "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))",
                             "wheels", "plan", "--probe", str(probe_file), "--json"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert [action["requirement"] for action in json.loads(result.stdout)["actions"]] == ["triton==3.7.1"]


def test_pins_are_read_from_host_data_keys(matrix):
    pins = pins_from_host_data({"torch_version": "2.8.0+rocm6.4", "aiter_version": None, "install_vllm": True})
    assert pins == {"torch_version": "2.8.0+rocm6.4", "aiter_version": None, "vllm_version": None,
                    "triton_version": None}
    assert [action.requirement for action in plan_wheels(matrix, matching_probe(), pins=pins).actions] == \
        ["torch==2.8.0+rocm6.4", "triton==3.7.1"]


def test_a_default_deploy_says_which_installed_packages_it_replaces(matrix):
    """The operator's own torch and AITER are swapped for the matrix's pins: --dry's wheels lines say so."""
    plan = plan_wheels(matrix, matching_probe(torch="2.5.1+rocm6.2", amd_aiter="0.1.5", triton="3.7.1"))
    described = {action.package: action.description for action in plan.actions}
    assert list(described) == ["torch", "amd-aiter", "triton"]
    assert described["torch"].endswith("(replaces the installed 2.5.1+rocm6.2)")
    assert described["amd-aiter"].endswith("(replaces the installed 0.1.5)")
    assert described["triton"].endswith("(found 3.7.1; reinstalled last because the installs before it can replace "
                                        "triton)")

"""Host data validation: every key the deploy reads, checked before any host is touched."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from cdna2.hostdata import HostDataError, problems_for, validate_hosts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def defaults() -> dict:
    """group_data/all.py as pyinfra reads it: its public module-level names."""
    namespace = runpy.run_path(str(ROOT / "group_data/all.py"))
    return {key: value for key, value in namespace.items() if not key.startswith("__")}


def test_shipped_defaults_are_valid(defaults: dict) -> None:
    assert problems_for("node", defaults) == []


def test_misspelt_key_names_host_key_and_suggestion(defaults: dict) -> None:
    problems = problems_for("mi210-a", dict(defaults, target_pyhton="/opt/venv/bin/python"))
    assert [str(p) for p in problems] == [
        "host mi210-a: data key `target_pyhton`: unknown data key (did you mean `target_python`?)"]


@pytest.mark.parametrize("key, value, reason", [
    ("ssh_port", "22", "wrong type: expected integer"),
    ("smoke_tests", "yes", "wrong type: expected boolean"),
    ("torch_version", "2.11", None),
    ("torch_version", "2.11.0+rocm7.14.0", None),
    ("aiter_version", "0.1.7.post2.dev18", None),
    ("torch_version", "2.11.0; touch /tmp/pwned", "malformed"),
    ("vllm_version", "$(id)", "malformed"),
    ("target_python", "/opt/venv/bin/python`id`", "malformed"),
    ("target_python", "venv/bin/python", "malformed"),
    ("state_dir", "/var/lib/cdna2 /etc", "malformed"),
    ("wheel_index_url", "http://mirror.local/simple/", None),
    ("wheel_index_url", "ftp://mirror.local/simple/", "malformed"),
    ("wheel_find_links", "/srv/wheels", None),
    ("ssh_strict_host_key_checking", "off", "not allowed"),
    ("optional_patch_sets", ["ck-int8-gemm", "ck-int8-gemm"], "non-unique"),
    ("gpu_arch", "gfx90a", None),
    ("gpu_arch", "gfx1100", None),
    ("gpu_arch", "MI210", "malformed"),
    ("gpu_arch", "gfx90a; id", "malformed"),
    ("image_tag", "local/vllm-mi210:base-cdna2", None),
    ("image_tag", "registry.example:5000/vllm-mi210:0.26.0-cdna2", None),
    ("image_tag", "Local/Vllm:x", "malformed"),
    ("image_tag", "local/vllm:x $(id)", "malformed"),
    ("rollback_image_tag", "local/vllm-mi210:stock", None),
    ("docker_identifier", "e200a05f9450", None),
    ("docker_identifier", "img`id`", "malformed"),
])
def test_values(defaults: dict, key: str, value, reason: str | None) -> None:
    problems = problems_for("h", dict(defaults, **{key: value}))
    if reason is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].key == key and reason in problems[0].reason, problems


def test_one_invalid_host_fails_all_with_every_problem(defaults: dict) -> None:
    hosts = [("good", defaults), ("bad-1", dict(defaults, statedir="/x")), ("bad-2", dict(defaults, ssh_port=0))]
    with pytest.raises(HostDataError) as raised:
        validate_hosts(hosts)
    message = str(raised.value)
    assert "2 host(s); no host was changed" in message
    assert "host bad-1: data key `statedir`" in message and "host bad-2: data key `ssh_port`" in message
    assert "host good:" not in message, "a valid host must not be listed"


def test_validate_data_command_reads_debug_inventory_json(defaults: dict, tmp_path: Path) -> None:
    listing = [{"name": "n1", "groups": ["mi210"], "data": defaults},
               {"name": "n2", "groups": ["mi210"], "data": dict(defaults, install_vlm=True)}]
    (tmp_path / "inventory.json").write_text(json.dumps(listing))
    result = subprocess.run([sys.executable, "-m", "cdna2", "validate-data", str(tmp_path / "inventory.json"),
                             "--json"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False and report["problems"] == [
        {"host": "n2", "key": "install_vlm", "reason": "unknown data key (did you mean `install_vllm`?)"}]


def test_inventory_is_validated_once_and_its_error_given_to_every_host(defaults: dict, monkeypatch) -> None:
    """pyinfra runs the deploy file once per host: the whole inventory is validated on the first call only."""
    from pyinfra.api import Inventory
    from pyinfra.api.exceptions import PyinfraError

    from operations import preflight

    calls = []

    def counted(hosts) -> None:
        calls.append(list(hosts))
        validate_hosts(calls[-1])

    monkeypatch.setattr(preflight, "validate_hosts", counted)
    good = Inventory(([(f"node-{index}", {}) for index in range(16)], defaults))
    for _ in good:
        preflight.validate_inventory(good)
    assert len(calls) == 1 and len(calls[0]) == 16
    bad = Inventory(([("node-a", {}), ("node-b", {"targt_python": "/opt/venv/bin/python"})], defaults))
    for _ in bad:
        with pytest.raises(PyinfraError, match="host node-b: data key `targt_python`: unknown data key"):
            preflight.validate_inventory(bad)
    assert len(calls) == 2

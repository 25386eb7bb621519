"""The host probe, run as the deploy runs it (a fresh interpreter, JSON on stdout) over local fixture directories.

No ROCm and no GPU exist here: the ROCm tree, rocminfo and the KFD topology are fixture stand-ins written below.
The Python environment is real: fixture distributions are found through their dist-info metadata.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from cdna2.drift import find_drift
from cdna2.host import checkouts, digests, distributions, gpus, jsontext, probe, programs
from cdna2.probe_payload import PROBE_BOOTSTRAP, PROBE_PAYLOAD

FIXTURES = Path(__file__).parent / "fixtures"
# The probe as the deploy runs it: the bootstrap, no agent, the payload (then the options).
PROBE_ARGV = ["-c", PROBE_BOOTSTRAP, "", PROBE_PAYLOAD]


def write_distribution(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A minimal installed distribution: its files plus dist-info with METADATA and a RECORD that lists them."""
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append([rel, digests.record_hash(data), str(len(data))])
    rows.append([f"{dist_info.name}/RECORD", "", ""])
    with open(dist_info / "RECORD", "w", newline="") as stream:
        csv.writer(stream).writerows(rows)  # as pip writes it: a path with a comma is quoted


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    write_distribution(site, "amd-aiter", "0.1.7.post2.dev18", {
        "aiter/__init__.py": b"",
        "aiter/jit/core.py": b"GFX = 'gfx942'\n",
        "aiter_meta/hsa/gfx942/pa/pa_a.co": b"\x7fELF-a",
        "aiter_meta/hsa/gfx942/pa/pa_asm.csv": b"knl_file\npa_a.co\n",
        "aiter_meta/hsa/gfx950/pa/pa_b.co": b"\x7fELF-b",
        "aiter/configs/E=1,N=14336.json": b"{}",
    })
    write_distribution(site, "triton", "3.7.0", {"triton/__init__.py": b"__version__ = '3.7.0'\n"})
    rocm = tmp_path / "rocm"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text("6.4.3-113\n")
    return tmp_path


def install_rocminfo(rocm: Path, output_file: Path | None, exit_code: int = 0) -> None:
    """A stand-in rocminfo that prints a captured listing (there is no ROCm runtime here)."""
    (rocm / "bin").mkdir(parents=True, exist_ok=True)
    script = rocm / "bin" / "rocminfo"
    body = f"cat {shlex.quote(str(output_file))}\n" if output_file else "echo 'hsa api call failure' >&2\n"
    script.write_text(f"#!/bin/sh\n# test stand-in for ROCm's rocminfo\n{body}exit {exit_code}\n")
    script.chmod(0o755)


def run_probe(root: Path, python_path: str | None = None, **overrides) -> dict:
    options = {"target_python": sys.executable, "rocm_root": str(root / "rocm"), "state_dir": str(root / "state"),
               "kfd_topology": str(root / "kfd"), **overrides}
    env = dict(os.environ, PYTHONPATH=python_path or str(root / "site-packages"))
    # Run the file's text with -c, as the HostProbe fact does on a host without a current agent.
    result = subprocess.run([sys.executable, *PROBE_ARGV, json.dumps(options)],
                            capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


def test_rocminfo_agents_and_rocm_version(host_root: Path) -> None:
    install_rocminfo(host_root / "rocm", FIXTURES / "rocminfo-2x-mi210.txt")
    found = run_probe(host_root)
    assert found["rocm"] == {"version": "6.4.3", "raw": "6.4.3-113", "source": str(host_root / "rocm/.info/version")}
    assert found["gpu"]["arch"] == "gfx90a"
    assert found["gpu"]["agents"] == [
        {"arch": "gfx90a", "marketing_name": "AMD Instinct MI210", "compute_units": 104, "chip_id": "0x740f"},
    ] * 2, "the CPU agent must be left out and both GPU agents kept"
    assert found["gpu"]["source"].endswith("bin/rocminfo")


def test_kfd_topology_when_rocminfo_fails(host_root: Path) -> None:
    install_rocminfo(host_root / "rocm", None, exit_code=1)
    for node, properties in {"0": "cpu_cores_count 32\ngfx_target_version 0\n",
                             "1": "simd_count 416\nsimd_per_cu 4\ngfx_target_version 90010\ndevice_id 29711\n"}.items():
        (host_root / "kfd" / node).mkdir(parents=True)
        (host_root / "kfd" / node / "properties").write_text(properties)
    found = run_probe(host_root)
    assert found["gpu"]["agents"] == [{"arch": "gfx90a", "marketing_name": None, "compute_units": 104,
                                       "chip_id": "0x740f"}]
    assert "gfx_target_version" in found["gpu"]["source"]
    assert any("exited 1" in error for error in found["errors"]), found["errors"]


def write_pci_device(devices: Path, address: str, vendor: str, device: str, pci_class: str) -> None:
    """A device as /sys/bus/pci/devices shows it (there a symlink to its directory; a directory here)."""
    (devices / address).mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
        (devices / address / name).write_text(value + "\n")


def test_amd_gpus_on_the_pci_bus_are_read_only_where_no_agent_shows(host_root: Path) -> None:
    devices = host_root / "pci"
    write_pci_device(devices, "0000:87:00.0", "0x1002", "0x740f", "0x038000")  # MI210: a display controller
    write_pci_device(devices, "0000:c3:00.0", "0x1002", "0x740f", "0x038000")
    write_pci_device(devices, "0000:c3:00.1", "0x1002", "0xab28", "0x040300")  # an AMD audio function: no GPU
    write_pci_device(devices, "0000:00:14.0", "0x8086", "0x1234", "0x030000")  # another vendor's GPU
    write_pci_device(devices, "0000:05:00.0", "0x1002", "0x74a1", "0x120000")  # an accelerator-class AMD part
    install_rocminfo(host_root / "rocm", None, exit_code=1)  # the driver did not load: no agent anywhere
    found = run_probe(host_root, pci_devices=str(devices))
    assert found["gpu"]["agents"] == [] and found["gpu"]["arch"] is None
    assert found["gpu"]["pci_without_agent"] == [
        {"address": "0000:05:00.0", "device": "0x74a1", "class": "0x120000"},
        {"address": "0000:87:00.0", "device": "0x740f", "class": "0x038000"},
        {"address": "0000:c3:00.0", "device": "0x740f", "class": "0x038000"}]

    install_rocminfo(host_root / "rocm", FIXTURES / "rocminfo-2x-mi210.txt")
    found = run_probe(host_root, pci_devices=str(devices))
    assert len(found["gpu"]["agents"]) == 2 and found["gpu"]["pci_without_agent"] == []
    assert run_probe(host_root, pci_devices=str(host_root / "none"))["gpu"]["pci_without_agent"] == []


def test_distributions_from_metadata_and_kernel_tree_digests(host_root: Path) -> None:
    found = run_probe(host_root)
    site = host_root / "site-packages"
    assert found["distributions"]["amd-aiter"] == {
        "name": "amd-aiter", "version": "0.1.7.post2.dev18", "location": str(site),
        "metadata_dir": str(site / "amd_aiter-0.1.7.post2.dev18.dist-info"), "complete": True}
    assert found["distributions"]["triton"]["version"] == "3.7.0"
    assert found["distributions"]["torch"] is None and found["distributions"]["vllm"] is None
    aiter = found["aiter"]
    assert aiter["hsa_root"] == str(site / "aiter_meta/hsa")
    assert aiter["gfx942_record_files"] == 2, "only the gfx942 subtree counts, not gfx950"
    assert aiter["gfx942_record_digest"] == digests.tree_digest(site / "aiter_meta/hsa/gfx942"), \
        "the RECORD digest must equal the digest of the same tree read from disk"
    assert aiter["gfx90a_digest"] is None


IMPORTLIB_VIEW = """import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    found[name] = [dist.metadata["Name"], dist.version, str(dist.locate_file(""))]
print(json.dumps(found))
"""


def test_distributions_are_found_as_importlib_metadata_finds_them(host_root: Path) -> None:
    """The probe reads metadata by hand (importlib.metadata is slow to import): it must find what importlib finds.

    Three places on sys.path: a later site-packages with another amd-aiter (shadowed), an egg-info source build
    of AITER under the name "aiter", and a distribution whose METADATA lacks its version (reported, not found).
    """
    site, later = host_root / "site-packages", host_root / "later-site"
    write_distribution(later, "amd-aiter", "0.1.19", {"aiter/__init__.py": b""})
    write_distribution(later, "triton", "3.7.1", {"triton/__init__.py": b""})
    source_build = host_root / "aiter-src"
    (source_build / "aiter.egg-info").mkdir(parents=True)
    (source_build / "aiter.egg-info" / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: aiter\nVersion: 0.1.5.dev3+g1234\nSummary: a: colon\n\nName: body\n")
    broken = host_root / "broken-site"
    (broken / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (broken / "vllm-0.26.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\n")
    path = os.pathsep.join(map(str, (site, later, source_build, broken)))
    found = run_probe(host_root, python_path=path)
    names = ["amd-aiter", "aiter", "triton", "torch"]
    expected = json.loads(subprocess.run([sys.executable, "-c", IMPORTLIB_VIEW, *names], capture_output=True,
                                         text=True, env=dict(os.environ, PYTHONPATH=path), check=True).stdout)
    assert expected["amd-aiter"] == ["amd-aiter", "0.1.7.post2.dev18", str(site)], "the first on sys.path wins"
    assert expected["aiter"] == ["aiter", "0.1.5.dev3+g1234", str(source_build)]
    for name in ("amd-aiter", "triton"):
        dist = found["distributions"][name]
        assert [dist["name"], dist["version"], dist["location"]] == expected[name]
    assert found["distributions"]["torch"] is None and "torch" not in expected
    assert found["distributions"]["vllm"] is None
    assert any("vllm" in error and "no Name or Version" in error for error in found["errors"]), found["errors"]
    # Without amd-aiter, the source build is the AITER the probe reports.
    for metadata_dir in (site / "amd_aiter-0.1.7.post2.dev18.dist-info", later / "amd_aiter-0.1.19.dist-info"):
        metadata_dir.rename(metadata_dir.with_name("gone"))
    dist = run_probe(host_root, python_path=path)["distributions"]["amd-aiter"]
    assert [dist["name"], dist["version"], dist["location"]] == expected["aiter"]


def test_gfx90a_tree_digest_and_tampering(host_root: Path) -> None:
    gfx90a = host_root / "site-packages/aiter_meta/hsa/gfx90a/pa"
    gfx90a.mkdir(parents=True)
    (gfx90a / "pa_a.co").write_bytes(b"translated")
    first = run_probe(host_root)["aiter"]
    assert first["gfx90a_files"] == 1 and first["gfx90a_digest"] == digests.tree_digest(gfx90a.parent)
    (gfx90a / "pa_a.co").write_bytes(b"tampered!!")
    assert run_probe(host_root)["aiter"]["gfx90a_digest"] != first["gfx90a_digest"]


def test_patch_targets_carry_content_and_both_hashes(host_root: Path) -> None:
    core = host_root / "site-packages/aiter/jit/core.py"
    core.write_bytes(b"GFX = 'gfx90a'\n")  # edited after install: current hash differs from RECORD
    found = run_probe(host_root, patch_files={"amd-aiter": ["aiter/jit/core.py", "aiter/missing.py"],
                                              "vllm": ["vllm/_aiter_ops.py"]})
    entry = found["patch_targets"]["amd-aiter"]["files"]["aiter/jit/core.py"]
    assert entry["record"] == digests.record_hash(b"GFX = 'gfx942'\n")
    assert entry["current"] == digests.record_hash(b"GFX = 'gfx90a'\n")
    assert zlib.decompress(base64.b64decode(entry["content"])) == b"GFX = 'gfx90a'\n"
    assert found["patch_targets"]["amd-aiter"]["files"]["aiter/missing.py"] is None
    assert "vllm" not in found["patch_targets"], "a package that is not installed has no targets"


def test_record_rows_by_prefix_include_quoted_paths() -> None:
    record = ('aiter/a.py,sha256=a,1\n"aiter/configs/E=1,N=2.json",sha256=b,2\n'
              'aiter_meta/hsa/gfx942/x.co,sha256=c,3\n"aiter_meta/hsa/gfx942/y,z.co",sha256=d,4\n'
              'amd_aiter-1.dist-info/RECORD,,\n')
    assert distributions.record_entries(record, ("aiter_meta/hsa/gfx942/",)) == (
        ["aiter_meta/hsa/gfx942/x.co", "sha256=c", "3"], ["aiter_meta/hsa/gfx942/y,z.co", "sha256=d", "4"])
    assert [row[0] for row in distributions.record_entries(record, ("aiter/configs/E=1,N=2.json", "aiter/b.py"))] == [
        "aiter/configs/E=1,N=2.json"]
    assert len(distributions.record_entries(record)) == 5
    assert distributions.kernel_tree_root(record) == "aiter_meta/hsa"
    assert distributions.kernel_tree_root('x/nothsa/gfx942/a,sha256=a,1\n"p/hsa/gfx942/b,c",sha256=b,1\n') == "p/hsa"
    assert distributions.kernel_tree_root("aiter/a.py,sha256=a,1\n") is None


def test_recorded_state_and_unreadable_state(host_root: Path) -> None:
    (host_root / "state").mkdir()
    (host_root / "state/state.json").write_text('{"kernels": {"digest": "abc"}}')
    assert run_probe(host_root)["state"] == {"kernels": {"digest": "abc"}}
    (host_root / "state/state.json").write_text("{truncated")
    found = run_probe(host_root)
    assert found["state"] is None and any("unreadable tool state" in e for e in found["errors"])


def test_missing_target_python_is_reported_not_fatal(host_root: Path) -> None:
    found = run_probe(host_root, target_python="/nonexistent/bin/python")
    assert found["python"]["is_target"] is False and found["python"]["target_exists"] is False
    assert all(value is None for value in found["distributions"].values())
    assert any("/nonexistent/bin/python is missing" in error for error in found["errors"])


def test_rocm_from_python_wheel_when_no_rocm_tree(host_root: Path) -> None:
    write_distribution(host_root / "site-packages", "rocm-sdk-core", "7.14.0", {"_rocm_sdk_core/__init__.py": b""})
    found = run_probe(host_root, rocm_root=str(host_root / "no-rocm"))
    assert found["rocm"] == {"version": "7.14.0", "raw": "7.14.0", "source": "python wheel rocm-sdk-core"}


@pytest.mark.parametrize("target, name", [(90010, "gfx90a"), (90402, "gfx942"), (90500, "gfx950"), (90008, "gfx908")])
def test_gfx_name_from_kfd_target_version(target: int, name: str) -> None:
    assert gpus.gfx_name(target) == name


def test_record_check_names_edited_and_missing_files_but_not_our_trees(host_root: Path) -> None:
    site = host_root / "site-packages"
    clean = run_probe(host_root, record_check=["amd-aiter", "vllm"])["record_check"]
    assert clean == {"amd-aiter": {"checked": 6, "mismatched": [], "missing": [], "unproven": None}}, \
        "vllm is not installed"
    (site / "aiter/jit/core.py").write_bytes(b"edited\n")
    (site / "aiter_meta/hsa/gfx950/pa/pa_b.co").unlink()
    (site / "aiter_meta/hsa/gfx90a").mkdir()
    (site / "aiter_meta/hsa/gfx90a/x.co").write_bytes(b"ours, not in RECORD")
    found = run_probe(host_root, record_check=["amd-aiter"])["record_check"]["amd-aiter"]
    assert found == {"checked": 6, "mismatched": ["aiter/jit/core.py"],
                     "missing": ["aiter_meta/hsa/gfx950/pa/pa_b.co"], "unproven": None}


def test_a_missing_record_proves_nothing_and_verify_says_so(host_root: Path) -> None:
    """A RECORD that is gone (an install cut short) was read as empty, and "0/0 files match" passed: now the probe
    names it, the comparison is unproven, and verify's drift and the smoke test's record check fail on it."""
    record = next((host_root / "site-packages").glob("amd_aiter-*.dist-info")) / "RECORD"
    record.unlink()
    found = run_probe(host_root, record_check=["amd-aiter"])
    result = found["record_check"]["amd-aiter"]
    assert result["checked"] == 0 and "RECORD is missing" in result["unproven"], result
    assert any("amd-aiter has no RECORD" in error and "reinstall" in error for error in found["errors"])
    deployed = {"packages": {}, "patch_sets": {}, "kernels": None}
    probe = {"state": {"deployed": deployed}, "distributions": {}, "aiter": None, "backups": {},
             "patch_targets": {}, "record_check": found["record_check"]}
    (drift,) = [line for line in find_drift(probe, {}) if line.startswith("amd-aiter")]
    assert drift.startswith("amd-aiter not checked: no file of") and "reinstall it" in drift


def test_backups_of_patch_transactions_are_reported(host_root: Path) -> None:
    backup = host_root / "state/backups/vllm"
    backup.mkdir(parents=True)
    (backup / "state.json").write_text(json.dumps({
        "package": "vllm", "version": "0.26.0", "root": "/site", "jit_invalidations": [],
        "files": {"vllm/_aiter_ops.py": {"original_sha256": "aa", "patched_sha256": "bb"}},
        "created_directories": ["vllm/configs", "vllm/configs/gfx90a"]}))
    (backup / "journal.json").write_text("{}")
    found = run_probe(host_root)["backups"]
    assert found == {"vllm": {"backup_dir": str(backup), "root": "/site", "version": "0.26.0",
                              "jit_invalidations": [], "journal": True,
                              "created_directories": ["vllm/configs", "vllm/configs/gfx90a"],
                              "files": {"vllm/_aiter_ops.py": {"original_sha256": "aa", "patched_sha256": "bb"}}}}


# --- what a re-run on an unchanged host does not read or send ----------------------------------------------------

def test_a_distribution_without_its_record_is_reported_cut_short(host_root: Path) -> None:
    assert run_probe(host_root)["distributions"]["triton"]["complete"] is True
    (host_root / "site-packages/triton-3.7.0.dist-info/RECORD").unlink()  # a pip killed before it wrote RECORD
    found = run_probe(host_root)["distributions"]["triton"]
    assert (found["version"], found["complete"]) == ("3.7.0", False)


def test_patch_target_bytes_are_left_out_only_when_the_controller_holds_them(host_root: Path) -> None:
    patch_files = {"amd-aiter": ["aiter/jit/core.py", "aiter/__init__.py"]}
    first = run_probe(host_root, patch_files=patch_files)["patch_targets"]["amd-aiter"]["files"]
    known = [first["aiter/jit/core.py"]["current"]]
    second = run_probe(host_root, patch_files=patch_files, known_contents=known)["patch_targets"]["amd-aiter"]["files"]
    assert second["aiter/jit/core.py"] == dict(first["aiter/jit/core.py"], content=None)
    assert second["aiter/__init__.py"]["content"] is not None, "a file whose hash is not known is sent"
    (host_root / "site-packages/aiter/jit/core.py").write_bytes(b"GFX = 'edited'\n")
    edited = run_probe(host_root, patch_files=patch_files, known_contents=known)["patch_targets"]["amd-aiter"]
    assert file_bytes(edited["files"]["aiter/jit/core.py"]) == b"GFX = 'edited'\n", "new bytes are always sent"


def file_bytes(entry: dict) -> bytes:
    return zlib.decompress(base64.b64decode(entry["content"]))


def test_record_facts_are_reused_while_the_record_is_untouched_and_read_again_after(host_root: Path) -> None:
    patch_files = {"amd-aiter": ["aiter/jit/core.py"]}
    first = run_probe(host_root, patch_files=patch_files)
    assert first["record_facts"]["amd-aiter"]["reused"] is False
    memo = {package: {"stat": found["stat"], "facts": found["facts"]}
            for package, found in first["record_facts"].items()}
    # A memo whose facts differ from the RECORD shows that they were taken from the memo, not read again.
    memo["amd-aiter"]["facts"]["gfx942"] = ["from-the-memo", 7]
    reused = run_probe(host_root, patch_files=patch_files, record_memo=memo)
    assert reused["record_facts"]["amd-aiter"]["reused"] is True
    assert (reused["aiter"]["gfx942_record_digest"], reused["aiter"]["gfx942_record_files"]) == ("from-the-memo", 7)
    assert reused["patch_targets"] == first["patch_targets"]
    other_targets = run_probe(host_root, patch_files={"amd-aiter": ["aiter/__init__.py"]}, record_memo=memo)
    assert other_targets["record_facts"]["amd-aiter"]["reused"] is False, "other target paths: the RECORD is read"
    drift_check = run_probe(host_root, patch_files=patch_files, record_memo=memo, record_check=["amd-aiter"])
    assert drift_check["aiter"]["gfx942_record_digest"] == first["aiter"]["gfx942_record_digest"]
    record = next((host_root / "site-packages").glob("amd_aiter-*.dist-info")) / "RECORD"
    record.write_text(record.read_text())  # pip rewrote it: same text, new stat
    rewritten = run_probe(host_root, patch_files=patch_files, record_memo=memo)
    assert rewritten["record_facts"]["amd-aiter"]["reused"] is False
    assert rewritten["aiter"]["gfx942_record_digest"] == first["aiter"]["gfx942_record_digest"]


def test_kernel_digest_is_taken_from_the_install_record_only_while_the_tree_stat_matches(host_root: Path) -> None:
    gfx90a = host_root / "site-packages/aiter_meta/hsa/gfx90a"
    (gfx90a / "pa").mkdir(parents=True)
    (gfx90a / "pa/pa_a.co").write_bytes(b"translated")
    real = digests.tree_digest(gfx90a)
    state_dir = host_root / "state"
    state_dir.mkdir()
    # The recorded digest is deliberately not the tree's: a probe that reports it has trusted the stat signature.
    recorded = {"digest": "recorded", "hsa_root": str(gfx90a.parent),
                "stat_signature": digests.tree_stat_signature(gfx90a)[0]}
    (state_dir / "state.json").write_text(json.dumps({"kernels": recorded}))
    assert run_probe(host_root)["aiter"]["gfx90a_digest"] == "recorded"
    assert run_probe(host_root, record_check=["amd-aiter"])["aiter"]["gfx90a_digest"] == real, "a drift check reads"
    (gfx90a / "pa/pa_a.co").write_bytes(b"tampered!!")  # same size
    assert run_probe(host_root)["aiter"]["gfx90a_digest"] == digests.tree_digest(gfx90a) != real


def test_run_program_captures_both_streams_and_kills_on_timeout() -> None:
    assert programs.run_program(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], 5) == (3, "out\n", "err\n")
    with pytest.raises(TimeoutError, match="no exit after 0.3 s, killed"):
        programs.run_program(["/bin/sh", "-c", "exec >&- 2>&-; sleep 5"], 0.3)
    with pytest.raises(OSError):
        programs.run_program(["/nonexistent/rocminfo"], 5)


# --- the probe's own JSON, CSV and text parsing: what it does instead of importing json, csv and re ----------------

# Imported by the json, csv and re modules and by functools (which pulls in collections): together about a quarter
# of a provisioned host's probe (measured by bench/deploy when the no-op probe was made cheap). The probe must
# import none of them.
MODULES_THE_PROBE_DOES_WITHOUT = {"json", "re", "csv", "enum", "functools", "collections"}


def imported_modules(argv: list[str], env: dict[str, str]) -> set[str]:
    """The modules a fresh interpreter imports to run ``argv``, from ``-X importtime``'s report on stderr."""
    result = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env,
                            check=True)
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def test_a_probe_of_a_provisioned_host_imports_no_json_csv_or_re(host_root: Path) -> None:
    """(A patch target whose RECORD row is quoted, a path holding a comma, would import csv: no patch set has one.)"""
    install_rocminfo(host_root / "rocm", FIXTURES / "rocminfo-2x-mi210.txt")
    (host_root / "state/backups/vllm").mkdir(parents=True)
    (host_root / "state/state.json").write_text(json.dumps({"kernels": {"digest": "abc", "hsa_root": "/x"}}))
    (host_root / "state/backups/vllm/state.json").write_text(json.dumps({
        "package": "vllm", "root": "/site", "jit_invalidations": [], "files": {}}))
    env = dict(os.environ, PYTHONPATH=str(host_root / "site-packages"))
    options = json.dumps({"target_python": sys.executable, "rocm_root": str(host_root / "rocm"),
                          "state_dir": str(host_root / "state"), "kfd_topology": str(host_root / "kfd"),
                          "patch_files": {"amd-aiter": ["aiter/jit/core.py"]}})
    at_start = imported_modules(["-c", "pass"], env)
    imported = imported_modules([*PROBE_ARGV, options], env)
    assert "zlib" in imported and "hashlib" in imported, "the report lists the probe's own imports"
    assert not (imported - at_start) & MODULES_THE_PROBE_DOES_WITHOUT, sorted(imported - at_start)
    found = run_probe(host_root, patch_files={"amd-aiter": ["aiter/jit/core.py"]})
    assert found["state"]["kernels"]["digest"] == "abc" and found["backups"]["vllm"]["root"] == "/site"
    assert found["gpu"]["agents"][0]["chip_id"] == "0x740f" and found["rocm"]["version"] == "6.4.3"


def random_json_value(rng, depth: int = 0):
    alphabet = ['a', 'Z', '"', '\\', '/', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', '€', '\U0001F600', '\udcff', ' ',
                ',', ':', '{', ']', 'u', '0']

    def text(size: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(size)))

    kind = rng.randrange(7 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-10**20, 10**20)
    if kind == 2:
        return rng.choice([0.0, -1.5, 1e300, 1e-300, 1 / 3, 2.0**60, rng.random()])
    if kind in (3, 4):
        return text(12)
    if kind == 5:
        return {text(6): random_json_value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [random_json_value(rng, depth + 1) for _ in range(rng.randrange(5))]


def test_probe_json_matches_the_json_module_both_ways() -> None:
    import random
    rng = random.Random(20261201)
    for _ in range(3000):
        value = random_json_value(rng)
        written = jsontext.json_dumps(value)
        assert written == json.dumps(value, sort_keys=True, separators=(",", ":")), value
        for text in (written, json.dumps(value, indent=1), json.dumps(value, ensure_ascii=False)):
            assert jsontext.json_loads(text) == json.loads(text), text
    assert jsontext.json_dumps(("a", 1)) == '["a",1]'


@pytest.mark.parametrize("text, message", [
    ("{truncated", "expected a name at character 1"), ("", "ends inside a value"), ("[1,", "ends inside a value"),
    ('{"a" 1}', "expected ':' at character 5"), ('"abc', "unterminated string from character 0"),
    ("[1 2]", "expected ',' or ']' at character 3"), ("tru", "unexpected 't'"), ("{}x", "extra data at character 2"),
    ('"a\\qb"', "unknown escape \\q"), ("-", "not JSON"),
])
def test_probe_json_refuses_what_is_not_json(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="not JSON") as raised:
        jsontext.json_loads(text)
    assert message in str(raised.value)
    with pytest.raises(ValueError):
        json.loads(text)


def test_probe_json_writes_only_what_json_can() -> None:
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="no JSON form"):
            jsontext.json_dumps({"cpu_s": value})
    with pytest.raises(TypeError, match="set has no JSON form"):
        jsontext.json_dumps({"paths": {"a"}})
    with pytest.raises(TypeError, match="keys must be strings"):
        jsontext.json_dumps({1: "a"})


def test_hand_parsers_agree_with_the_regular_expressions_they_replace() -> None:
    import re
    names = ["amd_aiter", "amd-aiter", "AMD.Aiter", "a__b--c..d", "a-_.b", "_x_", "Triton", "rocm_sdk_core", ""]
    for name in names:
        assert distributions.canonical_name(name) == re.sub(r"[-_.]+", "-", name).lower(), name
    for text in ["6.4.3-113", "7.14.0", " 6.4", "6", "6.", "6.4.", "6.4.3.2", "x6.4", "6.4rc1", "", "10.0.1-5\n"]:
        match = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", text)
        assert gpus.parse_rocm_version(text) == (match.group(1) if match else None), text
    for url_path in ["/src/aiter", "/src/a%20b", "/src/%E2%82%AC", "/src/100%", "/src/%zz", "/src/%4", "%41%42"]:
        expected = re.sub(rb"%([0-9A-Fa-f]{2})", lambda found: bytes([int(found.group(1), 16)]),
                          url_path.encode()).decode("utf-8", errors="replace")
        assert checkouts.percent_decoded(url_path) == expected, url_path


def test_rocminfo_blocks_are_split_on_asterisk_lines_only() -> None:
    listing = (FIXTURES / "rocminfo-2x-mi210.txt").read_text()
    agents = gpus.parse_rocminfo(listing)
    assert [agent["arch"] for agent in agents] == ["gfx90a", "gfx90a"]
    # Four asterisks are no separator: the two agents stay one block, whose first fields win.
    assert len(gpus.parse_rocminfo(listing.replace("*******", "****"))) <= 1
    assert gpus.parse_rocminfo("Device Type: GPU\nName: gfx90a\nChip ID: 29711(0x740F)\n")[0]["chip_id"] == "0x740f"
    assert gpus.parse_rocminfo("Device Type: GPU\nName: gfx90a\nChip ID: 29711\n")[0]["chip_id"] is None


def test_record_entries_keeps_only_its_last_answers() -> None:
    records = [f"pkg/m{i}.py,sha256=h{i},{i}\n" for i in range(distributions._RECORD_ENTRIES_KEPT + 4)]
    assert [distributions.record_entries(text) for text in records] == [([f"pkg/m{i}.py", f"sha256=h{i}", str(i)],)
                                                                for i in range(len(records))]
    assert len(distributions._RECORD_ENTRIES) == distributions._RECORD_ENTRIES_KEPT
    assert (records[-1], ("",)) in distributions._RECORD_ENTRIES and (records[0], ("",)) not in distributions._RECORD_ENTRIES


def test_the_aiter_triton_sources_digest_is_the_records_whatever_was_patched_since(host_root: Path) -> None:
    site = host_root / "site-packages"
    assert run_probe(host_root)["triton_sources"] is None, "this AITER's RECORD lists no Triton sources"
    record = site / "amd_aiter-0.1.7.post2.dev18.dist-info" / "RECORD"
    for relative, data in (("gemm_a16w16.py", b"KERNEL = 1\n"), ("configs/gemm/gfx942-GEMM-A16W16.json", b"{}\n"),
                           ("README.md", b"not a source\n")):
        (site / "aiter/ops/triton" / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / "aiter/ops/triton" / relative).write_bytes(data)
        record.write_text(f"aiter/ops/triton/{relative},{digests.record_hash(data)},{len(data)}\n{record.read_text()}")
    pristine = digests.triton_sources_digest(site)
    assert run_probe(host_root)["triton_sources"] == pristine and len(pristine) == 64
    # Patched and added to by the aiter-triton-gfx90a set: the RECORD, and so the digest, is the wheel's.
    (site / "aiter/ops/triton/gemm_a16w16.py").write_text("KERNEL = 2  # patched\n")
    (site / "aiter/ops/triton/configs/gemm/gfx90a-GEMM-A16W16.json").write_text("{}\n")
    assert run_probe(host_root)["triton_sources"] == pristine
    assert digests.triton_sources_digest(site) != pristine

"""Host probe: everything the deploy needs to know about one host, read in one SSH round trip.

Runs on the host under the target Python (or under ``python3`` when the target environment is missing, which it
then reports), standard library only, and prints one JSON object on stdout. It never imports the packages it
inspects: distributions are read from their metadata, AITER's kernel tree from its RECORD. It never raises on a
host that is merely unusual: what it cannot read goes to ``errors`` and the field is ``null``.

Usage on the host: ``python3 probe.py '<json options>'``; the deploy sends this file's text inline with ``-c``.
The options are described by ``ProbeOptions`` below.
"""

from __future__ import annotations

import binascii
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import zlib
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path, PurePosixPath

PROBE_FORMAT = 2

# Distributions the deploy reasons about, by their PEP 503 name; the alternatives are other names the same
# software is installed under (a source build of AITER registers as "aiter").
DISTRIBUTIONS = {
    "amd-aiter": ("amd-aiter", "aiter"),
    "torch": ("torch",),
    "triton": ("triton",),
    "vllm": ("vllm",),
    "rocm-sdk-core": ("rocm-sdk-core", "rocm"),
}

# Where the KFD driver publishes its GPU nodes; gfx_target_version there is the arch as major*10000+minor*100+step.
KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


# --- digests shared with the controller (cdna2.kernels uses these very functions) ---------------------------------

# base64 by hand (binascii, which base64 itself wraps): the probe's start-up time is paid on every host every run.
_URLSAFE = str.maketrans("+/", "-_")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def record_hash(data: bytes) -> str:
    """The hash field of a wheel RECORD line for ``data``: ``sha256=<urlsafe base64, no padding>``."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + _b64(digest).translate(_URLSAFE).rstrip("=")


def file_sha256(path: Path) -> str | None:
    """Hex sha256 of a file, read in blocks; None when it is not a file."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_of_entries(entries: list[tuple[str, str, str]]) -> str:
    lines = "".join(f"{path},{hash_field},{size}\n" for path, hash_field, size in sorted(entries))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def tree_digest(root: Path) -> str:
    """Digest of every regular file under ``root``: sha256 over sorted RECORD-style lines relative to ``root``.

    A tree installed from a wheel has the same digest as ``record_tree_digest`` of the wheel's RECORD for that
    subtree, so a host's kernel tree can be compared with what its RECORD promises without reading the files twice.
    ``__pycache__`` directories are left out on both sides.
    """
    entries = []
    for directory, subdirs, files in os.walk(root):
        # Bytecode caches are derived from the sources beside them, and RECORD lists them without a hash.
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        relative_dir = os.path.relpath(directory, root)
        for file_name in files:
            path = os.path.join(directory, file_name)
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as stream:
                data = stream.read()
            relative = file_name if relative_dir == "." else f"{relative_dir}/{file_name}"
            entries.append((relative, record_hash(data), str(len(data))))
    return _digest_of_entries(entries)


@lru_cache(maxsize=16)
def record_entries(record_text: str, prefixes: tuple[str, ...] = ("",)) -> tuple[list[str], ...]:
    """[path, hash field, size] of the RECORD rows whose path starts with one of ``prefixes`` (default: every row).

    RECORD is CSV, so a path holding a comma comes quoted: such lines are always parsed, then filtered by path.
    Filtering the raw lines first keeps a probe off the CSV parse of AITER's 1.5 MB RECORD; the result is cached
    because a probe asks for the same rows more than once.
    """
    lines = [line for line in record_text.splitlines() if line.startswith(prefixes) or line.startswith('"')]
    return tuple(row if len(row) == 3 else (row + ["", ""])[:3]
                 for row in csv.reader(lines) if row and row[0].startswith(prefixes))


def record_tree_digest(record_text: str, prefix: str) -> tuple[str, int]:
    """Digest (as ``tree_digest``) and file count of the RECORD entries under ``prefix`` (ending in ``/``)."""
    rows = record_entries(record_text, (prefix,))
    entries = [(path[len(prefix):], hash_field, size) for path, hash_field, size in rows if hash_field]
    return _digest_of_entries(entries), len(entries)


# --- pieces of the probe ---------------------------------------------------------------------------------------------

def read_os() -> dict:
    release = {}
    os_release = Path("/etc/os-release")
    if os_release.is_file():
        for line in os_release.read_text(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                release[key] = value.strip().strip('"')
    uname = os.uname()
    return {
        "hostname": uname.nodename,
        "id": release.get("ID"),
        "version_id": release.get("VERSION_ID"),
        "pretty_name": release.get("PRETTY_NAME"),
        "kernel": uname.release,
        "machine": uname.machine,
    }


def read_python(target_python: str) -> dict:
    running = os.path.realpath(sys.executable)
    is_target = os.path.realpath(target_python) == running or sys.executable == target_python
    paths = {}
    if is_target:
        import sysconfig

        paths = {"purelib": sysconfig.get_paths()["purelib"]}
    return {
        "path": sys.executable,
        "target": target_python,
        "target_exists": os.access(target_python, os.X_OK),
        "is_target": is_target,
        "version": sys.version.split()[0],
        "abi": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "prefix": sys.prefix,
        "site_packages": paths.get("purelib"),
    }


def canonical_name(name: str) -> str:
    """PEP 503 normalised name: ``amd_aiter`` -> ``amd-aiter``."""
    return re.sub(r"[-_.]+", "-", name).lower()


# Installed-distribution metadata directories, and the file in each that holds the core metadata.
METADATA_DIRS = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}


def find_metadata_dirs(wanted: Collection[str], search_path: Collection[str] | None = None) -> dict[str, Path]:
    """The first metadata directory on ``sys.path`` (or ``search_path``) of each wanted (canonical) name, as
    importlib.metadata finds it.

    Read by hand rather than through importlib.metadata, whose imports alone cost more than the rest of the probe.
    """
    found: dict[str, Path] = {}
    for entry in sys.path if search_path is None else search_path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            suffix = next((suffix for suffix in METADATA_DIRS if name.endswith(suffix)), None)
            if suffix is None:
                continue
            canonical = canonical_name(name[:-len(suffix)].partition("-")[0])
            if canonical in wanted and canonical not in found:
                found[canonical] = Path(entry or ".", name)
    return found


def read_core_metadata(metadata_dir: Path) -> dict[str, str]:
    """The header fields of a distribution's METADATA (PKG-INFO): up to the first blank line, first value wins."""
    fields: dict[str, str] = {}
    file_name = next(name for suffix, name in METADATA_DIRS.items() if metadata_dir.name.endswith(suffix))
    text = (metadata_dir / file_name).read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and not line[0].isspace():
            fields.setdefault(key.strip(), value.strip())
    return fields


def installed_version(site_packages: Path, name: str) -> str | None:
    """The version of distribution ``name`` installed in ``site_packages``; None when it is not there or unreadable."""
    metadata_dir = find_metadata_dirs({canonical_name(name)}, [str(site_packages)]).get(canonical_name(name))
    try:
        return read_core_metadata(metadata_dir).get("Version") if metadata_dir else None
    except OSError:
        return None


def read_distributions(errors: list[str]) -> dict:
    found: dict[str, dict | None] = {}
    metadata_dirs = find_metadata_dirs({canonical_name(name) for names in DISTRIBUTIONS.values() for name in names})
    for canonical, candidates in DISTRIBUTIONS.items():
        found[canonical] = None
        for candidate in candidates:
            metadata_dir = metadata_dirs.get(canonical_name(candidate))
            if metadata_dir is None:
                continue
            try:
                fields = read_core_metadata(metadata_dir)
            except OSError as error:  # a broken dist-info must not hide the rest of the probe
                errors.append(f"distribution {candidate}: unreadable metadata in {metadata_dir}: {error}")
                continue
            if not fields.get("Name") or not fields.get("Version"):
                errors.append(f"distribution {candidate}: {metadata_dir} has no Name or Version")
                continue
            found[canonical] = {
                "name": fields["Name"],
                "version": fields["Version"],
                "location": str(metadata_dir.parent),
                "metadata_dir": str(metadata_dir),
            }
            break
    return found


def parse_rocm_version(text: str) -> str | None:
    """``6.4.3-74`` or ``7.14.0`` -> the dotted release; None when the text holds no version."""
    match = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def read_rocm(rocm_root: str, distributions: dict) -> dict:
    version_file = Path(rocm_root, ".info", "version")
    if version_file.is_file():
        raw = version_file.read_text(errors="replace").strip()
        return {"version": parse_rocm_version(raw), "raw": raw, "source": str(version_file)}
    wheel = distributions.get("rocm-sdk-core")
    if wheel:
        return {"version": parse_rocm_version(wheel["version"]), "raw": wheel["version"],
                "source": f"python wheel {wheel['name']}"}
    return {"version": None, "raw": None, "source": None}


def parse_rocminfo(text: str) -> list[dict]:
    """GPU agents from ``rocminfo`` output: name (gfx arch), marketing name, compute units, chip id."""
    agents = []
    for block in re.split(r"\n\*{5,}\s*\n", text):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
        if fields.get("Device Type") != "GPU":
            continue
        chip = re.search(r"0x([0-9a-fA-F]+)", fields.get("Chip ID", ""))
        agents.append({
            "arch": fields.get("Name"),
            "marketing_name": fields.get("Marketing Name"),
            "compute_units": int(fields["Compute Unit"]) if fields.get("Compute Unit", "").isdigit() else None,
            "chip_id": f"0x{chip.group(1).lower()}" if chip else None,
        })
    return agents


def gfx_name(target_version: int) -> str:
    """KFD ``gfx_target_version`` (e.g. 90010) -> ``gfx90a``: major, then minor and stepping as hex digits."""
    major, minor, stepping = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def read_kfd_topology(nodes_dir: str) -> list[dict]:
    agents = []
    nodes = Path(nodes_dir)
    for node in sorted(nodes.iterdir(), key=lambda p: p.name) if nodes.is_dir() else []:
        properties = node / "properties"
        if not properties.is_file():
            continue
        values = {}
        for line in properties.read_text(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            values[key] = value.strip()
        target = int(values.get("gfx_target_version", "0") or 0)
        if target == 0:  # CPU nodes report 0
            continue
        simd_count, simd_per_cu = int(values.get("simd_count", 0)), int(values.get("simd_per_cu", 0) or 0)
        agents.append({
            "arch": gfx_name(target),
            "marketing_name": None,
            "compute_units": simd_count // simd_per_cu if simd_per_cu else None,
            "chip_id": f"0x{int(values['device_id']):04x}" if values.get("device_id", "").isdigit() else None,
        })
    return agents


def read_gpus(rocm_root: str, kfd_topology: str, errors: list[str]) -> dict:
    agents, source = [], None
    rocminfo = Path(rocm_root, "bin", "rocminfo")
    if os.access(rocminfo, os.X_OK):
        try:
            result = subprocess.run([str(rocminfo)], capture_output=True, text=True, timeout=60)
            if result.returncode == 0:
                agents, source = parse_rocminfo(result.stdout), str(rocminfo)
            else:
                errors.append(f"{rocminfo} exited {result.returncode}: {result.stderr.strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as error:
            errors.append(f"{rocminfo}: {error}")
    if not agents:
        agents = read_kfd_topology(kfd_topology)
        source = f"{kfd_topology} gfx_target_version" if agents else source
    arches = sorted({agent["arch"] for agent in agents if agent["arch"]})
    return {"agents": agents, "source": source, "arches": arches,
            "arch": arches[0] if len(arches) == 1 else None}


def read_records(distributions: dict, errors: list[str]) -> dict[str, str]:
    """The RECORD text of every installed distribution, read once ("" when unreadable, with an error line)."""
    records = {}
    for package, dist in distributions.items():
        if dist is None:
            continue
        record = Path(dist["metadata_dir"], "RECORD")
        try:
            records[package] = record.read_text(encoding="utf-8") if record.exists() else ""
        except (OSError, UnicodeDecodeError) as error:  # a broken dist-info must not hide the rest of the probe
            errors.append(f"{dist['name']} RECORD unreadable: {error}")
            records[package] = ""
    return records


def kernel_tree_root(record_text: str) -> str | None:
    """AITER's ``hsa`` directory relative to site-packages (``aiter_meta/hsa``), from the first gfx942 RECORD row."""
    start = 0
    while (index := record_text.find("hsa/gfx942/", start)) >= 0:
        line_end = record_text.find("\n", index)
        line = record_text[record_text.rfind("\n", 0, index) + 1:None if line_end < 0 else line_end]
        for path, _, _ in record_entries(line):
            position = f"/{path}".find("/hsa/gfx942/")
            if position >= 0:
                return f"{path[:position]}hsa"
        start = index + 1
    return None


def read_aiter(dist: dict | None, record_text: str, errors: list[str]) -> dict | None:
    """AITER's kernel trees: the gfx942 tree as its RECORD promises it, and the gfx90a tree as it is on disk."""
    if dist is None:
        return None
    hsa_rel = kernel_tree_root(record_text)
    info = {"hsa_root": None, "gfx942_record_digest": None, "gfx942_record_files": 0, "gfx942_on_disk": False,
            "gfx90a_digest": None, "gfx90a_files": 0, "gfx90a_previous": False, "free_bytes": None}
    if hsa_rel is None:
        errors.append(f"{dist['name']} RECORD lists no hsa/gfx942 kernel tree")
        return info
    hsa_root = Path(dist["location"], hsa_rel)
    info["hsa_root"] = str(hsa_root)
    info["gfx942_record_digest"], info["gfx942_record_files"] = record_tree_digest(record_text, f"{hsa_rel}/gfx942/")
    info["gfx942_on_disk"] = (hsa_root / "gfx942").is_dir()
    info["gfx90a_previous"] = (hsa_root / ".gfx90a.previous").is_dir()
    info["free_bytes"] = free_bytes(hsa_root)
    gfx90a = hsa_root / "gfx90a"
    if gfx90a.is_dir():
        info["gfx90a_digest"] = tree_digest(gfx90a)
        info["gfx90a_files"] = sum(len(files) for _, _, files in os.walk(gfx90a))
    return info


def file_content(encoded: str) -> bytes:
    """The bytes of a patch target as ``read_patch_targets`` sends them (zlib, then base64)."""
    return zlib.decompress(binascii.a2b_base64(encoded))


def read_patch_targets(patch_files: dict, distributions: dict, records: dict[str, str]) -> dict:
    """For each package's candidate files: RECORD hash, current hash and content (zlib+base64), or null."""
    targets: dict[str, dict] = {}
    for package, files in patch_files.items():
        dist = distributions.get(package)
        if dist is None:
            continue
        record = {path: hash_field for path, hash_field, _ in record_entries(records[package], tuple(files))
                  if path in files}
        entries = {}
        for rel in files:
            path = Path(dist["location"], rel)
            if not path.is_file():
                entries[rel] = None
                continue
            data = path.read_bytes()
            entries[rel] = {
                "record": record.get(rel) or None,
                "current": record_hash(data),
                # Level 1: the bytes cross a local network once; level 9 cost more CPU than the rest of the probe.
                "content": _b64(zlib.compress(data, 1)),
            }
        targets[package] = {"location": dist["location"], "files": entries}
    return targets


# Files a provisioned AITER holds beyond its RECORD by design: the translated tree and its previous copy.
NOT_IN_RECORD = ("/hsa/gfx90a/", "/hsa/.gfx90a.previous/")


def record_mismatches(location: Path, record_text: str, skip_paths: Collection[str] = ()) -> dict:
    """Compare every file a RECORD lists with the disk: how many were checked, which differ or are gone.

    Not checked: bytecode, console scripts outside site-packages (``../../bin/vllm``: pip writes them per
    interpreter, ``pip install --target`` elsewhere), our own kernel trees, and ``skip_paths``.
    """
    checked, mismatched, missing = 0, [], []
    for path, hash_field, _ in record_entries(record_text):
        parts = PurePosixPath(path).parts
        if (not hash_field or path in skip_paths or "__pycache__" in parts or ".." in parts
                or any(tree in f"/{path}" for tree in NOT_IN_RECORD)):
            continue
        target = location / path
        checked += 1
        if not target.is_file():
            missing.append(path)
        elif record_hash(target.read_bytes()) != hash_field:
            mismatched.append(path)
    return {"checked": checked, "mismatched": mismatched, "missing": missing}


def read_backups(state_dir: str, errors: list[str]) -> dict:
    """The patch transactions' backup records (cdna2/host/txn.py): what was patched, and any unfinished journal."""
    backups = {}
    for record in sorted(Path(state_dir, "backups").glob("*/state.json")):
        try:
            state = json.loads(record.read_text())
        except (OSError, ValueError) as error:
            errors.append(f"{record}: unreadable patch record: {error}")
            continue
        backups[state["package"]] = {"backup_dir": str(record.parent), "root": state["root"],
                                     "version": state.get("version"),
                                     "files": state["files"], "jit_invalidations": state["jit_invalidations"],
                                     "journal": (record.parent / "journal.json").exists()}
    return backups


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged write could still use on the filesystem of ``path`` (or of its nearest parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            stats = os.statvfs(candidate)
            return stats.f_bavail * stats.f_frsize
    return None


def read_state(state_dir: str, errors: list[str]) -> dict | None:
    state_file = Path(state_dir, "state.json")
    if not state_file.is_file():
        return None
    try:
        return json.loads(state_file.read_text())
    except (OSError, ValueError) as error:
        errors.append(f"{state_file}: unreadable tool state: {error}")
        return None


def read_agent(agent_dir: str | None) -> dict:
    """Digest of this tool's host-side modules as installed on the host, to decide whether to upload them."""
    if not agent_dir or not Path(agent_dir).is_dir():
        return {"digest": None}
    return {"digest": tree_digest(Path(agent_dir))}


def probe(options: dict) -> dict:
    """Options: target_python, rocm_root, state_dir; optional agent_dir, kfd_topology, patch_files {package: [paths]},
    record_check [packages] (compare those distributions' files with their RECORD: reads every file)."""
    errors: list[str] = []
    python = read_python(options["target_python"])
    distributions = read_distributions(errors) if python["is_target"] else {name: None for name in DISTRIBUTIONS}
    records = read_records(distributions, errors)
    if not python["is_target"]:
        errors.append(f"target Python {options['target_python']} is missing or not executable; "
                      f"probed with {sys.executable} instead")
    return {
        "format": PROBE_FORMAT,
        "os": read_os(),
        "python": python,
        "rocm": read_rocm(options["rocm_root"], distributions),
        "gpu": read_gpus(options["rocm_root"], options.get("kfd_topology", KFD_TOPOLOGY), errors),
        "distributions": distributions,
        "aiter": read_aiter(distributions.get("amd-aiter"), records.get("amd-aiter", ""), errors),
        "patch_targets": read_patch_targets(options.get("patch_files", {}), distributions, records),
        "state": read_state(options["state_dir"], errors),
        "state_dir_used": Path(options["state_dir"]).is_dir() and any(Path(options["state_dir"]).iterdir()),
        "state_dir_free_bytes": free_bytes(Path(options["state_dir"], "staging")),
        "agent": read_agent(options.get("agent_dir")),
        "backups": read_backups(options["state_dir"], errors),
        "record_check": {package: record_mismatches(Path(distributions[package]["location"]), records[package])
                         for package in options.get("record_check", []) if distributions.get(package)},
        "errors": errors,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} '<json options>'", file=sys.stderr)
        return 2
    print(json.dumps(probe(json.loads(argv[1])), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""What the probe finds of the installed packages: their metadata directories and versions, their RECORDs (entries,
hashes, digests of AITER's kernel trees), the files the patch sets target, and files that differ from RECORD.
"""

from __future__ import annotations

import binascii
import os
import sys
import zlib

from cdna2.host.checkouts import checkout_path
from cdna2.host.digests import (TRITON_SOURCES, b64, digest_of_entries, is_triton_source, read_bytes, read_text,
                                record_hash, tree_digest, tree_stat_signature)
from cdna2.host.environment import free_bytes

# Distributions the deploy reasons about, by their PEP 503 name; the alternatives are other names the same
# software is installed under (a source build of AITER registers as "aiter").
DISTRIBUTIONS = {
    "amd-aiter": ("amd-aiter", "aiter"),
    "torch": ("torch",),
    "triton": ("triton",),
    "vllm": ("vllm",),
    "rocm-sdk-core": ("rocm-sdk-core", "rocm"),
}
# The packages a report shows and the deployed record keeps versions of.
RECORDED_PACKAGES = ("amd-aiter", "torch", "triton", "vllm")


def recorded_versions(distributions: dict) -> dict[str, str | None]:
    """{package: installed version or None} of RECORDED_PACKAGES, from ``read_distributions``' answer."""
    return {name: (distributions.get(name) or {}).get("version") for name in RECORDED_PACKAGES}


def _lines_starting_with(text: str, prefix: str) -> dict[int, str]:
    """The lines of ``text`` that start with ``prefix``, by offset, found by ``str.find`` (a scan in C, not a
    Python-level test of every line)."""
    lines: dict[int, str] = {}
    index = 0 if text.startswith(prefix) else text.find("\n" + prefix) + 1 or -1
    while index >= 0:
        end = text.find("\n", index)
        lines[index] = text[index:None if end < 0 else end].rstrip("\r")
        index = -1 if end < 0 else text.find("\n" + prefix, end) + 1 or -1
    return lines


def _csv_row(line: str) -> list[str]:
    """One RECORD row's fields; the csv module only for a quoted row (a path holding a comma)."""
    if '"' not in line:
        return line.split(",")
    import csv  # here, not at the top: most RECORD rows, and a provisioned host's every probe, need none
    return next(csv.reader([line]), [])


# The last few answers of record_entries (as the lru_cache it replaces kept them: functools costs the probe an
# import); bounded, because long-lived callers (cdna2.patches.cli over many releases) pass many RECORDs of megabytes.
_RECORD_ENTRIES: dict[tuple[str, tuple[str, ...]], tuple[list[str], ...]] = {}
_RECORD_ENTRIES_KEPT = 16


def record_entries(record_text: str, prefixes: tuple[str, ...] = ("",)) -> tuple[list[str], ...]:
    """[path, hash field, size] of the RECORD rows whose path starts with one of ``prefixes`` (default: every row).

    RECORD is CSV, so a path holding a comma comes quoted (``"prefix...``): the lines starting with a prefix,
    quoted or not, are selected first, which keeps a probe off the CSV parse of AITER's 1.5 MB RECORD (and off a
    Python-level test of each of its lines); the result is kept because a probe asks for the same rows twice.
    """
    key = (record_text, prefixes)
    if key not in _RECORD_ENTRIES:
        if len(_RECORD_ENTRIES) >= _RECORD_ENTRIES_KEPT:
            del _RECORD_ENTRIES[next(iter(_RECORD_ENTRIES))]  # the oldest
        _RECORD_ENTRIES[key] = _record_entries(record_text, prefixes)
    return _RECORD_ENTRIES[key]


def _record_entries(record_text: str, prefixes: tuple[str, ...]) -> tuple[list[str], ...]:
    if "" in prefixes:
        lines = record_text.splitlines()
    else:
        # A quoted path starts with '"': only the quoted lines of these prefixes, not every quoted line (vLLM's and
        # AITER's RECORDs quote thousands of config file names holding commas).
        found = {offset: line for prefix in {*prefixes, *(f'"{prefix}' for prefix in prefixes)}
                 for offset, line in _lines_starting_with(record_text, prefix).items()}
        lines = [found[offset] for offset in sorted(found)]  # in RECORD order, as the full parse gives them
    # Only a quoted path needs the CSV parser; splitting the other lines on commas is several times faster.
    rows = (_csv_row(line) for line in lines)
    return tuple(row if len(row) == 3 else (row + ["", ""])[:3]
                 for row in rows if row and row[0] and row[0].startswith(prefixes))


def record_hashes(record_text: str, paths: Collection[str]) -> dict[str, str]:
    """The RECORD hash field of each of ``paths`` that RECORD lists with one: one ``str.find`` per path, stopping at
    its row (a path is listed once), instead of parsing the rows of a large RECORD."""
    hashes = {}
    for path in paths:
        for start in (f"{path},", f'"{path}",'):  # pip quotes a path holding a comma
            index = 0 if record_text.startswith(start) else record_text.find(f"\n{start}") + 1 or -1
            if index >= 0:
                end = record_text.find("\n", index)
                row = _csv_row(record_text[index:None if end < 0 else end].rstrip("\r"))
                if len(row) > 1 and row[0] == path and row[1]:
                    hashes[path] = row[1]
                break
    return hashes


def record_tree_digest(record_text: str, prefix: str) -> tuple[str, int]:
    """Digest (as ``tree_digest``) and file count of the RECORD entries under ``prefix`` (ending in ``/``)."""
    rows = record_entries(record_text, (prefix,))
    entries = [(path[len(prefix):], hash_field, size) for path, hash_field, size in rows if hash_field]
    return digest_of_entries(entries), len(entries)


def canonical_name(name: str) -> str:
    """PEP 503 normalised name: ``amd_aiter`` -> ``amd-aiter`` (runs of ``-``, ``_`` and ``.`` become one ``-``)."""
    dashed = name.replace("_", "-").replace(".", "-").lower()
    while "--" in dashed:
        dashed = dashed.replace("--", "-")
    return dashed


# Installed-distribution metadata directories, and the file in each that holds the core metadata.
METADATA_DIRS = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}


def find_metadata_dirs(wanted: Collection[str], search_path: Collection[str] | None = None) -> dict[str, str]:
    """The first metadata directory on ``sys.path`` (or ``search_path``) of each wanted (canonical) name, as
    importlib.metadata finds it.

    Read by hand rather than through importlib.metadata, whose imports alone cost more than the rest of the probe.
    """
    found: dict[str, str] = {}
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
                found[canonical] = os.path.join(entry or ".", name)
    return found


def read_core_metadata(metadata_dir: str | os.PathLike) -> dict[str, str]:
    """The header fields of a distribution's METADATA (PKG-INFO): up to the first blank line, first value wins."""
    fields: dict[str, str] = {}
    file_name = next(name for suffix, name in METADATA_DIRS.items() if os.fspath(metadata_dir).endswith(suffix))
    text = read_text(os.path.join(metadata_dir, file_name))
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and not line[0].isspace():
            fields.setdefault(key.strip(), value.strip())
    return fields


def installed_version(site_packages: str | os.PathLike, name: str) -> str | None:
    """The version of distribution ``name`` installed in ``site_packages``; None when it is not there or unreadable."""
    metadata_dir = find_metadata_dirs({canonical_name(name)}, [os.fspath(site_packages)]).get(canonical_name(name))
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
                "location": os.path.dirname(metadata_dir),
                "metadata_dir": metadata_dir,
                # pip writes a wheel's RECORD last: METADATA without it is an install that was cut short (a pip
                # killed half-way), whatever version it names.
                "complete": not metadata_dir.endswith(".dist-info")
                or os.path.exists(os.path.join(metadata_dir, "RECORD")),
            }
            break
    return found


def read_records(distributions: dict, errors: list[str], packages: Collection[str] | None = None) -> dict[str, str]:
    """The RECORD text of every installed distribution (or of ``packages``), read once ("" when unreadable, with
    an error line)."""
    records = {}
    for package, dist in distributions.items():
        if dist is None or (packages is not None and package not in packages):
            continue
        record = os.path.join(dist["metadata_dir"], "RECORD")
        if dist["metadata_dir"].endswith(".dist-info") and not os.path.exists(record):
            # pip writes RECORD last: an install cut short. Nothing of it can be checked, which is not "all match".
            errors.append(f"{dist['name']} has no RECORD in {dist['metadata_dir']} (an install cut short): none of "
                          f"its files can be checked; reinstall it")
        try:
            # Bytes, then decoded: no newline translation over a RECORD of megabytes.
            records[package] = read_bytes(record).decode("utf-8") if os.path.exists(record) else ""
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


def record_stat(metadata_dir: str) -> str | None:
    """What ``stat`` says of a distribution's RECORD (size, mtime, inode): it changes whenever pip writes the RECORD,
    i.e. whenever the distribution is installed again. None when there is no RECORD. Not the ctime: it changes with
    the link count, and hard-linked environments (the lab's, say) share a RECORD inode that others link and unlink."""
    try:
        stat = os.stat(os.path.join(metadata_dir, "RECORD"))
    except OSError:
        return None
    return f"{stat.st_size},{stat.st_mtime_ns},{stat.st_ino}"


def record_facts(package: str, record_text: str, target_paths: Collection[str]) -> dict:
    """What the deploy needs from one RECORD: the RECORD hashes of the patch targets and, for AITER, where its kernel
    tree is and what its gfx942 tree should hold. The controller keeps these per host and hands them back to the
    next probe (``record_memo``), which then reads the RECORD again only when its stat changed."""
    facts: dict = {"paths": sorted(target_paths), "targets": record_hashes(record_text, target_paths)}
    if package == "amd-aiter":
        facts["hsa_rel"] = kernel_tree_root(record_text)
        facts["gfx942"] = record_tree_digest(record_text, f"{facts['hsa_rel']}/gfx942/") if facts["hsa_rel"] else None
        facts["triton_sources"] = record_triton_digest(record_text)
    return facts


def record_triton_digest(record_text: str) -> str | None:
    """``triton_sources_digest`` of AITER's Triton sources as its RECORD promises them (None: it lists none): what
    the wheel installed, whatever this tool's patches have changed since."""
    prefix = f"{TRITON_SOURCES}/"
    entries = [(path[len(prefix):], hash_field, size) for path, hash_field, size in
               record_entries(record_text, (prefix,)) if hash_field and is_triton_source(path)]
    return digest_of_entries(entries) if entries else None


def read_aiter(dist: dict | None, record_text: str, errors: list[str], installed: dict | None = None,
               facts: dict | None = None) -> dict | None:
    """AITER's kernel trees: the gfx942 tree as its RECORD promises it, and the gfx90a tree as it is on disk.

    ``facts``: ``record_facts`` of AITER's RECORD, when the caller has them (then ``record_text`` is not read).
    ``installed``: the kernel install's record (``state["kernels"]``); when the gfx90a tree's stat signature is the
    one recorded there, its digest is taken from the record instead of reading every kernel (None: always read).
    """
    if dist is None:
        return None
    facts = facts or record_facts("amd-aiter", record_text, ())
    hsa_rel = facts["hsa_rel"]
    info = {"hsa_root": None, "gfx942_record_digest": None, "gfx942_record_files": 0, "gfx942_on_disk": False,
            "gfx90a_digest": None, "gfx90a_files": 0, "gfx90a_previous": False, "free_bytes": None}
    if hsa_rel is None:
        errors.append(f"{dist['name']} RECORD lists no hsa/gfx942 kernel tree")
        return info
    hsa_root = os.path.join(dist["location"], hsa_rel)
    info["hsa_root"] = hsa_root
    info["gfx942_record_digest"], info["gfx942_record_files"] = facts["gfx942"]
    info["gfx942_on_disk"] = os.path.isdir(os.path.join(hsa_root, "gfx942"))
    info["gfx90a_previous"] = os.path.isdir(os.path.join(hsa_root, ".gfx90a.previous"))
    info["free_bytes"] = free_bytes(hsa_root)
    gfx90a = os.path.join(hsa_root, "gfx90a")
    if os.path.isdir(gfx90a):
        signature, info["gfx90a_files"] = tree_stat_signature(gfx90a)
        unchanged = (installed and installed.get("hsa_root") == hsa_root
                     and installed.get("stat_signature") == signature)
        info["gfx90a_digest"] = installed["digest"] if unchanged else tree_digest(gfx90a)
    return info


def file_content(encoded: str) -> bytes:
    """The bytes of a patch target as ``read_patch_targets`` sends them (zlib, then base64)."""
    return zlib.decompress(binascii.a2b_base64(encoded))


def absent_directories(root: str | os.PathLike, files: Collection[str]) -> list[str]:
    """The directories under ``root`` that adding ``files`` (paths relative to it) would create, shallowest first:
    the order a transaction creates them in (cdna2.host.txn)."""
    absent = set()
    for relative in files:
        parent = os.path.dirname(relative)
        while parent and not os.path.isdir(os.path.join(root, parent)):
            absent.add(parent)
            parent = os.path.dirname(parent)
    return sorted(absent, key=lambda directory: (directory.count("/"), directory))


def read_patch_targets(patch_files: dict, distributions: dict, target_records: dict[str, dict[str, str]],
                       known_contents: Collection[str] = ()) -> dict:
    """For each package's candidate files: RECORD hash (from ``target_records``: package -> path -> hash), current
    hash and content (zlib+base64), or null; and ``absent_dirs``, the directories (relative to the package's
    location) that adding the absent ones would create.

    ``content`` is null when the current hash is one of ``known_contents``: the controller holds those bytes
    already (cdna2/patches/contents.py), so a provisioned host sends none.
    """
    targets: dict[str, dict] = {}
    for package, files in patch_files.items():
        dist = distributions.get(package)
        if dist is None:
            continue
        record = target_records.get(package, {})
        entries = {}
        develop = dist.get("install_mode") == "develop"
        absent = []
        for rel in files:
            path = os.path.join(dist["location"], checkout_path(rel) if develop else rel)
            if not os.path.isfile(path):
                entries[rel] = None
                absent.append(checkout_path(rel) if develop else rel)
                continue
            data = read_bytes(path)
            current = record_hash(data)
            entries[rel] = {
                "record": record.get(rel) or None,
                "current": current,
                # Level 1: the bytes cross a local network once; level 9 cost more CPU than the rest of the probe.
                "content": None if current in known_contents else b64(zlib.compress(data, 1)),
            }
        targets[package] = {"location": dist["location"], "files": entries,
                            "absent_dirs": absent_directories(dist["location"], absent)}
    return targets

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc imports collections: annotations only
    from collections.abc import Collection


# Files a provisioned AITER holds beyond its RECORD by design: the translated tree and its previous copy.
NOT_IN_RECORD = ("/hsa/gfx90a/", "/hsa/.gfx90a.previous/")


def record_mismatches(location: str | os.PathLike, record_text: str, skip_paths: Collection[str] = ()) -> dict:
    """Compare every file a RECORD lists with the disk: how many were checked, which differ or are gone, and
    ``unproven``: why nothing was checked (a RECORD missing, unreadable or empty), else None; zero files checked is
    no proof that the package is stock.

    Not checked: bytecode, console scripts outside site-packages (``../../bin/vllm``: pip writes them per
    interpreter, ``pip install --target`` elsewhere), our own kernel trees, and ``skip_paths``.
    """
    checked, mismatched, missing = 0, [], []
    for path, hash_field, _ in record_entries(record_text):
        parts = path.split("/")
        if (not hash_field or path in skip_paths or "__pycache__" in parts or ".." in parts
                or any(tree in f"/{path}" for tree in NOT_IN_RECORD)):
            continue
        target = os.path.join(location, path)
        checked += 1
        if not os.path.isfile(target):
            missing.append(path)
        elif record_hash(read_bytes(target)) != hash_field:
            mismatched.append(path)
    unproven = None if checked else (f"no file of {location} checked: its RECORD is missing, unreadable or lists "
                                     f"no file with a hash")
    return {"checked": checked, "mismatched": mismatched, "missing": missing, "unproven": unproven}

"""Host probe: everything the deploy needs to know about one host, read in one SSH round trip.

Runs on the host under the target Python (or under ``python3`` when the target environment is missing, which it
then reports), standard library only, and prints one JSON object on stdout. It never imports the packages it
inspects: distributions are read from their metadata, AITER's kernel tree from its RECORD. It never raises on a
host that is merely unusual: what it cannot read goes to ``errors`` and the field is ``null``.

Usage on the host: ``python3 probe.py '<json options>'``; the deploy sends this file's text inline with ``-c``.
The options are described by ``ProbeOptions`` below.
"""

from __future__ import annotations

# Paths are strings and os.path here, processes are spawned without subprocess, JSON is read and written without
# json (which imports re, and re enum), CSV parsed without csv unless a row is quoted: a probe runs on every host on
# every run, and those imports cost it more CPU than reading an unchanged host. tests/unit/test_probe.py keeps the
# list of what it imports.
import binascii
import hashlib
import os
import pwd
import select
import sys
import time
import zlib
from stat import S_ISREG

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc imports collections: annotations only
    from collections.abc import Callable, Collection, Iterator

PROBE_FORMAT = 3

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
# Every PCI device, driver or not: a GPU whose driver did not load shows only here.
PCI_DEVICES = "/sys/bus/pci/devices"
AMD_PCI_VENDOR = "0x1002"
PCI_GPU_CLASSES = ("0x03", "0x12")  # display controllers (an MI210 is 0x0380) and processing accelerators


# --- digests shared with the controller (cdna2.kernels uses these very functions) ---------------------------------

# base64 by hand (binascii, which base64 itself wraps): the probe's start-up time is paid on every host every run.
_URLSAFE = str.maketrans("+/", "-_")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def record_hash(data: bytes) -> str:
    """The hash field of a wheel RECORD line for ``data``: ``sha256=<urlsafe base64, no padding>``."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + _b64(digest).translate(_URLSAFE).rstrip("=")


# A hash field in git's terms: the blob id git gives the bytes (the pristine oracle of a develop checkout).
GIT_BLOB = "git-blob="


def git_hash_field(data: bytes) -> str:
    """``git-blob=<the id git hash-object gives data>``, computed without git."""
    return GIT_BLOB + hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hash_like(hash_field: str, data: bytes) -> str:
    """The hash of ``data`` in the form of ``hash_field``: a git blob field, or a RECORD sha256 field."""
    return git_hash_field(data) if hash_field.startswith(GIT_BLOB) else record_hash(data)


def _read_bytes(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


def _read_text(path: str | os.PathLike) -> str:
    return _read_bytes(path).decode("utf-8", errors="replace")


# --- JSON without the json module: the options, this tool's state files, pip's direct_url.json, the output ---------

_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_JSON_CONSTANTS = (("true", True), ("false", False), ("null", None))
_JSON_NUMBER = frozenset("+-0123456789.eE")
_JSON_SPACE = frozenset(" \t\n\r")


def json_loads(text: str):
    """The value of a JSON document, as ``json.loads`` gives it; ValueError for most texts that are not one (a
    control character inside a string is let through)."""
    try:
        value, end = _json_value(text, _json_skip(text, 0))
    except IndexError:
        raise ValueError("not JSON: the text ends inside a value") from None
    except KeyError as error:
        raise ValueError(f"not JSON: unknown escape \\{error.args[0]}") from None
    except ValueError as error:
        raise ValueError(f"not JSON: {error}") from None
    if _json_skip(text, end) != len(text):
        raise ValueError(f"not JSON: extra data at character {end}")
    return value


def _json_skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _JSON_SPACE:
        index += 1
    return index


def _json_value(text: str, index: int) -> tuple[object, int]:
    char = text[index]
    if char == '"':
        return _json_string(text, index + 1)
    if char in "{[":
        closing, items = ("}", {}) if char == "{" else ("]", [])
        index = _json_skip(text, index + 1)
        while text[index] != closing:
            if isinstance(items, dict):
                if text[index] != '"':
                    raise ValueError(f"expected a name at character {index}")
                key, index = _json_string(text, index + 1)
                index = _json_skip(text, index)
                if text[index] != ":":
                    raise ValueError(f"expected ':' at character {index}")
                items[key], index = _json_value(text, _json_skip(text, index + 1))
            else:
                value, index = _json_value(text, index)
                items.append(value)
            index = _json_skip(text, index)
            if text[index] == ",":
                index = _json_skip(text, index + 1)
            elif text[index] != closing:
                raise ValueError(f"expected ',' or {closing!r} at character {index}")
        return items, index + 1
    for word, constant in _JSON_CONSTANTS:
        if text.startswith(word, index):
            return constant, index + len(word)
    end = index
    while end < len(text) and text[end] in _JSON_NUMBER:
        end += 1
    token = text[index:end]
    if not token:
        raise ValueError(f"unexpected {char!r} at character {index}")
    return (float(token) if "." in token or "e" in token or "E" in token else int(token)), end


def _json_string(text: str, index: int) -> tuple[str, int]:
    """The string starting after its opening quote at ``index``, and the index after its closing quote."""
    parts = []
    while True:
        end = text.find('"', index)
        if end < 0:
            raise ValueError(f"unterminated string from character {index - 1}")
        backslash = text.find("\\", index, end)
        if backslash < 0:
            parts.append(text[index:end])
            return "".join(parts), end + 1
        parts.append(text[index:backslash])
        code = text[backslash + 1]
        if code != "u":
            parts.append(_JSON_ESCAPES[code])
            index = backslash + 2
            continue
        point, index = int(text[backslash + 2:backslash + 6], 16), backslash + 6
        if 0xD800 <= point < 0xDC00 and text.startswith("\\u", index):  # a surrogate pair is one character
            low = int(text[index + 2:index + 6], 16)
            if 0xDC00 <= low < 0xE000:
                point, index = 0x10000 + ((point - 0xD800) << 10) + (low - 0xDC00), index + 6
        parts.append(chr(point))


# Escaped as json.dumps escapes them (ensure_ascii): quote, backslash, control characters, DEL and all beyond ASCII,
# so that the output survives any locale's stdout.
_JSON_STRING_ESCAPES = {**{code: f"\\u{code:04x}" for code in (*range(0x20), 0x7F)}, ord('"'): '\\"', ord("\\"): "\\\\",
                        ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b", ord("\f"): "\\f"}


def _json_string_text(value: str) -> str:
    value = value.translate(_JSON_STRING_ESCAPES)
    if not value.isascii():
        value = "".join(char if ord(char) < 0x80 else f"\\u{ord(char):04x}" if ord(char) < 0x10000 else
                        "\\u{:04x}\\u{:04x}".format(0xD7C0 + (ord(char) >> 10), 0xDC00 + (ord(char) & 0x3FF))
                        for char in value)
    return '"' + value + '"'


def json_dumps(value) -> str:
    """``value`` (dicts with string keys, lists, tuples, strings, numbers, booleans, None) as ``json.dumps(value,
    sort_keys=True, separators=(",", ":"))`` writes it."""
    if isinstance(value, str):
        return _json_string_text(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value} has no JSON form")
        return repr(value)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"keys must be strings, not {sorted({type(key).__name__ for key in value})}")
        return "{" + ",".join(f"{_json_string_text(key)}:{json_dumps(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_dumps(item) for item in value) + "]"
    raise TypeError(f"{type(value).__name__} has no JSON form")


def file_sha256(path: str | os.PathLike) -> str | None:
    """Hex sha256 of a file, read in blocks; None when it is not a file."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_of_entries(entries: list[tuple[str, str, str]]) -> str:
    lines = "".join(f"{path},{hash_field},{size}\n" for path, hash_field, size in sorted(entries))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def tree_digest(root: str | os.PathLike, hash_field: Callable[[bytes], str] = record_hash) -> str:
    """Digest of every regular file under ``root``: sha256 over sorted RECORD-style lines relative to ``root``.

    A tree installed from a wheel has the same digest as ``record_tree_digest`` of the wheel's RECORD for that
    subtree, so a host's kernel tree can be compared with what its RECORD promises without reading the files twice.
    ``__pycache__`` directories are left out on both sides. With ``hash_field=git_hash_field`` it is the digest
    ``read_develop_aiter`` computes from the blob ids of a checkout's git HEAD instead.
    """
    entries = []
    # Bytecode caches are derived from the sources beside them, and RECORD lists them without a hash.
    for relative, path in regular_files(root, skip_dirs=("__pycache__",)):
        with open(path, "rb") as stream:
            data = stream.read()
        entries.append((relative, hash_field(data), str(len(data))))
    return _digest_of_entries(entries)


def regular_files(root: str | os.PathLike, skip_dirs: Collection[str] = ()) -> Iterator[tuple[str, str]]:
    """(path relative to ``root``, "/"-separated; the full path) of every regular file under ``root`` (a symlink to
    one included), in os.walk order with subdirectories sorted, directories named in ``skip_dirs`` left out."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in skip_dirs)
        relative_dir = os.path.relpath(directory, root)
        for file_name in files:
            path = os.path.join(directory, file_name)
            if os.path.isfile(path):
                yield (file_name if relative_dir == "." else f"{relative_dir}/{file_name}"), path


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


def tree_stat_signature(root: str | os.PathLike) -> tuple[str, int]:
    """Digest of what ``stat`` says of every regular file under ``root`` (path, size, mtime, ctime, inode), and
    their number: the digest is equal for an untouched tree and changes once any file is written, replaced, added
    or removed; no file is opened. The kernel install records it beside the tree's content digest."""
    lines = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        relative_dir = directory[len(os.fspath(root)) + 1:]
        for file_name in files:
            stat = os.lstat(os.path.join(directory, file_name))
            if S_ISREG(stat.st_mode):
                relative = f"{relative_dir}/{file_name}" if relative_dir else file_name
                lines.append(f"{relative},{stat.st_size},{stat.st_mtime_ns},{stat.st_ctime_ns},{stat.st_ino}\n")
    return hashlib.sha256("".join(sorted(lines)).encode("utf-8")).hexdigest(), len(lines)


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
    return _digest_of_entries(entries), len(entries)


# --- pieces of the probe ---------------------------------------------------------------------------------------------

def read_os() -> dict:
    release = {}
    if os.path.isfile("/etc/os-release"):
        for line in _read_text("/etc/os-release").splitlines():
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


# Filesystems one directory of which many hosts mount (network and cluster filesystems, by /proc mountinfo type).
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph", "cifs", "smb3",
                                "glusterfs", "fuse.glusterfs", "panfs", "wekafs", "9p", "fuse.sshfs"})


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` lies on, from the mount whose mount point is its longest prefix."""
    try:
        text = _read_text(mountinfo)
    except OSError:
        return None
    target, best, found = os.path.realpath(path), -1, None
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, found = len(point), line.split(" - ", 1)[1].split()[0]
    return found


def environment_fingerprint(prefix: str) -> str | None:
    """Which directory the environment is, as every host that mounts it sees it: the inode and mtime of its prefix
    and the inode of its lib/. On a network or cluster filesystem (NFS, Lustre, ...) one file shows the same inode
    on every client, and the device number, which differs per client, is left out; on a local filesystem the
    device is part of it, so containers from one image (overlayfs: the lower layer's inodes, a device per
    container) are each their own. Two local disks at the same path differ, unless cloned from one image and
    never written since."""
    try:
        top, lib = os.stat(prefix), os.stat(os.path.join(prefix, "lib"))
    except OSError:
        return None
    local = "" if filesystem_type(prefix) in SHARED_FILESYSTEMS else f":{top.st_dev}"
    return f"{top.st_ino}:{top.st_mtime_ns}:{lib.st_ino}{local}"


def read_python(target_python: str) -> dict:
    running = os.path.realpath(sys.executable)
    is_target = os.path.realpath(target_python) == running or sys.executable == target_python
    return {
        "path": sys.executable,
        "target": target_python,
        "target_exists": os.access(target_python, os.X_OK),
        "is_target": is_target,
        "version": sys.version.split()[0],
        "abi": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "prefix": sys.prefix,
        "fingerprint": environment_fingerprint(sys.prefix) if is_target else None,
    }


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
    text = _read_text(os.path.join(metadata_dir, file_name))
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


def _leading_digits(text: str) -> str:
    end = 0
    while end < len(text) and text[end] in "0123456789":
        end += 1
    return text[:end]


def parse_rocm_version(text: str) -> str | None:
    """``6.4.3-74`` or ``7.14.0`` -> the dotted release (two or three numbers); None when the text holds no
    version."""
    numbers, rest = [], text.lstrip()
    while len(numbers) < 3 and (number := _leading_digits(rest)):
        numbers.append(number)
        if not rest[len(number):].startswith(".") or not _leading_digits(rest[len(number) + 1:]):
            break
        rest = rest[len(number) + 1:]
    return ".".join(numbers) if len(numbers) >= 2 else None


def read_rocm(rocm_root: str, distributions: dict) -> dict:
    version_file = os.path.join(rocm_root, ".info", "version")
    if os.path.isfile(version_file):
        raw = _read_text(version_file).strip()
        return {"version": parse_rocm_version(raw), "raw": raw, "source": str(version_file)}
    wheel = distributions.get("rocm-sdk-core")
    if wheel:
        return {"version": parse_rocm_version(wheel["version"]), "raw": wheel["version"],
                "source": f"python wheel {wheel['name']}"}
    return {"version": None, "raw": None, "source": None}


def parse_rocminfo(text: str) -> list[dict]:
    """GPU agents from ``rocminfo`` output: name (gfx arch), marketing name, compute units, chip id."""
    agents, blocks = [], [[]]
    for line in text.splitlines():  # agents are separated by lines of five or more asterisks
        if len(line.strip()) >= 5 and not line.strip().strip("*"):
            blocks.append([])
        else:
            blocks[-1].append(line)
    for block in blocks:
        fields = {}
        for line in block:
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
        if fields.get("Device Type") != "GPU":
            continue
        chip_text = fields.get("Chip ID", "")
        chip = chip_text[chip_text.find("0x") + 2:] if "0x" in chip_text else ""
        chip = chip[:next((i for i, char in enumerate(chip) if char not in "0123456789abcdefABCDEF"), len(chip))]
        agents.append({
            "arch": fields.get("Name"),
            "marketing_name": fields.get("Marketing Name"),
            "compute_units": int(fields["Compute Unit"]) if fields.get("Compute Unit", "").isdigit() else None,
            "chip_id": f"0x{chip.lower()}" if chip else None,
        })
    return agents


def gfx_name(target_version: int) -> str:
    """KFD ``gfx_target_version`` (e.g. 90010) -> ``gfx90a``: major, then minor and stepping as hex digits."""
    major, minor, stepping = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def read_kfd_topology(nodes_dir: str) -> list[dict]:
    agents = []
    for node in sorted(os.listdir(nodes_dir)) if os.path.isdir(nodes_dir) else []:
        properties = os.path.join(nodes_dir, node, "properties")
        if not os.path.isfile(properties):
            continue
        values = {}
        for line in _read_text(properties).splitlines():
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


def read_amd_pci_gpus(devices_dir: str) -> list[dict]:
    """AMD display and accelerator devices on the PCI bus, by address: {"address", "device", "class"}."""
    try:
        addresses = sorted(os.listdir(devices_dir))
    except OSError:
        return []
    found = []
    for address in addresses:
        try:
            if _read_text(os.path.join(devices_dir, address, "vendor")).strip() != AMD_PCI_VENDOR:
                continue
            pci_class = _read_text(os.path.join(devices_dir, address, "class")).strip()
            device = _read_text(os.path.join(devices_dir, address, "device")).strip()
        except OSError:  # a device removed while read, or a file this kernel does not publish
            continue
        if pci_class.startswith(PCI_GPU_CLASSES):
            found.append({"address": address, "device": device, "class": pci_class})
    return found


SIGKILL = 9


def run_program(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a program; its exit code, stdout and stderr (TimeoutError after ``timeout`` seconds, the program killed).

    Spawned by hand: importing ``subprocess`` (signal, threading, selectors...) costs a probe more CPU than all it
    reads on a provisioned host.
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:  # the pipes are close-on-exec; only the duplicated ends reach the program
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)])
    except OSError:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    output: dict[int, list[bytes]] = {out_read: [], err_read: []}
    deadline, pending = time.monotonic() + timeout, [out_read, err_read]
    try:
        while pending and (ready := select.select(pending, [], [], max(deadline - time.monotonic(), 0))[0]):
            for descriptor in ready:
                if data := os.read(descriptor, 1 << 16):
                    output[descriptor].append(data)
                else:
                    pending.remove(descriptor)
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # output closed, exit not yet seen
        if status[0] == 0:
            os.kill(pid, SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"no exit after {timeout:g} s, killed")
    finally:
        for descriptor in output:
            os.close(descriptor)
    text = [b"".join(output[descriptor]).decode("utf-8", errors="replace") for descriptor in (out_read, err_read)]
    return os.waitstatus_to_exitcode(status[1]), text[0], text[1]


def read_gpus(rocm_root: str, kfd_topology: str, errors: list[str], pci_devices: str = PCI_DEVICES) -> dict:
    """The GPU agents rocminfo lists (the KFD topology where it lists none) and, only when neither has one, the AMD
    GPUs on the PCI bus: a node whose GPU driver did not load must not pass for a node without a GPU."""
    agents, source = [], None
    rocminfo = os.path.join(rocm_root, "bin", "rocminfo")
    if os.access(rocminfo, os.X_OK):
        try:
            code, stdout, stderr = run_program([rocminfo], timeout=60)
            if code == 0:
                agents, source = parse_rocminfo(stdout), rocminfo
            else:
                errors.append(f"{rocminfo} exited {code}: {stderr.strip()[-300:]}")
        except (OSError, TimeoutError) as error:
            errors.append(f"{rocminfo}: {error}")
    if not agents:
        agents = read_kfd_topology(kfd_topology)
        source = f"{kfd_topology} gfx_target_version" if agents else source
    arches = sorted({agent["arch"] for agent in agents if agent["arch"]})
    return {"agents": agents, "source": source, "arches": arches, "arch": arches[0] if len(arches) == 1 else None,
            "pci_without_agent": [] if agents else read_amd_pci_gpus(pci_devices)}


def read_records(distributions: dict, errors: list[str], packages: Collection[str] | None = None) -> dict[str, str]:
    """The RECORD text of every installed distribution (or of ``packages``), read once ("" when unreadable, with
    an error line)."""
    records = {}
    for package, dist in distributions.items():
        if dist is None or (packages is not None and package not in packages):
            continue
        record = os.path.join(dist["metadata_dir"], "RECORD")
        try:
            # Bytes, then decoded: no newline translation over a RECORD of megabytes.
            records[package] = _read_bytes(record).decode("utf-8") if os.path.exists(record) else ""
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
    return facts


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


# --- develop-mode AITER: a git checkout installed by setup.py develop or pip install -e ------------------------------

# AITER's wheel installs the repository's csrc/, hsa/, ... under aiter_meta/ (its setup.py copies them there) and
# aiter/ as it is; a develop checkout holds them at its root, where AITER's core.py then points AITER_META_DIR.
WHEEL_META_DIR = "aiter_meta/"


def checkout_path(installed: str) -> str:
    """The repository path of the file AITER's wheel installs at ``installed`` (relative to site-packages)."""
    return installed.removeprefix(WHEEL_META_DIR)


def editable_checkout(dist: dict) -> str | None:
    """The source tree of an editable install, or None for an installed wheel: pip install -e records it in
    ``direct_url.json`` (PEP 610, ``dir_info.editable``); setup.py develop leaves ``<checkout>/<name>.egg-info``,
    found on sys.path through its ``.egg-link`` / ``easy-install.pth``, beside the checkout's setup.py."""
    metadata_dir = dist["metadata_dir"]
    if metadata_dir.endswith(".egg-info"):
        return dist["location"] if os.path.isfile(os.path.join(dist["location"], "setup.py")) else None
    try:
        direct_url = json_loads(_read_text(os.path.join(metadata_dir, "direct_url.json")))
    except (OSError, ValueError):
        return None
    url = direct_url.get("url", "") if isinstance(direct_url, dict) else ""
    if not (direct_url.get("dir_info") or {}).get("editable") or not url.startswith("file://"):
        return None
    return os.path.normpath(percent_decoded(url[len("file://"):]))


def percent_decoded(text: str) -> str:
    """A URL path with its ``%XX`` escapes decoded (UTF-8), others left as they are; by hand: urllib.parse costs the
    probe more than the rest of a develop host's probe."""
    pieces = text.encode("utf-8").split(b"%")
    decoded = [pieces[0]]
    for piece in pieces[1:]:
        escape = piece[:2]
        if len(escape) == 2 and all(byte in b"0123456789abcdefABCDEF" for byte in escape):
            decoded.append(bytes([int(escape, 16)]) + piece[2:])
        else:
            decoded.append(b"%" + piece)
    return b"".join(decoded).decode("utf-8", errors="replace")


class GitError(Exception):
    """git is missing, or could not read the checkout; the message says which, and where."""


def find_program(name: str) -> str | None:
    """``name`` on $PATH (as the shell finds it), or None."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    return None


def run_git(checkout: str, *args: str) -> str:
    """``git -C checkout ARGS``' stdout; GitError saying what went wrong and where."""
    git = find_program("git")
    if git is None:
        raise GitError(f"git is not installed (not on PATH), and the checkout's git HEAD is its pristine oracle: "
                       f"install git on the host")
    try:
        # --no-optional-locks: status must not rewrite the index of a checkout someone else owns.
        code, stdout, stderr = run_program([git, "--no-optional-locks", "-C", checkout, *args], timeout=120)
    except (OSError, TimeoutError) as error:
        raise GitError(f"git {args[0]} in {checkout}: {error}") from error
    if code != 0:
        raise GitError(f"git {args[0]} in {checkout} exited {code}: {stderr.strip()[-300:]} (the develop checkout "
                       f"must be a git work tree with a HEAD commit)")
    return stdout


def read_develop_aiter(distributions: dict, target_paths: Collection[str]) -> dict | None:
    """For an AITER installed in develop mode: its distribution entry turned to the checkout (``location``, its
    ``install_mode`` "develop", HEAD ``commit``, ``checkout_error``), and what a RECORD says of a wheel (in
    ``record_facts``' shape) from the blob ids of HEAD. None for an installed wheel, having read one small file."""
    dist = distributions.get("amd-aiter")
    checkout = editable_checkout(dist) if dist else None
    if checkout is None:
        return None
    dist.update(location=checkout, install_mode="develop", commit=None, checkout_error=None)
    facts: dict = {"paths": sorted(target_paths), "targets": {}, "hsa_rel": None, "gfx942": None}
    try:
        dist["commit"] = run_git(checkout, "rev-parse", "--verify", "HEAD^{commit}").strip()
        listing = run_git(checkout, "ls-tree", "-r", "-l", "-z", dist["commit"], "--", "hsa/gfx942",
                          *sorted({checkout_path(path) for path in target_paths}))
    except GitError as error:
        dist["checkout_error"] = str(error)
        return facts
    kernels, blobs = [], {}
    for row in listing.split("\0"):
        meta, _, path = row.partition("\t")
        fields = meta.split()
        if len(fields) != 4 or fields[1] != "blob" or fields[0] == "120000":  # symlinks are no kernel files
            continue
        if path.startswith("hsa/gfx942/"):
            kernels.append((path[len("hsa/gfx942/"):], GIT_BLOB + fields[2], fields[3]))
        else:
            blobs[path] = GIT_BLOB + fields[2]
    facts["targets"] = {path: blobs[checkout_path(path)] for path in target_paths if checkout_path(path) in blobs}
    if kernels:
        facts["hsa_rel"], facts["gfx942"] = "hsa", (_digest_of_entries(kernels), len(kernels))
    return facts


def checkout_status(checkout: str) -> dict:
    """``git status`` of a develop checkout, as ``record_mismatches`` reports a RECORD comparison: tracked files
    that differ from HEAD or are gone, and untracked paths that are not ignored (our kernel trees among them)."""
    found: dict = {"git": checkout, "mismatched": [], "missing": [], "untracked": [], "error": None}
    try:
        # Submodules (AITER's 3rdparty/composable_kernel) hold nothing this tool writes: not walked.
        entries = run_git(checkout, "status", "--porcelain=v1", "-z", "--untracked-files=normal",
                          "--ignore-submodules=all").split("\0")
    except GitError as error:
        found["error"] = str(error)
        return found
    renamed_from = False
    for entry in entries:
        if renamed_from or not entry:  # with -z a rename's source path is an entry of its own
            renamed_from = False
            continue
        code, path = entry[:2], entry[3:]
        renamed_from = code[0] in "RC"
        found["untracked" if code == "??" else "missing" if "D" in code else "mismatched"].append(path)
    return found


def file_content(encoded: str) -> bytes:
    """The bytes of a patch target as ``read_patch_targets`` sends them (zlib, then base64)."""
    return zlib.decompress(binascii.a2b_base64(encoded))


def read_patch_targets(patch_files: dict, distributions: dict, target_records: dict[str, dict[str, str]],
                       known_contents: Collection[str] = ()) -> dict:
    """For each package's candidate files: RECORD hash (from ``target_records``: package -> path -> hash), current
    hash and content (zlib+base64), or null.

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
        for rel in files:
            path = os.path.join(dist["location"], checkout_path(rel) if develop else rel)
            if not os.path.isfile(path):
                entries[rel] = None
                continue
            data = _read_bytes(path)
            current = record_hash(data)
            entries[rel] = {
                "record": record.get(rel) or None,
                "current": current,
                # Level 1: the bytes cross a local network once; level 9 cost more CPU than the rest of the probe.
                "content": None if current in known_contents else _b64(zlib.compress(data, 1)),
            }
        targets[package] = {"location": dist["location"], "files": entries}
    return targets


# Files a provisioned AITER holds beyond its RECORD by design: the translated tree and its previous copy.
NOT_IN_RECORD = ("/hsa/gfx90a/", "/hsa/.gfx90a.previous/")


def record_mismatches(location: str | os.PathLike, record_text: str, skip_paths: Collection[str] = ()) -> dict:
    """Compare every file a RECORD lists with the disk: how many were checked, which differ or are gone.

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
        elif record_hash(_read_bytes(target)) != hash_field:
            mismatched.append(path)
    return {"checked": checked, "mismatched": mismatched, "missing": missing}


def read_backups(state_dir: str, errors: list[str]) -> dict:
    """The patch transactions' backup records (cdna2/host/txn.py): what was patched, and any unfinished journal."""
    backups = {}
    backups_dir = os.path.join(state_dir, "backups")
    for name in sorted(os.listdir(backups_dir)) if os.path.isdir(backups_dir) else []:
        backup_dir = os.path.join(backups_dir, name)
        record = os.path.join(backup_dir, "state.json")
        if not os.path.isfile(record):
            continue
        try:
            state = json_loads(_read_text(record))
        except (OSError, ValueError) as error:
            errors.append(f"{record}: unreadable patch record: {error}")
            continue
        backups[state["package"]] = {"backup_dir": backup_dir, "root": state["root"],
                                     "version": state.get("version"),
                                     "files": state["files"], "jit_invalidations": state["jit_invalidations"],
                                     "journal": os.path.exists(os.path.join(backup_dir, "journal.json"))}
    return backups


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged write could still use on the filesystem of ``path`` (or of its nearest parent)."""
    candidate = os.path.abspath(path)
    while not os.path.exists(candidate):
        if candidate == os.path.dirname(candidate):
            return None
        candidate = os.path.dirname(candidate)
    stats = os.statvfs(candidate)
    return stats.f_bavail * stats.f_frsize


# The tool's state directory of a root login (or one through sudo) when host data names none.
ROOT_STATE_DIR = "/var/lib/cdna2"


def default_state_dir(euid: int, environ: dict[str, str]) -> tuple[str, str]:
    """(path, where it comes from) of the tool's state directory when host data names none: ``/var/lib/cdna2`` for
    root; for any other login its XDG state directory, ``$XDG_STATE_HOME/cdna2`` (an absolute XDG_STATE_HOME only,
    as the XDG spec asks), else ``~/.local/state/cdna2`` (the home from the password database when HOME is unset)."""
    if euid == 0:
        return ROOT_STATE_DIR, "the default for root"
    user = pwd.getpwuid(euid).pw_name
    xdg = environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "cdna2"), f"$XDG_STATE_HOME of {user}"
    home = environ.get("HOME") or pwd.getpwuid(euid).pw_dir
    return os.path.join(home, ".local", "state", "cdna2"), f"the XDG state directory of {user} (~/.local/state)"


def _existing_ancestor(path: str) -> str:
    candidate = os.path.abspath(path)
    while not os.path.lexists(candidate) and candidate != os.path.dirname(candidate):
        candidate = os.path.dirname(candidate)
    return candidate


def write_refusal(path: str, user: str) -> str | None:
    """Why this login cannot create, rename or remove entries in the directory ``path`` (or, when it is absent, in
    the nearest existing directory above it, where it would be created), or None when it can."""
    directory = _existing_ancestor(path)
    try:
        info = os.stat(directory)
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError as error:
        return f"{directory}: cannot be inspected ({error.strerror})"
    if read_only:
        return f"{directory}: on a read-only filesystem"
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = f"uid {info.st_uid}"
    foreign = " (foreign-owned)" if info.st_uid != os.geteuid() else ""
    return f"{directory}: not writable by {user}: owner {owner}{foreign}, mode {oct(info.st_mode & 0o7777)[2:]}"


def sticky_refusal(path: str, user: str) -> str | None:
    """Why the file ``path`` cannot be replaced by a rename although its directory is writable: a sticky directory
    (mode +t) lets only the file's or the directory's owner replace it."""
    try:
        info, parent = os.lstat(path), os.stat(os.path.dirname(path))
    except OSError:
        return None
    euid = os.geteuid()
    if euid == 0 or not parent.st_mode & 0o1000 or euid in (info.st_uid, parent.st_uid):
        return None
    return (f"{path}: foreign-owned (uid {info.st_uid}) in the sticky directory {os.path.dirname(path)}: {user} may "
            f"not replace it")


def read_write_access(state_dir: str, python: dict, distributions: dict, aiter: dict | None,
                      patch_targets: dict) -> list[dict]:
    """Every place the run may write that this login cannot, each ``{"path", "why"}``, for the preflight to fail
    the host by name before anything changes: the state directory, the environment's site-packages and bin
    (pip), each distribution's metadata directory (pip replaces it), AITER's hsa/ and its gfx90a trees (the kernel
    swap renames and removes them), the directories of the patch targets, and each target file itself."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    directories = [state_dir]
    if python["is_target"]:
        directories += [os.path.join(python["prefix"], "bin"),
                        *sorted({dist["location"] for dist in distributions.values() if dist})]
    directories += sorted(dist["metadata_dir"] for dist in distributions.values()
                          if dist and dist.get("install_mode") != "develop")
    if aiter and aiter["hsa_root"]:
        directories.append(aiter["hsa_root"])
        for tree in ("gfx90a", ".gfx90a.previous"):
            root = os.path.join(aiter["hsa_root"], tree)
            directories += [top for top, _, _ in os.walk(root)] if os.path.isdir(root) else []
    files = []
    for package, found in patch_targets.items():
        develop = distributions[package].get("install_mode") == "develop"
        for rel, entry in found["files"].items():
            if entry is not None:  # a candidate file this version does not have is not written
                files.append(os.path.join(found["location"], checkout_path(rel) if develop else rel))
                directories.append(os.path.dirname(files[-1]))
    problems = {}
    for directory in dict.fromkeys(directories):
        why = write_refusal(directory, user)
        if why:
            problems.setdefault(why.partition(":")[0], why)
    for path in files:
        why = sticky_refusal(path, user)
        if why:
            problems.setdefault(path, why)
    return [{"path": path, "why": why} for path, why in problems.items()]


def read_state(state_dir: str, errors: list[str]) -> dict | None:
    state_file = os.path.join(state_dir, "state.json")
    if not os.path.isfile(state_file):
        return None
    try:
        return json_loads(_read_text(state_file))
    except (OSError, ValueError) as error:
        errors.append(f"{state_file}: unreadable tool state: {error}")
        return None


def read_agent(agent_dir: str | None) -> dict:
    """Digest of this tool's host-side modules as installed on the host, to decide whether to upload them."""
    if not agent_dir or not os.path.isdir(agent_dir):
        return {"digest": None}
    return {"digest": tree_digest(agent_dir)}


def probe(options: dict) -> dict:
    """Options: target_python, rocm_root, state_dir (None: this login's default_state_dir; the agent is read from
    its agent/); optional kfd_topology, pci_devices, patch_files
    {package: [paths]}, known_contents [hashes the controller holds the bytes of], record_memo {package: {stat,
    facts}} (the ``record_facts`` of the last probe of this host, reused while the RECORD's stat is the same),
    record_check [packages] (compare those distributions' files with their RECORD: reads every file, and the kernel
    tree too, whatever any stat says)."""
    errors: list[str] = []
    python = read_python(options["target_python"])
    distributions = read_distributions(errors) if python["is_target"] else {name: None for name in DISTRIBUTIONS}
    patch_files, record_check = options.get("patch_files", {}), options.get("record_check", [])
    if not python["is_target"]:
        errors.append(f"target Python {options['target_python']} is missing or not executable; "
                      f"probed with {sys.executable} instead")
    # RECORDs: read only where the controller's memo of this host does not match the file's stat any more, or for
    # a drift check (record_check), which reads every RECORD, every file it lists, and every kernel.
    memo = {} if record_check else options.get("record_memo", {})
    # A develop AITER's RECORD lists only its path file: git HEAD is what the facts come from, on every probe.
    develop = read_develop_aiter(distributions, patch_files.get("amd-aiter", ()))
    stats = {package: record_stat(distributions[package]["metadata_dir"])
             for package in {"amd-aiter", *patch_files} if distributions.get(package)
             and not (develop and package == "amd-aiter")}
    reused = {package for package, stat in stats.items() if stat and (memo.get(package) or {}).get("stat") == stat
              and memo[package]["facts"].get("paths") == sorted(patch_files.get(package, ()))}
    records = read_records(distributions, errors, {*stats, *record_check} - reused)
    facts = {package: memo[package]["facts"] if package in reused
             else record_facts(package, records.get(package, ""), patch_files.get(package, ())) for package in stats}
    if develop:
        facts["amd-aiter"] = develop
    state_dir, state_dir_source = ((options["state_dir"], "host data") if options.get("state_dir")
                                   else default_state_dir(os.geteuid(), os.environ))
    state = read_state(state_dir, errors)
    installed_kernels = None if record_check else (state or {}).get("kernels")
    aiter = read_aiter(distributions.get("amd-aiter"), "", errors, installed_kernels, facts.get("amd-aiter"))
    patch_targets = read_patch_targets(patch_files, distributions,
                                       {package: found["targets"] for package, found in facts.items()},
                                       set(options.get("known_contents", ())))
    return {
        "format": PROBE_FORMAT,
        "os": read_os(),
        "python": python,
        "rocm": read_rocm(options["rocm_root"], distributions),
        "gpu": read_gpus(options["rocm_root"], options.get("kfd_topology", KFD_TOPOLOGY), errors,
                         options.get("pci_devices", PCI_DEVICES)),
        "distributions": distributions,
        "aiter": aiter,
        "patch_targets": patch_targets,
        "record_facts": {package: {"stat": stats[package], "facts": facts[package], "reused": package in reused}
                         for package in stats},
        "state": state,
        # Where the state is: host data's state_dir, else this login's default (default_state_dir).
        "state_dir": {"path": state_dir, "source": state_dir_source},
        "state_dir_used": os.path.isdir(state_dir) and bool(os.listdir(state_dir)),
        "state_dir_free_bytes": free_bytes(os.path.join(state_dir, "staging")),
        "agent": read_agent(os.path.join(state_dir, "agent")),
        "backups": read_backups(state_dir, errors),
        "login": {"user": pwd.getpwuid(os.geteuid()).pw_name, "uid": os.geteuid()},
        "write_access": read_write_access(state_dir, python, distributions, aiter, patch_targets),
        "record_check": {package: checkout_status(distributions[package]["location"])
                         if distributions[package].get("install_mode") == "develop"
                         else record_mismatches(distributions[package]["location"], records[package])
                         for package in record_check if distributions.get(package)},
        "errors": errors,
        # This process's CPU since it started (interpreter start-up included) and its children's (rocminfo, to the
        # clock tick): what one probe costs the host, for bench/deploy.
        "cpu_s": round(time.process_time() + os.times().children_user + os.times().children_system, 4),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} '<json options>' [SUDO_REFUSAL]", file=sys.stderr)
        return 2
    found = probe(json_loads(argv[1]))
    # SUDO_REFUSAL: what sudo said when the login user asked it for root (operations/facts.py); this probe then
    # runs as that user, for the report, and the deploy fails the host before changing anything.
    # Its last line is the refusal; lines before it are warnings (an unresolvable host name, say).
    refusal = (argv[2].strip().splitlines() or [""])[-1][-300:] if len(argv) == 3 else None
    found["sudo_refused"] = {"user": pwd.getpwuid(os.geteuid()).pw_name, "error": refusal} if len(argv) == 3 else None
    print(json_dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

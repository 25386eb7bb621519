"""Wheel plans: which pip installs make a host's torch, amd-aiter, vLLM and triton match its ROCm version.

The wheel matrix (cdna2/data/wheel-matrix.yaml, validated against cdna2/schemas/wheel-matrix-1.0.json) says, per
ROCm version, which wheels match and where they come from. ``plan_wheels`` compares it with the host probe's
installed distributions and returns the pip commands, as argv lists, that close the gap, in order: torch,
amd-aiter, vLLM, and triton last. triton is installed last because installing the others can replace it, and
triton 3.7.0 dies with SIGSEGV on AITER's import path.

Every pip command runs with ``PIP_CONFIG_FILE=/dev/null`` and ``--isolated``, so the host's pip configuration
(find-links, extra indexes, constraints) cannot add sources: a wheel comes from the plan's index or mirror only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from cdna2.schema import first_violation, load_yaml

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_MATRIX_PATH = PACKAGE_DIR / "data" / "wheel-matrix.yaml"
SCHEMA_PATH = PACKAGE_DIR / "schemas" / "wheel-matrix-1.0.json"

# Matrix keys, in install order, and the distribution each one installs.
PACKAGE_ORDER = (("torch", "torch"), ("amd_aiter", "amd-aiter"), ("vllm", "vllm"), ("triton", "triton"))
# Host-data pin keys that override the matrix's version of a distribution.
PIN_KEYS = {"torch_version": "torch", "aiter_version": "amd-aiter", "vllm_version": "vllm",
            "triton_version": "triton"}
# triton releases known to crash AITER's import path; neither the matrix nor a pin may name them.
BROKEN_TRITON = {"3.7.0": "dies with SIGSEGV in triton/knobs.py on AITER's import path"}
# pip must see no configuration of the host's: its find-links and extra indexes would be sources outside the plan.
PIP_ISOLATION = ("env", "PIP_CONFIG_FILE=/dev/null")
# No cache: pip would keep one under the login's home, outside what the tool may write (operations/wheels.py puts
# its temporary files in the state directory).
PIP_INSTALL = ("-m", "pip", "install", "--isolated", "--no-input", "--disable-pip-version-check",
               "--progress-bar", "off", "--no-cache-dir")


class MatrixError(ValueError):
    """The wheel matrix is invalid; the message names the file, the JSON path and the reason."""


class WheelPlanError(ValueError):
    """No plan exists for this host; the message names the host's ROCm (or Python) version, the matrix and the fix."""


@dataclass(frozen=True)
class PackageSpec:
    """One distribution of a matrix entry: which version, and where pip takes it from."""

    name: str  # PEP 503 name: torch, amd-aiter, vllm, triton
    version: str
    index_url: str
    wheel: str | None = None
    no_deps: bool = False

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class RocmEntry:
    version: str
    python: tuple[str, ...]
    packages: tuple[PackageSpec, ...]  # in install order; torch and vllm only where the entry names them
    json_path: str  # where the entry sits in the matrix file, for messages

    def package(self, name: str) -> PackageSpec | None:
        return next((spec for spec in self.packages if spec.name == name), None)

    def matches(self, rocm_version: str) -> bool:
        """6.4 matches 6.4 and 6.4.3; 6.4.3 matches 6.4.3 only."""
        return rocm_version.split(".")[: len(self.version.split("."))] == self.version.split(".")


@dataclass(frozen=True)
class Matrix:
    path: Path
    entries: tuple[RocmEntry, ...]

    def entry_for(self, rocm_version: str) -> RocmEntry | None:
        """The most specific entry whose version the host's ROCm version starts with."""
        matching = [entry for entry in self.entries if entry.matches(rocm_version)]
        return max(matching, key=lambda entry: len(entry.version.split(".")), default=None)

    def rocm_versions(self) -> list[str]:
        return [entry.version for entry in self.entries]


@dataclass(frozen=True)
class PipAction:
    package: str
    requirement: str  # what pip is asked for: name==version, or a wheel file
    argv: tuple[str, ...]
    description: str

    def to_json(self) -> dict:
        return {"package": self.package, "requirement": self.requirement, "argv": list(self.argv),
                "description": self.description}


@dataclass(frozen=True)
class WheelPlan:
    python: str  # the target interpreter pip runs under
    rocm_version: str
    matrix_path: Path
    entry_version: str
    sources: tuple[str, ...]  # the pip arguments that name every source the plan installs from
    actions: tuple[PipAction, ...] = ()

    def __str__(self) -> str:
        # pyinfra names an unnamed operation after its arguments: keep that line short.
        return f"ROCm {self.rocm_version}: {', '.join(a.requirement for a in self.actions) or 'nothing to install'}"

    def to_json(self) -> dict:
        return {"python": self.python, "rocm_version": self.rocm_version, "matrix": str(self.matrix_path),
                "matrix_entry": self.entry_version, "sources": list(self.sources),
                "actions": [action.to_json() for action in self.actions]}


# --- the matrix -----------------------------------------------------------------------------------------------

def _package(raw: dict, name: str) -> PackageSpec:
    return PackageSpec(name=name, version=raw["version"], index_url=raw["index_url"], wheel=raw.get("wheel"),
                       no_deps=raw.get("no_deps", False))


def _entry(raw: dict, position: int) -> RocmEntry:
    packages = tuple(_package(raw[key], name) for key, name in PACKAGE_ORDER if key in raw)
    return RocmEntry(version=raw["version"], python=tuple(raw["python"]), packages=packages,
                     json_path=f"$.rocm[{position}]")


def load_matrix(path: Path | str | None = None) -> Matrix:
    """Load and validate a wheel matrix (default: the packaged cdna2/data/wheel-matrix.yaml).

    Raises MatrixError naming the file, the JSON path and the reason, for a schema violation, unreadable YAML or
    two entries for the same ROCm version.
    """
    source = Path(path) if path is not None else DEFAULT_MATRIX_PATH
    try:
        document = load_yaml(source.read_text(encoding="utf-8"))
    except OSError as error:
        raise MatrixError(f"{source}: cannot read the wheel matrix: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise MatrixError(f"{source}: not valid YAML: {error}") from error
    violation = first_violation(document, json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    if violation:
        raise MatrixError(f"{source}: {violation} (schema {SCHEMA_PATH.name})")
    entries = tuple(_entry(raw, position) for position, raw in enumerate(document["rocm"]))
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.version in seen:
            raise MatrixError(f"{source}: {entry.json_path}.version: ROCm {entry.version} is already listed at "
                              f"{seen[entry.version]}; keep one entry per ROCm version")
        seen[entry.version] = entry.json_path
    return Matrix(path=source, entries=entries)


# --- versions -------------------------------------------------------------------------------------------------

def version_satisfies(installed: str, wanted: str) -> bool:
    """Whether an installed version is the wanted one, as pip's ``==`` judges it.

    A wanted version with a local label (2.9.0+rocm6.4) needs that exact build; one without (3.7.1) accepts any
    local label of the same release (3.7.1+rocm7.14 satisfies 3.7.1). An installed version that PEP 440 cannot
    parse never satisfies.
    """
    try:
        installed_version = Version(installed)
    except InvalidVersion:
        return False
    wanted_version = Version(wanted)
    if wanted_version.local is not None:
        return installed_version == wanted_version
    return Version(installed_version.public) == wanted_version


def _normalised_distributions(distributions: Mapping[str, dict | None]) -> dict[str, dict | None]:
    return {canonicalize_name(name): found for name, found in distributions.items()}


# --- the plan -------------------------------------------------------------------------------------------------

def _mirror_sources(index_url: str | None, find_links: str | None) -> tuple[str, ...] | None:
    """pip source arguments that replace every index of the matrix, or None when the host names no mirror."""
    if index_url and find_links:
        return ("--index-url", index_url, "--find-links", find_links)
    if index_url:
        return ("--index-url", index_url)
    if find_links:
        return ("--no-index", "--find-links", find_links)
    return None


def _pip_argv(python: str, spec: PackageSpec, mirror: tuple[str, ...] | None,
              ignore_installed: bool = False) -> tuple[tuple[str, ...], str]:
    # A mirror replaces the matrix's wheel file too: an air-gapped host must not reach for the original URL.
    requirement = spec.wheel if spec.wheel and mirror is None else spec.requirement()
    sources = mirror if mirror is not None else ("--index-url", spec.index_url)
    no_deps = ("--no-deps",) if spec.no_deps else ()
    ignore = ("--ignore-installed",) if ignore_installed else ()
    return (*PIP_ISOLATION, python, *PIP_INSTALL, *sources, *no_deps, *ignore, requirement), requirement


def _found_text(spec: PackageSpec, found: dict | None) -> str:
    """What the install does to the host's copy: said as a replacement where the versions differ, so that --dry
    shows an operator which of their own torch, amd-aiter or triton the deploy would swap for the matrix's pin."""
    if found is None:
        return "not installed"
    if version_satisfies(found["version"], spec.version):
        return f"found {found['version']}"
    return f"replaces the installed {found['version']}"


def _describe(spec: PackageSpec, found: dict | None, mirror: tuple[str, ...] | None, why: str) -> str:
    source = " ".join(mirror) if mirror is not None else (spec.wheel or spec.index_url)
    flags = " with --no-deps" if spec.no_deps else ""
    return f"install {spec.requirement()}{flags} from {source} ({_found_text(spec, found)}{why})"


def _apply_pins(entry: RocmEntry, pins: Mapping[str, str | None], matrix_path: Path) -> dict[str, PackageSpec]:
    specs = {spec.name: spec for spec in entry.packages}
    for key, version in pins.items():
        if version is None:
            continue
        if key not in PIN_KEYS:
            raise WheelPlanError(f"unknown pin `{key}`; pins are {', '.join(sorted(PIN_KEYS))}")
        name = PIN_KEYS[key]
        if name == "triton" and version in BROKEN_TRITON:
            raise WheelPlanError(f"`{key}` pins triton {version}, which {BROKEN_TRITON[version]}; pin 3.7.1")
        if name not in specs:
            raise WheelPlanError(f"`{key}` pins {name} {version}, but {matrix_path} {entry.json_path} (ROCm "
                                 f"{entry.version}) names no {name} index to take it from; add one to the matrix")
        # A pinned version no longer matches the matrix's wheel file, so pip takes it from the index by name.
        current = specs[name]
        specs[name] = PackageSpec(name=name, version=version, index_url=current.index_url, no_deps=current.no_deps)
    return specs


def _target_python(probe: Mapping) -> str:
    python = probe["python"]
    target = python.get("target", python["path"])
    if python.get("target_exists") is False:
        raise WheelPlanError(f"the target Python {target} does not exist on the host; create that environment "
                             "(or set target_python) before installing wheels")
    return target


def _entry_for_host(matrix: Matrix, probe: Mapping) -> RocmEntry:
    rocm = probe["rocm"]
    if rocm.get("version") is None:
        raise WheelPlanError(f"the host's ROCm version is unknown (no {rocm.get('source') or '.info/version'}); "
                             f"{matrix.path} needs it to choose wheels; install ROCm or set rocm_root")
    entry = matrix.entry_for(rocm["version"])
    if entry is None:
        raise WheelPlanError(f"ROCm {rocm['version']} (from {rocm.get('source')}) is not in the wheel matrix "
                             f"{matrix.path}, which covers ROCm {', '.join(matrix.rocm_versions())}; add an entry "
                             "for it or point wheel_matrix at a matrix that has one")
    python_version = ".".join(probe["python"]["version"].split(".")[:2])
    if python_version not in entry.python:
        raise WheelPlanError(f"Python {python_version} is not among the Python versions ({', '.join(entry.python)}) "
                             f"of {matrix.path} {entry.json_path} (ROCm {entry.version}); use an environment "
                             "with one of them or extend the entry")
    return entry


def _refuse_source_build(spec: PackageSpec, found: dict | None, matrix_path: Path) -> None:
    """A source build registers under another name (``aiter``); installing the wheel over it would mix the two."""
    if found is None or found.get("name") is None:
        return
    if canonicalize_name(found["name"]) != spec.name:
        raise WheelPlanError(f"the host has {found['name']} {found['version']} (a source build) where {matrix_path} "
                             f"wants {spec.requirement()}; pin that version (aiter_version: {found['version']}) "
                             "or uninstall the source build first")


def plan_wheels(matrix: Matrix, probe: Mapping, *, pins: Mapping[str, str | None] | None = None,
                index_url: str | None = None, find_links: str | None = None,
                install_vllm: bool = False) -> WheelPlan:
    """The ordered pip installs that make the host's wheels match the matrix entry for its ROCm version.

    + matrix: from ``load_matrix``
    + probe: the host probe (``python``, ``rocm`` and ``distributions`` are read)
    + pins: host-data pins by key (``torch_version``, ``aiter_version``, ``vllm_version``, ``triton_version``);
      None values keep the matrix's version
    + index_url: a PEP 503 mirror that replaces every index of the matrix
    + find_links: a find-links directory (on the host) or URL; alone, pip uses no index at all
    + install_vllm: manage vLLM (install or move it to the matrix's version); otherwise vLLM is left as found

    Raises WheelPlanError, naming the host's ROCm version and the matrix file, when no entry fits the host.
    An empty ``actions`` means nothing to do.
    """
    python = _target_python(probe)
    entry = _entry_for_host(matrix, probe)
    pins = dict(pins or {})
    if pins.get("vllm_version") and not install_vllm:
        raise WheelPlanError(f"`vllm_version` pins vLLM {pins['vllm_version']} but `install_vllm` is false; set "
                             "install_vllm to true or drop the pin")
    specs = _apply_pins(entry, pins, matrix.path)
    if install_vllm and "vllm" not in specs:
        raise WheelPlanError(f"install_vllm is set, but {matrix.path} {entry.json_path} (ROCm {entry.version}) "
                             "offers no vLLM; add one to the matrix (or a mirror's matrix) or set install_vllm false")
    installed = _normalised_distributions(probe["distributions"])
    mirror = _mirror_sources(index_url, find_links)

    actions: list[PipAction] = []
    for _, name in PACKAGE_ORDER:
        spec = specs.get(name)
        if spec is None or (name == "vllm" and not install_vllm):
            continue
        found = installed.get(name)
        # An install cut short (no RECORD) is no install: pip would call it satisfied, and cannot uninstall it.
        cut_short = found is not None and found.get("complete") is False
        up_to_date = found is not None and not cut_short and version_satisfies(found["version"], spec.version)
        if name == "amd-aiter" and found is not None and found.get("install_mode") == "develop":
            continue  # a develop checkout is the operator's own source tree: a wheel never replaces it
        if name == "amd-aiter" and not up_to_date:
            _refuse_source_build(spec, found, matrix.path)
        if name == "triton" and up_to_date and actions:
            why = "; reinstalled last because the installs before it can replace triton"
        elif up_to_date:
            continue
        elif cut_short:
            why = (f"; {found['metadata_dir']} has no RECORD: an install cut short, installed again over it "
                   f"with --ignore-installed")
        elif name == "triton" and found is not None and found["version"] in BROKEN_TRITON:
            why = f"; triton {found['version']} {BROKEN_TRITON[found['version']]}"
        else:
            why = ""
        argv, requirement = _pip_argv(python, spec, mirror, ignore_installed=cut_short)
        actions.append(PipAction(package=name, requirement=requirement, argv=argv,
                                 description=_describe(spec, found, mirror, why)))
    return WheelPlan(python=python, rocm_version=probe["rocm"]["version"], matrix_path=matrix.path,
                     entry_version=entry.version, sources=mirror or (), actions=tuple(actions))


def triton_restore_action(matrix: Matrix, probe: Mapping, version: str, *, index_url: str | None = None,
                          find_links: str | None = None) -> PipAction:
    """The pip action that puts ``triton==version`` back (rollback), from the host's matrix entry or its mirror."""
    entry = _entry_for_host(matrix, probe)
    triton = entry.package("triton")
    spec = PackageSpec(name="triton", version=version, index_url=triton.index_url, no_deps=True)
    mirror = _mirror_sources(index_url, find_links)
    argv, requirement = _pip_argv(_target_python(probe), spec, mirror)
    found = _normalised_distributions(probe["distributions"]).get("triton")
    return PipAction(package="triton", requirement=requirement, argv=argv,
                     description=_describe(spec, found, mirror, "; the version recorded before the first deploy"))


def pins_from_host_data(data: Mapping) -> dict[str, str | None]:
    """The pin keys of a host's data (absent keys are None)."""
    return {key: data.get(key) for key in PIN_KEYS}


# --- command line: python -m cdna2 wheels plan ---------------------------------------------------------------

def _plan_command(args: argparse.Namespace) -> int:
    probe = json.loads(Path(args.probe).read_text(encoding="utf-8"))
    try:
        matrix = load_matrix(args.matrix)
        plan = plan_wheels(matrix, probe, pins=pins_from_host_data(vars(args)), index_url=args.index_url,
                           find_links=args.find_links, install_vllm=args.install_vllm)
    except (MatrixError, WheelPlanError) as error:
        if args.json:
            print(json.dumps({"error": str(error)}, indent=2))
        print(f"wheels: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    print(f"ROCm {plan.rocm_version} -> {plan.matrix_path} entry {plan.entry_version}; python {plan.python}")
    if not plan.actions:
        print("nothing to do: the wheels already match")
    for number, action in enumerate(plan.actions, 1):
        print(f"{number}. {action.description}")
        print(f"   {shlex.join(action.argv)}")
    return 0


def register(subparsers) -> None:
    wheels = subparsers.add_parser("wheels", help="plan the ROCm-matched wheel installs of a probed host")
    commands = wheels.add_subparsers(dest="wheels_command", required=True, metavar="COMMAND")
    plan = commands.add_parser("plan", help="print the pip installs that make a probed host match the matrix")
    plan.add_argument("--probe", required=True, help="the host probe's JSON output (a file)")
    plan.add_argument("--matrix", default=None, help=f"wheel matrix YAML (default: {DEFAULT_MATRIX_PATH})")
    plan.add_argument("--index-url", default=None, help="a PEP 503 mirror replacing every index of the matrix")
    plan.add_argument("--find-links", default=None, help="a find-links directory or URL (then no index is used)")
    for key in PIN_KEYS:
        plan.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None, help=f"pin {PIN_KEYS[key]}")
    plan.add_argument("--install-vllm", action="store_true", help="manage vLLM too")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    plan.set_defaults(func=_plan_command)

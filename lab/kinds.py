"""The kinds of simulated host, how the lab names and addresses them, and their ROCm stand-ins.

A kind fixes what a host looks like: its GPU (as its stand-in ``rocminfo`` reports it), its ROCm stand-in version,
and the real Python packages of its environment at ``/opt/venv``. ``./lab/up N`` cycles through ``KINDS`` in order,
so the default three hosts are one of each and larger labs repeat the same mix.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass

from lab import wheelhouse

PORT = 2222
# First two octets of every lab address. Checkouts that run labs side by side on one machine (git worktrees) each
# set their own (CDNA2_LAB_NET=127.1, 127.2, ...) so their sshds never bind the same address.
LAB_NET = os.environ.get("CDNA2_LAB_NET", "127.0")
DEFAULT_SUBNET = f"{LAB_NET}.10"
MAX_HOSTS = 254  # one loopback address per host: <subnet>.1 .. <subnet>.254

# Every host's environment starts from these (the broken triton, so the deploy has something to fix).
BASE_PACKAGES = (wheelhouse.AITER, wheelhouse.TRITON_BROKEN)


@dataclass(frozen=True)
class Gpu:
    """What the stand-in rocminfo reports for one GPU model (values as real rocminfo prints them)."""

    arch: str
    marketing_name: str
    compute_units: int
    chip_id: int
    l2_kb: int
    max_clock_mhz: int
    shader_engines: int
    vram_kb: int
    bdfids: tuple[int, ...]  # one per card in the host: PCI bus/device/function as rocminfo's decimal BDFID


MI210 = Gpu(
    arch="gfx90a", marketing_name="AMD Instinct MI210", compute_units=104, chip_id=0x740F, l2_kb=8192,
    max_clock_mhz=1700, shader_engines=8, vram_kb=67092480,
    # Two cards at PCIe 87:00.0 and C3:00.0, as on the reference MI210 box (in its device order).
    bdfids=(0x8700, 0xC300),
)
MI300X = Gpu(
    arch="gfx942", marketing_name="AMD Instinct MI300X", compute_units=304, chip_id=0x74A1, l2_kb=4096,
    max_clock_mhz=2100, shader_engines=32, vram_kb=200998912,
    bdfids=(0x0C00, 0x2200, 0x3800, 0x5C00, 0x9F00, 0xAF00, 0xBF00, 0xDF00),
)


@dataclass(frozen=True)
class Kind:
    key: str  # stable identifier, also names the kind's template venv
    group: str  # host-name prefix and inventory group
    gpu: Gpu
    rocm_version: str  # written to the stand-in /opt/rocm/.info/version
    extra_packages: tuple[str, ...]  # installed with --no-deps on top of BASE_PACKAGES
    # A git tag of AITER: the host's AITER is a develop-mode checkout of it (lab/develop.py), not the wheel.
    aiter_checkout: str | None = None

    @property
    def packages(self) -> tuple[str, ...]:
        return BASE_PACKAGES + self.extra_packages


KINDS = (
    Kind(key="mi210-rocm6", group="mi210", gpu=MI210, rocm_version="6.4.3", extra_packages=("vllm==0.23.0",)),
    Kind(key="mi210-rocm7", group="mi210", gpu=MI210, rocm_version="7.14.0", extra_packages=("vllm==0.26.0",)),
    Kind(key="mi300x-rocm7", group="mi300x", gpu=MI300X, rocm_version="7.14.0", extra_packages=()),
)
# Opt-in (``./lab/up --aiter develop``): every host of such a lab is this kind, a gfx90a host whose AITER is a git
# checkout of a tag installed in develop mode, as AITER's README installs it.
DEVELOP_KIND = Kind(key="mi210-develop", group="mi210", gpu=MI210, rocm_version="7.14.0", extra_packages=(),
                    aiter_checkout="v0.1.19")
AITER_MODES = ("wheel", "develop")
# The kind of a --shared lab's hosts that mount one environment (a stand-in for NFS or Lustre): nodes of a cluster
# that share a Python environment share their ROCm version too.
SHARED_KIND = KINDS[1]


@dataclass(frozen=True)
class PlannedHost:
    index: int  # 0-based position in the lab
    name: str
    kind: Kind
    address: str
    shares_environment: bool = False  # its /opt/venv is the lab's shared environment (``./lab/up --shared``)


def _letters(index: int) -> str:
    """0 -> a, 25 -> z, 26 -> aa, ...: the host-name suffix, so names stay short and sort like the lab order."""
    suffix = ""
    index += 1
    while index:
        index, remainder = divmod(index - 1, 26)
        suffix = string.ascii_lowercase[remainder] + suffix
    return suffix


def plan_host(index: int, subnet: str, aiter: str = "wheel", shared: int = 0) -> PlannedHost:
    """Host ``index`` of the lab; the first ``shared`` hosts are all SHARED_KIND (nodes that mount one environment
    are alike), the others cycle through KINDS."""
    if aiter == "develop":
        kind = DEVELOP_KIND
    else:
        kind = SHARED_KIND if index < shared else KINDS[(index - shared) % len(KINDS)]
    return PlannedHost(index=index, name=f"{kind.group}-{_letters(index)}", kind=kind, address=f"{subnet}.{index + 1}",
                       shares_environment=index < shared)


def check_subnet(subnet: str) -> None:
    """Hosts must stay on loopback: 127.B.C, so host i is 127.B.C.<i+1>."""
    octets = subnet.split(".")
    if len(octets) != 3 or octets[0] != "127" or not all(o.isdigit() and int(o) <= 255 for o in octets):
        raise ValueError(f"subnet {subnet!r} is not a loopback /24 prefix like {DEFAULT_SUBNET}")


def check_host_count(count: int) -> None:
    if not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"a lab has 1 to {MAX_HOSTS} hosts (one loopback address each), not {count}")


def plan_hosts(count: int, subnet: str, aiter: str = "wheel", shared: int = 0) -> list[PlannedHost]:
    check_host_count(count)
    return [plan_host(index, subnet, aiter, shared) for index in range(count)]


def kind_by_key(key: str) -> Kind:
    for kind in (*KINDS, DEVELOP_KIND):
        if kind.key == key:
            return kind
    raise KeyError(f"unknown lab host kind {key!r}; known kinds: {', '.join(k.key for k in KINDS)}")


# --- ROCm stand-in ------------------------------------------------------------------------------------------------

STAND_IN_NOTE = "STAND-IN written by the cdna2 simulated lab (lab/kinds.py): no ROCm, no GPU, no KFD on this host."


def rocm_version_file(kind: Kind) -> str:
    return f"{kind.rocm_version}\n"


def _field(label: str, value: object, indent: int = 2) -> str:
    # rocminfo pads "label:" to a 26-column field after the indent.
    return f"{' ' * indent}{label + ':':<25}{value}"


def _hex(value: int) -> str:
    return f"{value}(0x{value:x})"


def _cpu_agent() -> list[str]:
    name = "AMD EPYC 7763 64-Core Processor"
    return [
        "*******", "Agent 1", "*******",
        _field("Name", name), _field("Uuid", "CPU-XX"), _field("Marketing Name", name),
        _field("Vendor Name", "CPU"), _field("Feature", "None specified"), _field("Profile", "FULL_PROFILE"),
        _field("Float Round Mode", "NEAR"), _field("Max Queue Number", _hex(0)), _field("Queue Min Size", _hex(0)),
        _field("Queue Max Size", _hex(0)), _field("Queue Type", "MULTI"), _field("Node", 0),
        _field("Device Type", "CPU"), _field("Cache Info", ""), _field("L1", f"{_hex(32768)} KB", 4),
        _field("Chip ID", _hex(0)), _field("ASIC Revision", _hex(0)), _field("Cacheline Size", _hex(64)),
        _field("Max Clock Freq. (MHz)", 3529), _field("BDFID", 0), _field("Internal Node ID", 0),
        _field("Compute Unit", 128), _field("SIMDs per CU", 0), _field("Shader Engines", 0),
        _field("Shader Arrs. per Eng.", 0), _field("WatchPts on Addr. Ranges", 1), _field("Features", "None"),
        _field("ISA Info", ""),
    ]


def _gpu_agent(gpu: Gpu, agent_number: int, node: int, bdfid: int) -> list[str]:
    return [
        "*******", f"Agent {agent_number}", "*******",
        _field("Name", gpu.arch), _field("Uuid", f"GPU-{gpu.chip_id:04x}{bdfid:012x}"),
        _field("Marketing Name", gpu.marketing_name), _field("Vendor Name", "AMD"),
        _field("Feature", "KERNEL_DISPATCH"), _field("Profile", "BASE_PROFILE"), _field("Float Round Mode", "NEAR"),
        _field("Max Queue Number", _hex(128)), _field("Queue Min Size", _hex(64)),
        _field("Queue Max Size", _hex(131072)), _field("Queue Type", "MULTI"), _field("Node", node),
        _field("Device Type", "GPU"), _field("Cache Info", ""), _field("L1", f"{_hex(16)} KB", 4),
        _field("L2", f"{_hex(gpu.l2_kb)} KB", 4), _field("Chip ID", _hex(gpu.chip_id)),
        _field("ASIC Revision", _hex(1)), _field("Cacheline Size", _hex(128)),
        _field("Max Clock Freq. (MHz)", gpu.max_clock_mhz), _field("BDFID", bdfid), _field("Internal Node ID", node),
        _field("Compute Unit", gpu.compute_units), _field("SIMDs per CU", 4),
        _field("Shader Engines", gpu.shader_engines), _field("Shader Arrs. per Eng.", 1),
        _field("WatchPts on Addr. Ranges", 4), _field("Coherent Host Access", "FALSE"),
        _field("Features", "KERNEL_DISPATCH"), _field("Fast F16 Operation", "TRUE"),
        _field("Wavefront Size", _hex(64)), _field("Workgroup Max Size", _hex(1024)),
        _field("Max Waves Per CU", _hex(32)), _field("Max Work-item Per CU", _hex(2048)),
        _field("Pool Info", ""), "    Pool 1",
        _field("Segment", "GLOBAL; FLAGS: COARSE GRAINED", 6), _field("Size", f"{_hex(gpu.vram_kb)} KB", 6),
        _field("ISA Info", ""), "    ISA 1",
        _field("Name", f"amdgcn-amd-amdhsa--{gpu.arch}:sramecc+:xnack-", 6),
        _field("Machine Models", "HSA_MACHINE_MODEL_LARGE", 6), _field("Profiles", "HSA_PROFILE_BASE", 6),
    ]


def rocminfo_output(kind: Kind) -> str:
    lines = [
        "ROCk module is loaded", "=====================", "HSA System Attributes", "=====================",
        _field("Runtime Version", "1.1", 0), _field("Runtime Ext Version", "1.6", 0),
        _field("System Timestamp Freq.", "1000.000000MHz", 0),
        _field("Sig. Max Wait Duration", "18446744073709551615 (0xFFFFFFFFFFFFFFFF) (timestamp count)", 0),
        _field("Machine Model", "LARGE", 0), _field("System Endianness", "LITTLE", 0),
        _field("Mwaitx", "DISABLED", 0), _field("DMAbuf Support", "YES", 0),
        "", "==========", "HSA Agents", "==========",
        *_cpu_agent(),
    ]
    for card, bdfid in enumerate(kind.gpu.bdfids):
        lines += _gpu_agent(kind.gpu, agent_number=card + 2, node=card + 1, bdfid=bdfid)
    lines += ["*** Done ***"]
    return "\n".join(lines) + "\n"


def rocminfo_script(kind: Kind) -> str:
    """An executable /opt/rocm/bin/rocminfo that prints the kind's agent listing (a quoted heredoc: no expansion)."""
    return (
        "#!/bin/sh\n"
        f"# {STAND_IN_NOTE}\n"
        f"# Prints a fixed agent listing in real rocminfo's format for: {kind.gpu.marketing_name} ({kind.gpu.arch}).\n"
        "cat <<'ROCMINFO_END'\n"
        f"{rocminfo_output(kind)}"
        "ROCMINFO_END\n"
    )

"""What the probe finds of ROCm and the GPUs: ROCm's version and where it comes from, rocminfo's GPU agents, the
KFD topology, and the AMD GPUs on the PCI bus (which show there even when their driver did not load).
"""

from __future__ import annotations

import os

from cdna2.host.digests import read_text
from cdna2.host.programs import run_program

# Where the KFD driver publishes its GPU nodes; gfx_target_version there is the arch as major*10000+minor*100+step.
KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"
# Every PCI device, driver or not: a GPU whose driver did not load shows only here.
PCI_DEVICES = "/sys/bus/pci/devices"
AMD_PCI_VENDOR = "0x1002"
PCI_GPU_CLASSES = ("0x03", "0x12")  # display controllers (an MI210 is 0x0380) and processing accelerators


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
        raw = read_text(version_file).strip()
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
        for line in read_text(properties).splitlines():
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
            if read_text(os.path.join(devices_dir, address, "vendor")).strip() != AMD_PCI_VENDOR:
                continue
            pci_class = read_text(os.path.join(devices_dir, address, "class")).strip()
            device = read_text(os.path.join(devices_dir, address, "device")).strip()
        except OSError:  # a device removed while read, or a file this kernel does not publish
            continue
        if pci_class.startswith(PCI_GPU_CLASSES):
            found.append({"address": address, "device": device, "class": pci_class})
    return found


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

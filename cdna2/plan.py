"""Which steps apply to a host, decided from its probe alone (pure functions, no I/O)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from cdna2.host.distributions import recorded_versions

TARGET_ARCH = "gfx90a"


NO_GPU_AT_BUILD = "no GPU at build time"


def with_data_arch(probe: dict[str, Any], gpu_arch: str | None,
                   container: bool) -> tuple[dict[str, Any], str | None]:
    """The probe with its GPU arch taken from host data when it found no GPU, and why GPU checks cannot run.

    An image is built where no GPU exists, so the arch it is built for can only come from data (``gpu_arch``), and
    only on a `container` target: elsewhere a GPU the probe cannot see is a fault, and the data's arch is never
    used (data_arch_refusal says why such a host is refused). A device the probe does find always wins: the data's
    arch is then ignored and the GPU checks run as usual.
    """
    gpu = probe["gpu"]
    if gpu_arch is None or gpu["agents"] or not container:
        return probe, None
    reason = f"{NO_GPU_AT_BUILD} (arch {gpu_arch} from the host data key gpu_arch)"
    return {**probe, "gpu": {**gpu, "arch": gpu_arch, "arches": [gpu_arch], "source": "host data gpu_arch"}}, reason


def data_arch_refusal(probe: dict[str, Any], gpu_arch: str | None, container: bool) -> str | None:
    """Why a host that is not a container target is refused when the probe found no GPU and its data names one.

    On such a host (reached over SSH, say) the data's arch would have provisioned it as if the GPU were there and
    turned every GPU check into "skipped" on a node whose GPU is broken (driver not loaded, /dev/kfd not readable).
    """
    if gpu_arch is None or probe["gpu"]["agents"] or container:
        return None
    return (f"the probe found no GPU (rocminfo, KFD topology), yet the host data sets gpu_arch {gpu_arch}; that key "
            "stands in for a GPU only on container targets (an image is built where none exists), and on this host "
            "a GPU that does not show is a fault to fix (amdgpu driver, /dev/kfd access). Fix the GPU, or remove "
            "gpu_arch from this host's data")


# PCI device ids of gfx90a (Aldebaran) parts, as the Linux amdgpu driver's pciidlist has them; 0x740f is the MI210.
GFX90A_PCI_DEVICES = frozenset({"0x7408", "0x740c", "0x740f", "0x7410"})


def hidden_gpu_refusal(probe: dict[str, Any], container: bool) -> str | None:
    """Why a host is refused whose gfx90a GPUs are on the PCI bus while neither rocminfo nor the KFD topology lists
    a GPU agent: its driver did not load (or /dev/kfd is closed to the login), and leaving it alone would report a
    broken GPU as no GPU. Not on a container target, which sees its host's PCI bus without /dev/kfd at build time.
    """
    hidden = [found for found in probe["gpu"]["pci_without_agent"] if found["device"] in GFX90A_PCI_DEVICES]
    if container or not hidden:
        return None
    listed = ", ".join(f"{found['address']} [1002:{found['device'].removeprefix('0x')}]" for found in hidden)
    said = [error for error in probe["errors"] if "rocminfo" in error]
    return (f"{len(hidden)} gfx90a GPU{'s' * (len(hidden) > 1)} on the PCI bus ({listed}), yet neither rocminfo nor "
            f"the KFD topology lists a GPU agent{f' ({said[0]})' if said else ''}: the amdgpu driver is not loaded "
            "or /dev/kfd is not open to this login. Fix that (dmesg | grep amdgpu; ls -l /dev/kfd), then run the "
            "deploy again")


def arch_skip_reason(probe: dict[str, Any]) -> str | None:
    """Why translation and patching leave this host alone, or None when it is a gfx90a host."""
    gpu = probe["gpu"]
    if gpu["arch"] == TARGET_ARCH:
        return None
    if len(gpu["arches"]) > 1:
        return f"mixed GPU arches {', '.join(gpu['arches'])}: one AITER tree cannot serve them; left alone"
    if not gpu["agents"]:
        return "no GPU agent found (rocminfo, KFD topology): the arch is unknown; left alone"
    names = sorted({agent["marketing_name"] or agent["arch"] for agent in gpu["agents"]})
    return (f"GPU arch {gpu['arch']} ({', '.join(names)}): AITER has native kernels for it; translation and "
            f"patching are for {TARGET_ARCH} only, left alone")


def sudo_refusal(probe: dict[str, Any]) -> str | None:
    """Why the login user cannot act as root on the host (the probe then ran unprivileged), or None."""
    refused = probe.get("sudo_refused")
    if not refused:
        return None
    return (f"user {refused['user']} may not run commands as root through sudo without a password "
            f"({refused['error'] or 'sudo said nothing'}): give {refused['user']} passwordless sudo (NOPASSWD) "
            f"or log in as root")


def develop_checkout(dist: dict[str, Any] | None) -> str | None:
    """The git checkout of a develop-mode install (setup.py develop, pip install -e), None for a wheel."""
    return dist["location"] if dist and dist.get("install_mode") == "develop" else None


def target_env_error(probe: dict[str, Any]) -> str | None:
    """Why the host's target Python environment cannot be provisioned (or not reached as root), or None."""
    refusal = sudo_refusal(probe)
    if refusal:
        return refusal
    python = probe["python"]
    if not python["is_target"]:
        return (f"target Python {python['target']} is missing on the host: install the Python environment that "
                f"holds AITER there, or set `target_python` to its interpreter")
    aiter = probe["distributions"].get("amd-aiter")
    if develop_checkout(aiter) and aiter["checkout_error"]:
        return f"amd-aiter is installed in develop mode from {aiter['location']}, but {aiter['checkout_error']}"
    return None


SKIP, FAIL, PROCEED = "skip", "fail", "proceed"


def kernels_decision(probe: dict[str, Any], enabled: bool, installs_aiter: bool = False) -> tuple[str, str]:
    """(SKIP, why) for a host the kernels step leaves alone, (FAIL, why) for one it cannot serve, else PROCEED.

    ``installs_aiter``: this run's wheels step installs amd-aiter where there is none: it is translated next run."""
    if not enabled:
        return SKIP, "translate_kernels is off for this host"
    reason = arch_skip_reason(probe)
    if reason:
        return SKIP, reason
    if probe["distributions"]["amd-aiter"] is None:
        if installs_aiter:
            return PROCEED, "amd-aiter is installed by this run's wheels step"
        return FAIL, "amd-aiter is not installed in the target environment: enable install_wheels or install it"
    aiter, checkout = probe["aiter"], develop_checkout(probe["distributions"]["amd-aiter"])
    listing = "its checkout's git HEAD" if checkout else "its RECORD"
    if not aiter or not aiter["gfx942_record_digest"] or not aiter["gfx942_record_files"]:
        return SKIP, f"this amd-aiter lists no hsa/gfx942 kernel tree in {listing}: nothing to translate"
    if not aiter["gfx942_on_disk"]:
        return FAIL, (f"{aiter['hsa_root']}/gfx942 is in git HEAD but missing on disk: restore it (git checkout -- "
                      f"hsa/gfx942 in {checkout})" if checkout else
                      f"{aiter['hsa_root']}/gfx942 is listed in RECORD but missing on disk: reinstall amd-aiter")
    return PROCEED, f"gfx942 tree {aiter['gfx942_record_digest'][:12]} ({aiter['gfx942_record_files']} files)"


def installed_versions(probe: dict[str, Any]) -> dict[str, str | None]:
    return recorded_versions(probe["distributions"])


def deployed_record(probe: dict[str, Any], requirements: list[str], kernels_digest: str | None,
                    patch_sets: dict[str, list[str]], kernel_hazards: dict[str, str] | None = None,
                    fp8_configs: dict[str, str] | None = None) -> dict[str, Any]:
    """What a host holds once this run's plan is carried out: verify compares later probes with it.

    ``kernel_hazards``: the kernel policy the installed kernel tree was made under (Policy.record).
    ``fp8_configs``: the tuned configs installed in vLLM, path -> RECORD-style hash (left out when none).
    """
    versions = installed_versions(probe)
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if name in versions and version:
            versions[name] = version
    record = {"packages": versions, "kernels": kernels_digest, "patch_sets": patch_sets}
    if kernel_hazards is not None:
        record["kernel_hazards"] = kernel_hazards
    if fp8_configs:
        record["fp8_block_configs"] = fp8_configs
    return record


def installed_kernel_digest(probe: dict[str, Any], keep_families: Collection[str] = ()) -> str | None:
    """The digest of ``hsa/gfx90a`` as the deploy installed it: the tree on disk, or, where the smoke step withheld
    kernel families from it since (cdna2/host/families.py), the digest it had before, as the kernels record keeps
    it. A withheld family the host data now keeps (``keep_families``) makes it the tree on disk again: the deploy
    then installs the whole tree, and the smoke test judges that family anew."""
    found = (probe["aiter"] or {}).get("gfx90a_digest")
    record = ((probe["state"] or {}).get("kernels") or {})
    withheld = record.get("withheld") or {}
    if found and withheld and record.get("digest") == found and not set(withheld) & set(keep_families):
        return record.get("installed_digest")
    return found


def disk_space_problem(probe: dict[str, Any], archive_bytes: int, tree_bytes: int) -> str | None:
    """Why the kernel tree would not fit on the host (staging for the archive, beside hsa/ for the tree), or None.

    Checked before anything is uploaded, so a full disk is reported with the sizes rather than as a failed copy.
    """
    staging_free, hsa_free = probe["state_dir_free_bytes"], probe["aiter"]["free_bytes"]
    if staging_free is not None and staging_free < archive_bytes:
        return (f"{staging_free} bytes free for <state_dir>/staging, the kernel archive needs {archive_bytes}: free "
                f"space there or point state_dir elsewhere")
    if hsa_free is not None and hsa_free < tree_bytes:
        return (f"{hsa_free} bytes free beside {probe['aiter']['hsa_root']}, the translated tree needs {tree_bytes}: "
                f"free space in the Python environment's filesystem")
    return None


def upload_space_problem(statfs: str, needed_bytes: int, directory: str, host_name: str) -> str | None:
    """Why an upload of ``needed_bytes`` into ``directory`` failed for want of room, from ``stat -f -c '%a %S %d'``
    run there after the failure (free blocks, block size, free inodes), or None when there was room (another cause).

    The probe measured enough room before; the disk filled up during the upload itself (SFTP reports that only as
    a failure, not as ENOSPC).
    """
    try:
        blocks, block_size, inodes = (int(word) for word in statfs.split()[:3])
    except ValueError:
        return None
    free = blocks * block_size
    if free >= needed_bytes and inodes > 0:
        return None
    return (f"no space left on {directory} on {host_name}: the kernel archive needs {needed_bytes} bytes, {free} "
            f"bytes and {inodes} inodes are free now (the disk filled up during the upload)")

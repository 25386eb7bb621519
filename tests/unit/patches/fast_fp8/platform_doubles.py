"""Test doubles for vLLM's GPU platform, which cannot exist on this machine (no GPU, no ROCm).

Only what the extracted fp8_utils functions ask of the platform is doubled: ``current_platform`` (is_rocm, is_xpu,
get_device_name), the ``vllm.platforms.rocm`` arch predicates, and ``get_device_name_as_file_name``. The arch table
mirrors vLLM's own (``_ON_MI3XX``/``_ON_GFX9`` in vllm/platforms/rocm.py of 0.23.0, 0.26.0 and 0.33.0). ``envs`` is
a stub of vLLM's settings module holding the one setting the 0.33.0 launcher reads, at its default.
"""

from __future__ import annotations

import sys
import types
from collections import Counter

# arch -> (on_gfx9, on_mi3xx), as vllm/platforms/rocm.py derives them from _GCN_ARCH.
ROCM_ARCHES = {
    "gfx90a": (True, False),
    "gfx942": (True, True),
    "gfx950": (True, True),
    "gfx1100": (False, False),
}
CUDA = "cuda"
DEVICE_NAMES = {"gfx90a": "AMD Instinct MI210", "gfx942": "AMD Instinct MI300X", "gfx950": "AMD Instinct MI355X",
                "gfx1100": "AMD Radeon RX 7900 XTX", CUDA: "NVIDIA H100"}


class FakePlatform:
    """Test double of vllm.platforms.current_platform: a ROCm device of one arch, or a CUDA device."""

    def __init__(self) -> None:
        self.arch = "gfx90a"
        self.arch_queries: Counter[str] = Counter()  # calls of the vllm.platforms.rocm predicates, by name

    def select(self, arch: str) -> None:
        if arch != CUDA and arch not in ROCM_ARCHES:
            raise ValueError(f"unknown arch {arch!r}; the doubles know {sorted(ROCM_ARCHES)} and {CUDA!r}")
        self.arch = arch
        self.arch_queries.clear()

    def is_rocm(self) -> bool:
        return self.arch != CUDA

    def is_xpu(self) -> bool:
        return False

    def get_device_name(self) -> str:
        return DEVICE_NAMES[self.arch]

    def _rocm_flags(self, predicate: str) -> tuple[bool, bool]:
        # Counted so the tests can show the eligibility predicate never asks ROCm questions on a CUDA device.
        self.arch_queries[predicate] += 1
        return ROCM_ARCHES.get(self.arch, (False, False))


current_platform = FakePlatform()
envs = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False)


def get_device_name_as_file_name() -> str:
    return current_platform.get_device_name().replace(" ", "_")


def on_gfx9() -> bool:
    return current_platform._rocm_flags("on_gfx9")[0]


def on_mi3xx() -> bool:
    return current_platform._rocm_flags("on_mi3xx")[1]


def on_gfx1250() -> bool:
    current_platform._rocm_flags("on_gfx1250")
    return False  # none of the doubled arches is gfx1250 (read by the 0.33.0 launcher only)


def _rocm_module() -> types.ModuleType:
    module = types.ModuleType("vllm.platforms.rocm", "Test double of vllm.platforms.rocm (arch predicates only).")
    module.on_gfx9, module.on_mi3xx, module.on_gfx1250 = on_gfx9, on_mi3xx, on_gfx1250
    return module


def install() -> None:
    """Register the doubles as vllm, vllm.platforms and vllm.platforms.rocm (vLLM itself is not importable here)."""
    vllm = types.ModuleType("vllm", "Test double package: only vllm.platforms is provided.")
    platforms = types.ModuleType("vllm.platforms", "Test double of vllm.platforms.")
    platforms.current_platform = current_platform
    rocm = _rocm_module()
    vllm.platforms, platforms.rocm = platforms, rocm
    sys.modules.update({"vllm": vllm, "vllm.platforms": platforms, "vllm.platforms.rocm": rocm})

"""Test double of amdsmi, vLLM's device query: one GPU of the arch named by ``$CDNA2_GATES_ARCH``.

There is no AMD GPU here. vLLM asks amdsmi whether a ROCm device exists (vllm/platforms/__init__.py) and which gfx
arch it is (``_query_gcn_arch_from_amdsmi`` in vllm/platforms/rocm.py); everything vLLM derives from that answer is
vLLM's own code. Any amdsmi call not doubled here raises, so vLLM takes its own error path instead of a made-up value.
"""

import os

# arch -> what amdsmi_get_gpu_asic_info reports for a card of that arch (an MI210 reports 0x740f).
DEVICES = {
    "gfx90a": {"target_graphics_version": "gfx90a", "market_name": "AMD Instinct MI210", "device_id": "0x740f"},
    "gfx942": {"target_graphics_version": "gfx942", "market_name": "AMD Instinct MI300X", "device_id": "0x74a1"},
}


class AmdSmiException(Exception):
    pass


def _device() -> dict:
    arch = os.environ.get("CDNA2_GATES_ARCH", "")
    if arch not in DEVICES:
        raise AmdSmiException(f"amdsmi double: CDNA2_GATES_ARCH={arch!r} is not one of {sorted(DEVICES)}")
    return DEVICES[arch]


def amdsmi_init(*args, **kwargs) -> None:
    _device()


def amdsmi_shut_down(*args, **kwargs) -> None:
    pass


def amdsmi_get_processor_handles() -> list[str]:
    return ["gpu-0"]


def amdsmi_get_gpu_asic_info(handle) -> dict:
    return dict(_device())


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def not_doubled(*args, **kwargs):
        raise AmdSmiException(f"amdsmi double: {name} is not doubled (no GPU here)")

    return not_doubled

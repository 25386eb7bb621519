"""Test double of an installed amd-aiter: present (``find_spec("aiter")`` finds it, ``import aiter`` works), but its
compiled extensions cannot load here (no ROCm, no GPU), so any attribute vLLM asks of it raises.

vLLM's gates ask only whether AITER is installed; they never call into it.
"""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"aiter double: aiter.{name} needs AITER's compiled extensions, which cannot load without a GPU")

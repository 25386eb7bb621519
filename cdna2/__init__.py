"""Core of the MI210 (gfx90a) AITER provisioning tool.

Everything that decides what a host needs lives here: data schemas, the host probe script, kernel translation,
manifests, the patch engine and reports. This package never imports pyinfra, so it runs and is tested on its own;
the pyinfra operations under ``operations/`` are thin wrappers over it.
"""

__version__ = "0.1.0"

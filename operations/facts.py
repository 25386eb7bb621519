"""Facts about MI210 hosts."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError
from typing_extensions import override

from operations.agent import agent_command

PROBE_SOURCE = resources.files("cdna2").joinpath("host", "probe.py").read_text()


class HostProbe(FactBase[dict]):
    """
    Returns everything the deploy needs to know about the host, read in one round trip by cdna2/host/probe.py:
    OS, target Python, ROCm version and its source, GPU agents, the installed amd-aiter, torch, triton and vLLM,
    AITER's kernel-tree digests, the contents of the files the patch sets touch, and this tool's recorded state.

    The probe runs under ``target_python``; when that interpreter is missing it runs under ``python3`` and says so
    in ``errors``. See cdna2/host/probe.py for every field.

    .. code:: python

        {"python": {"version": "3.11.7", "is_target": True, ...}, "rocm": {"version": "6.4.3", ...},
         "gpu": {"arch": "gfx90a", "agents": [...]}, "distributions": {"triton": {"version": "3.7.0", ...}, ...},
         "aiter": {"gfx942_record_digest": "...", "gfx90a_digest": None, ...}, "errors": []}
    """

    @override
    def command(self, target_python: str, rocm_root: str, state_dir: str, agent_dir: str,
                patch_files: dict[str, list[str]] | None = None,
                record_check: list[str] | None = None) -> StringCommand:
        options = json.dumps({"target_python": target_python, "rocm_root": rocm_root, "state_dir": state_dir,
                              "agent_dir": agent_dir, "patch_files": patch_files or {},
                              "record_check": record_check or []}, sort_keys=True)
        # Fall back to python3 so a host without its target environment is reported, not failed mid-probe.
        return StringCommand(
            "P=", QuoteString(target_python), '; [ -x "$P" ] || P=python3; "$P" -c ', QuoteString(PROBE_SOURCE),
            " ", QuoteString(options), _separator="",
        )

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads("\n".join(output))
        except ValueError as error:
            raise FactProcessError(f"host probe printed no JSON ({error}); first line: {output[:1]}") from error


class SmokeResult(FactBase[dict]):
    """
    Returns the on-host smoke test's JSON (cdna2/host/smoke.py), run from the installed agent in a fresh process:
    ``{"checks": [{"name", "kind", "status", "detail"}], "passed", "failed", "skipped", "wrong", "device",
    "host_arch", "gpu_checks"}``. ``host_arch`` is the arch the host probe saw (None: no GPU); with
    ``gpu_checks`` False the GPU checks are skipped.

    The smoke test exits 1 when a check failed; the fact still returns its JSON so the deploy can name the checks.
    """

    @override
    def command(self, target_python: str, state_dir: str, site_packages: str, expect_triton: str,
                host_arch: str | None, gpu_checks: bool, no_gpu_reason: str | None = None) -> StringCommand:
        no_gpu = ("--no-gpu", no_gpu_reason) if no_gpu_reason else ()
        return StringCommand(
            agent_command(target_python, state_dir, "smoke", "--site-packages", site_packages,
                          "--state-dir", state_dir, "--host-arch", host_arch or "none",
                          *([] if gpu_checks else ["--no-gpu-checks"]), *no_gpu, "--expect-triton", expect_triton,
                          "--json"),
            "|| true",
        )

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError) as error:
            raise FactProcessError(f"smoke test printed no JSON ({error}): {output[-3:]}") from error

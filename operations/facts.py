"""Facts about MI210 hosts."""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, Host, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError
from typing_extensions import override

from cdna2.agent import agent_dir
from cdna2.login import expected_state_dir
from cdna2.probe_payload import PROBE_BOOTSTRAP, PROBE_PAYLOAD
from cdna2.probe_memo import remembered_state_dir
from operations.agent import agent_command

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
    def command(self, target_python: str, rocm_root: str, state_dir: str | None, agent_dir: str | None,
                patch_files: dict[str, list[str]] | None = None, record_check: list[str] | None = None,
                known_contents: list[str] | None = None, record_memo: dict | None = None, sudo: bool = False,
                sudo_user: str | None = None, shared_environment: bool = False,
                triton_sources: bool = False) -> StringCommand:
        # known_contents, record_memo: what the controller holds already (cdna2/patches/contents.py,
        # cdna2/probe_memo.py), so a host that has not changed sends no file bytes and reads no RECORD.
        options = json.dumps({"target_python": target_python, "rocm_root": rocm_root, "state_dir": state_dir,
                              "shared_environment": shared_environment, "triton_sources": triton_sources,
                              "patch_files": patch_files or {},
                              "record_check": record_check or [], "known_contents": known_contents or [],
                              "record_memo": record_memo or {}}, sort_keys=True)
        # Fall back to python3 so a host without its target environment is reported, not failed mid-probe.
        probe = StringCommand('"$P"', "-c", QuoteString(PROBE_BOOTSTRAP), QuoteString(agent_dir or ""),
                              QuoteString(PROBE_PAYLOAD), QuoteString(options))
        find_python = StringCommand("P=", QuoteString(target_python), '; [ -x "$P" ] || P=python3;', _separator="")
        if not sudo:
            return StringCommand(find_python, probe)
        # sudo ourselves (the fact runs with _sudo=False, see host_probe): a login that may not sudo without a
        # password is probed unprivileged and says so (``sudo_refused``), for the preflight to fail that host by
        # name, instead of pyinfra prompting for a password on the controller.
        # The probe's text appears once: sshd hands the whole command line to the shell as one argument, which Linux
        # caps at 128 KiB (MAX_ARG_STRLEN), and the quoted probe is over half of that (twice, it no longer fit).
        as_root = StringCommand("sudo", "-n", "-H", *(("-u", QuoteString(sudo_user)) if sudo_user else ()))
        return StringCommand(
            find_python, "refused=;", "if", StringCommand("R=$(", as_root, " true 2>&1);", _separator=""),
            "then", "set", "--", as_root, ";", "else", "set", "--", "env;", "refused=1;", "fi;",
            '"$@"', probe, '${refused:+"$R"}',
        )

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads("\n".join(output))
        except ValueError as error:
            raise FactProcessError(f"host probe printed no JSON ({error}); first line: {output[:1]}") from error


def host_probe(host: Host, state_dir: str | None, **options: Any) -> dict[str, Any]:
    """``host.get_fact(HostProbe, **options)``, through sudo when the host's data asks for it (``_sudo``,
    ``_sudo_user``): the probe runs sudo itself, so that a refusal is reported in the probe, not prompted for.

    ``state_dir``: host data's (None: the login's default, which the probe finds on the host and reports as
    ``probe["state_dir"]["path"]``; the installed agent's probe is used where the controller can tell the path
    beforehand, see cdna2.login.expected_state_dir). With host data ``shared_environment`` the probe takes the
    environment's own state directory instead."""
    sudo = bool(host.data.get("_sudo"))
    expected = expected_state_dir(state_dir, host.data.get("ssh_user"), sudo, remembered_state_dir(host.name))
    return host.get_fact(HostProbe, sudo=sudo, sudo_user=host.data.get("_sudo_user"), _sudo=False,
                         state_dir=state_dir, agent_dir=expected and agent_dir(expected),
                         shared_environment=bool(host.data.get("shared_environment")), **options)


class SmokeResult(FactBase[dict]):
    """
    Returns the on-host smoke test's JSON (cdna2/host/smoke.py), run from the installed agent in a fresh process:
    ``{"checks": [{"name", "kind", "status", "detail"}], "passed", "failed", "skipped", "wrong", "device",
    "host_arch", "gpu_checks"}``, with ``families`` (each installed kernel family's verdict) and ``withhold``
    (family -> why its code objects must leave hsa/gfx90a) when ``families`` are given. ``host_arch`` is the arch
    the host probe saw (None: no GPU); with ``gpu_checks`` False the GPU checks are skipped.

    The smoke test exits 1 when a check failed; the fact still returns its JSON so the deploy can name the checks.
    """

    @override
    def command(self, target_python: str, state_dir: str, site_packages: str, expect_triton: str,
                host_arch: str | None, gpu_checks: bool, no_gpu_reason: str | None = None,
                families: list[dict] | None = None, keep_families: list[str] = ()) -> StringCommand:
        no_gpu = ("--no-gpu", no_gpu_reason) if no_gpu_reason else ()
        judged = ("--families", json.dumps(families, sort_keys=True)) if families is not None else ()
        return StringCommand(
            agent_command(target_python, state_dir, "smoke", "--site-packages", site_packages,
                          "--state-dir", state_dir, "--host-arch", host_arch or "none",
                          *([] if gpu_checks else ["--no-gpu-checks"]), *no_gpu, "--expect-triton", expect_triton,
                          *judged, *(arg for name in keep_families for arg in ("--keep-family", name)), "--json"),
            "|| true",
        )

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError) as error:
            raise FactProcessError(f"smoke test printed no JSON ({error}): {output[-3:]}") from error

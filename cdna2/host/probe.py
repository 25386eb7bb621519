"""Host probe: everything the deploy needs to know about one host, read in one SSH round trip.

Runs on the host under the target Python (or under ``python3`` when the target environment is missing, which it
then reports), standard library only, and prints one JSON object on stdout. It never imports the packages it
inspects: distributions are read from their metadata, AITER's kernel tree from its RECORD. It never raises on a
host that is merely unusual: what it cannot read goes to ``errors`` and the field is ``null``.

What it reads, by module: ROCm and the GPUs (gpus), the installed packages and their RECORDs (distributions), a
develop-mode AITER checkout (checkouts), the machine, the login and its state directory (environment); digests and
JSON (digests, jsontext) are shared with the controller. This module holds the tool's own state on the host and
the order of the reads. The deploy sends these modules' texts inline, with a bootstrap (cdna2/probe_payload.py);
on the host: ``python3 -c BOOTSTRAP '' PAYLOAD '<json options>'``. The options are described by ``probe``.
"""

from __future__ import annotations

# Paths are strings and os.path here and in the probe's modules, processes are spawned without subprocess, JSON is
# read and written without json (which imports re, and re enum), CSV parsed without csv unless a row is quoted: a
# probe runs on every host on every run, and those imports cost it more CPU than reading an unchanged host.
# tests/unit/test_probe.py keeps the list of what it imports.
import os
import pwd
import sys
import time

from cdna2.host.checkouts import checkout_status, read_develop_aiter
from cdna2.host.digests import read_text, tree_digest, triton_sources_digest
from cdna2.host.distributions import (DISTRIBUTIONS, read_aiter, read_distributions, read_patch_targets, read_records,
                                      record_facts, record_mismatches, record_stat)
from cdna2.host.environment import default_state_dir, free_bytes, read_os, read_python, read_write_access
from cdna2.host.gpus import KFD_TOPOLOGY, PCI_DEVICES, read_gpus, read_rocm
from cdna2.host.jsontext import json_dumps, json_loads
from cdna2.host.shared_env import node_view, read_identity, shared_state_dir

PROBE_FORMAT = 4  # 4: AITER's record facts carry triton_sources
SHARED_SOURCE = "the shared environment"


def read_backups(state_dir: str, errors: list[str]) -> dict:
    """The patch transactions' backup records (cdna2/host/txn.py): what was patched, and any unfinished journal."""
    backups = {}
    backups_dir = os.path.join(state_dir, "backups")
    for name in sorted(os.listdir(backups_dir)) if os.path.isdir(backups_dir) else []:
        backup_dir = os.path.join(backups_dir, name)
        record = os.path.join(backup_dir, "state.json")
        if not os.path.isfile(record):
            continue
        try:
            state = json_loads(read_text(record))
        except (OSError, ValueError) as error:
            errors.append(f"{record}: unreadable patch record: {error}")
            continue
        backups[state["package"]] = {"backup_dir": backup_dir, "root": state["root"],
                                     "version": state.get("version"),
                                     "files": state["files"], "jit_invalidations": state["jit_invalidations"],
                                     # a record written before transactions created directories has none
                                     "created_directories": state.get("created_directories", []),
                                     "journal": os.path.exists(os.path.join(backup_dir, "journal.json"))}
    return backups


def read_state(state_dir: str, errors: list[str]) -> dict | None:
    state_file = os.path.join(state_dir, "state.json")
    if not os.path.isfile(state_file):
        return None
    try:
        return json_loads(read_text(state_file))
    except (OSError, ValueError) as error:
        errors.append(f"{state_file}: unreadable tool state: {error}")
        return None


def read_agent(agent_dir: str | None) -> dict:
    """Digest of this tool's host-side modules as installed on the host, to decide whether to upload them."""
    if not agent_dir or not os.path.isdir(agent_dir):
        return {"digest": None}
    return {"digest": tree_digest(agent_dir)}


def probe(options: dict) -> dict:
    """Options: target_python, rocm_root, state_dir (None: this login's default_state_dir; the agent is read from
    its agent/), shared_environment (the state directory is the environment's own, cdna2/host/shared_env.py);
    optional kfd_topology, pci_devices, patch_files {package: [paths]}, known_contents [hashes the controller holds
    the bytes of], record_memo {package: {stat, facts}} (the ``record_facts`` of the last probe of this host,
    reused while the RECORD's stat is the same), record_check [packages] (compare those distributions' files with
    their RECORD: reads every file, and the kernel tree too, whatever any stat says), triton_sources (the digest of a
    develop checkout's AITER Triton sources, which the controller's compile proof is keyed by, read from its files;
    an installed wheel's comes from its RECORD on every probe)."""
    errors: list[str] = []
    python = read_python(options["target_python"])
    distributions = read_distributions(errors) if python["is_target"] else {name: None for name in DISTRIBUTIONS}
    patch_files, record_check = options.get("patch_files", {}), options.get("record_check", [])
    if not python["is_target"]:
        errors.append(f"target Python {options['target_python']} is missing or not executable; "
                      f"probed with {sys.executable} instead")
    # RECORDs: read only where the controller's memo of this host does not match the file's stat any more, or for
    # a drift check (record_check), which reads every RECORD, every file it lists, and every kernel.
    memo = {} if record_check else options.get("record_memo", {})
    # A develop AITER's RECORD lists only its path file: git HEAD is what the facts come from, on every probe.
    develop = read_develop_aiter(distributions, patch_files.get("amd-aiter", ()))
    stats = {package: record_stat(distributions[package]["metadata_dir"])
             for package in {"amd-aiter", *patch_files} if distributions.get(package)
             and not (develop and package == "amd-aiter")}
    reused = {package for package, stat in stats.items() if stat and (memo.get(package) or {}).get("stat") == stat
              and memo[package]["facts"].get("paths") == sorted(patch_files.get(package, ()))}
    records = read_records(distributions, errors, {*stats, *record_check} - reused)
    facts = {package: memo[package]["facts"] if package in reused
             else record_facts(package, records.get(package, ""), patch_files.get(package, ())) for package in stats}
    if develop:
        facts["amd-aiter"] = develop
    if python["is_target"]:
        python["identity"] = read_identity(sys.prefix)
    if options.get("shared_environment") and python["is_target"]:
        # Where every node of the environment, in this run or a later allocation, finds its records.
        state_dir, state_dir_source = shared_state_dir(sys.prefix), SHARED_SOURCE
    else:
        state_dir, state_dir_source = ((options["state_dir"], "host data") if options.get("state_dir")
                                       else default_state_dir(os.geteuid(), os.environ))
    state = read_state(state_dir, errors)
    if state_dir_source == SHARED_SOURCE:
        state = node_view(state, os.uname().nodename)
    installed_kernels = None if record_check else (state or {}).get("kernels")
    aiter = read_aiter(distributions.get("amd-aiter"), "", errors, installed_kernels, facts.get("amd-aiter"))
    patch_targets = read_patch_targets(patch_files, distributions,
                                       {package: found["targets"] for package, found in facts.items()},
                                       set(options.get("known_contents", ())))
    return {
        "format": PROBE_FORMAT,
        "os": read_os(),
        "python": python,
        "rocm": read_rocm(options["rocm_root"], distributions),
        "gpu": read_gpus(options["rocm_root"], options.get("kfd_topology", KFD_TOPOLOGY), errors,
                         options.get("pci_devices", PCI_DEVICES)),
        "distributions": distributions,
        "aiter": aiter,
        "patch_targets": patch_targets,
        # The digest of AITER's Triton sources (None: no Triton package): as its RECORD promises them; of a develop
        # checkout, read from its files where asked (host data enables the aiter-triton-gfx90a set).
        "triton_sources": (triton_sources_digest(distributions["amd-aiter"]["location"])
                           if develop and options.get("triton_sources")
                           else (facts.get("amd-aiter") or {}).get("triton_sources")),
        "record_facts": {package: {"stat": stats[package], "facts": facts[package], "reused": package in reused}
                         for package in stats},
        "state": state,
        # Where the state is: host data's state_dir, else this login's default (default_state_dir).
        "state_dir": {"path": state_dir, "source": state_dir_source},
        "state_dir_used": os.path.isdir(state_dir) and bool(os.listdir(state_dir)),
        "state_dir_free_bytes": free_bytes(os.path.join(state_dir, "staging")),
        "agent": read_agent(os.path.join(state_dir, "agent")),
        "backups": read_backups(state_dir, errors),
        "login": {"user": pwd.getpwuid(os.geteuid()).pw_name, "uid": os.geteuid()},
        "write_access": read_write_access(state_dir, python, distributions, aiter, patch_targets),
        "record_check": {package: checkout_status(distributions[package]["location"])
                         if distributions[package].get("install_mode") == "develop"
                         else record_mismatches(distributions[package]["location"], records[package])
                         for package in record_check if distributions.get(package)},
        "errors": errors,
        # This process's CPU since it started (interpreter start-up included) and its children's (rocminfo, to the
        # clock tick): what one probe costs the host, for bench/deploy.
        "cpu_s": round(time.process_time() + os.times().children_user + os.times().children_system, 4),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(f"usage: {argv[0]} '<json options>' [SUDO_REFUSAL]", file=sys.stderr)
        return 2
    found = probe(json_loads(argv[1]))
    # SUDO_REFUSAL: what sudo said when the login user asked it for root (operations/facts.py); this probe then
    # runs as that user, for the report, and the deploy fails the host before changing anything.
    # Its last line is the refusal; lines before it are warnings (an unresolvable host name, say).
    refusal = (argv[2].strip().splitlines() or [""])[-1][-300:] if len(argv) == 3 else None
    found["sudo_refused"] = {"user": pwd.getpwuid(os.geteuid()).pw_name, "error": refusal} if len(argv) == 3 else None
    print(json_dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

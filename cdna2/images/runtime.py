"""The smoke test and the bench cases inside an image's own runtime on a node: ``singularity|apptainer exec`` with
the layer.

verify.py and bench.py, on a host whose data names ``sif_image`` (a .sif on a filesystem the node sees, its layer
beside it), run these commands on the node through the host's transport (SSH, or a Slurm step):

1. ``probe_command``: the runtime the node has (``singularity``, else ``apptainer``: the wrapper's order), its
   ``--version``, and the layer's record beside the image. ``read_probe`` and ``launch_of`` turn that into what to
   run, or into an error naming the host, the file and the fix (no image, no record, no runtime).
2. ``smoke_command`` (verify.py, and bench.py first), ``bench_command`` (bench.py, after the smoke test passed):
   the image's and the layer's SHA-256 checked against the record on the node (``sha256sum -c``), then the agent the
   layer carries, run by the image's Python inside ``RUNTIME exec`` on the record's launch line (the layer
   read-only, AITER's JIT directory per user and layer; ``inside_command``). ``read_report`` reads its JSON report;
   a hash that differs is an error naming the file, never a pass.

Only the node reads the image and the layer: the controller needs no shared filesystem. Nothing here runs pyinfra.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

from cdna2.bench import host_command
from cdna2.host.environment import ROOT_STATE_DIR
from cdna2.images.layer import JIT_ROOT, LayerFiles, launch_arguments

RUNTIMES = ("singularity", "apptainer")
RECORD_MARK = "--- record"
HASH_MARK = "--- sha256 differs:"
JIT_WORD = "@JIT@"  # stands for "$jit" in the launch arguments until they are quoted (shlex leaves @ unquoted)
# A deployed layer holds AITER's gfx90a tree inside the image's site-packages: where the image's Python is.
SITE_IN_RECORD = re.compile(r"^(?P<prefix>.+)/lib/python3[^/]*/site-packages(?=/aiter_meta/hsa/gfx90a/)")


class RuntimeCheckError(RuntimeError):
    """The GPU checks cannot run inside the runtime on this node; the message names the host, the file and the fix."""


@dataclass(frozen=True)
class Launch:
    """What runs the image's smoke test on a node, and what the report says ran it."""

    runtime: str  # the path on the node
    version: str  # the runtime's own ``--version`` line
    image: str
    image_sha256: str
    layer: str
    layer_sha256: str
    python: str  # the image's interpreter
    site_packages: str

    def report(self) -> dict:
        return asdict(self)


def probe_command(image: str) -> str:
    """Shell: the runtime on PATH and its version, whether the image is there, then the layer's record."""
    files = LayerFiles(PurePosixPath(image))
    return (f"image={shlex.quote(image)}; record={shlex.quote(str(files.record))}; "
            f"r=$(command -v {' || command -v '.join(RUNTIMES)} || true); "
            'printf "runtime=%s\\n" "$r"; '
            '[ -z "$r" ] || printf "version=%s\\n" "$("$r" --version 2>&1 | head -n 1)"; '
            '[ -f "$image" ] && echo image=found || echo image=missing; '
            f'echo "{RECORD_MARK}"; cat "$record" 2>/dev/null || true')


def read_probe(lines: list[str]) -> dict:
    """``probe_command``'s output: runtime, version, image (found/missing), record (its text, "" when absent)."""
    split = lines.index(RECORD_MARK) if RECORD_MARK in lines else len(lines)
    fields = dict(line.split("=", 1) for line in lines[:split] if "=" in line)
    return {"runtime": fields.get("runtime", ""), "version": fields.get("version", ""),
            "image": fields.get("image", "missing"), "record": "\n".join(lines[split + 1:])}


def launch_of(host: str, image: str, probe: dict) -> Launch:
    """What to run on ``host`` from its probe, or RuntimeCheckError naming what is missing and the fix."""
    files = LayerFiles(PurePosixPath(image))
    deploy = f"`python -m cdna2.images deploy {image}`"
    if probe["image"] != "found":
        raise RuntimeCheckError(f"{host}: {image}: no such file on the node: sif_image must name the .sif on a "
                                "filesystem the node sees")
    if not probe["record"].strip():
        raise RuntimeCheckError(f"{host}: {files.record}: no layer record beside the image: run {deploy} and keep "
                                f"{files.layer.name}, {files.record.name} and {files.wrapper.name} beside it")
    try:
        record = json.loads(probe["record"])
        layer_sha256, image_sha256, listed = record["layer_sha256"], record["image_sha256"], record["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise RuntimeCheckError(f"{host}: {files.record}: not a layer record this tool wrote ({error}); run "
                                f"`python -m cdna2.images rollback {image}`, then {deploy}") from error
    if record.get("layer") != files.layer.name:
        raise RuntimeCheckError(f"{host}: {files.record}: records the layer {record.get('layer')!r}, not "
                                f"{files.layer.name}: the files beside the image belong to another image; deploy "
                                "again")
    sites = [found for name in listed if (found := SITE_IN_RECORD.match(name))]
    if not sites:
        raise RuntimeCheckError(f"{host}: {files.record}: the layer holds no gfx90a kernel tree: not a provisioned "
                                f"layer; run {deploy}")
    if not probe["runtime"]:
        raise RuntimeCheckError(f"{host}: neither {' nor '.join(RUNTIMES)} is on the node's PATH: load the "
                                "cluster's container runtime (its module) for the run, or install Apptainer")
    prefix = "/" + sites[0]["prefix"]
    return Launch(probe["runtime"], probe["version"] or "unknown version", image, image_sha256, str(files.layer),
                  layer_sha256, f"{prefix}/bin/python", "/" + sites[0][0])


def smoke_command(launch: Launch, host_arch: str | None, gpu_checks: bool, expect_triton: str) -> str:
    """Shell: the hashes checked on the node, then the smoke test inside ``RUNTIME exec`` with the layer."""
    return inside_command(launch, "cdna2.host.smoke", [
        "--site-packages", launch.site_packages, "--state-dir", ROOT_STATE_DIR, "--host-arch", host_arch or "none",
        *([] if gpu_checks else ["--no-gpu-checks"]), "--expect-triton", expect_triton, "--json"])


def bench_command(launch: Launch, host_arch: str | None, cases: list[dict]) -> str:
    """Shell: the hashes checked on the node, then the bench cases inside ``RUNTIME exec`` with the layer; a case
    needing a patch set the layer's deployed state lacks is skipped there (the controller cannot read that state)."""
    return inside_command(launch, "cdna2.host.bench", [
        *host_command(launch.site_packages, ROOT_STATE_DIR, host_arch, cases), "--skip-unapplied-patch-sets"])


def inside_command(launch: Launch, module: str, arguments: list[str]) -> str:
    """Shell: the image's and the layer's SHA-256 checked against the record on the node, then ``module`` of the
    agent the layer carries, run by the image's Python inside ``RUNTIME exec`` on the record's launch line."""
    image, layer = PurePosixPath(launch.image), PurePosixPath(launch.layer)
    # The layer first: the file more likely edited, and the smaller one (the image is not read when the layer differs)
    # sha256sum -c prints "NAME: FAILED"; one that fails saying nothing is a failure too, never a pass.
    sums = " ".join(shlex.quote(f"{digest}  {name}")
                    for digest, name in ((launch.layer_sha256, layer.name), (launch.image_sha256, image.name)))
    checks = (f'bad=; for sum in {sums}; do bad=$(printf "%s\\n" "$sum" | sha256sum -c --quiet - 2>/dev/null) || '
              '{ bad=${bad:-"${sum#*  }: sha256sum could not check it"}; break; }; done')
    jit = f"{JIT_ROOT}/{launch.layer_sha256[:16]}"
    agent = ["/usr/bin/env", f"PYTHONPATH={ROOT_STATE_DIR}/agent", launch.python, "-B", "-m", module, *arguments]
    run = " ".join(shlex.quote(word) for word in (launch.runtime, "exec",
                                                  *launch_arguments(launch.layer, launch.image, JIT_WORD), *agent))
    return (f"cd {shlex.quote(str(image.parent))} || exit 1; "
            f"{checks}; "
            f'if [ -n "$bad" ]; then echo "{HASH_MARK}"; echo "$bad"; exit 0; fi; '
            # The runtime's own stderr too: when it prints no report, its words are what names the fault.
            f'jit="{jit}"; mkdir -p "$jit" && ' + run.replace(JIT_WORD, '"$jit"') + " 2>&1 || true")


def read_report(host: str, launch: Launch, lines: list[str], what: str) -> dict:
    """The ``what`` report (smoke, bench) printed inside the runtime, or RuntimeCheckError: a file that differs from
    its recorded SHA-256, or no report (the runtime's own words)."""
    if HASH_MARK in lines:
        image = PurePosixPath(launch.image)
        # "NAME: FAILED", or what else kept sha256sum from checking NAME ("FAILED open or read", ...)
        found = [line.rsplit(":", 1) for line in lines[lines.index(HASH_MARK) + 1:] if ":" in line]
        differ = [str(image.parent / name) + ("" if status.strip() == "FAILED" else f" ({status.strip()})")
                  for name, status in found]
        raise RuntimeCheckError(f"{host}: {', '.join(differ)}: SHA-256 differs from {LayerFiles(image).record} "
                                "(edited, or copied incompletely): not run; copy the files again, or roll the layer "
                                "back and deploy again")
    # The report is the last JSON object printed: the runtime's or Python's own words may follow it (stderr).
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    # argparse's words when the agent the layer carries predates an option this controller passes
    older = next((line for line in lines if "unrecognized arguments:" in line), None)
    if older is not None:
        raise RuntimeCheckError(f"{host}: {launch.layer}: the agent this layer carries is older than this controller "
                                f"({older.strip()}): deploy the layer again (`python -m cdna2.images deploy "
                                f"{launch.image}`), then rerun")
    raise RuntimeCheckError(f"{host}: {launch.runtime} exec {launch.image} printed no {what} report; its output "
                            f"ends: {' | '.join(lines[-5:]) or 'nothing'}")

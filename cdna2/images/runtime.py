"""The smoke test and the bench cases inside an image's own runtime on a node: ``singularity|apptainer exec`` with
the layer.

verify.py and bench.py, on a host whose data names ``sif_image`` (a .sif on a filesystem the node sees, its layer
beside it), run these commands on the node through the host's transport (SSH, or a Slurm step):

1. ``probe_command``: the runtime the node has (``singularity``, else ``apptainer``: the wrapper's order), its
   ``--version``, the identity of the image and of the layer as the node sees them (``IDENTITY``), and the layer's
   record beside the image. ``read_probe`` and ``launch_of`` turn that into what to run, or into an error naming
   the host, the file and the fix (no image, no record, no runtime).
2. ``hash_command``, on ONE node per distinct pair of files (the same paths with the same identities: the nodes of a
   shared filesystem see one file; operations/smoke.py picks the node): the layer's and the image's SHA-256, each
   between two reads of its identity. ``hash_problem`` turns that into what differs from the record (the file
   named), or None: the files with those identities are the recorded ones.
3. ``smoke_command`` (verify.py, and bench.py first), ``bench_command`` (bench.py, after the smoke test passed):
   on every node, each file's identity checked against the one that was hashed (a stat: no file is read), then the
   agent the layer carries, run by the image's Python inside ``RUNTIME exec`` on the record's launch line (the
   layer read-only, AITER's JIT directory per user and layer; ``inside_command``). ``read_report`` reads its JSON
   report; a file whose identity changed is an error naming the file, never a pass.

Why an identity stands for the bytes: a write changes a file's mtime and ctime, a rename puts another inode at the
path, and no unprivileged call sets a ctime (``utimensat`` sets mtime and atime only, and ctime to now). The file is
opened before each stat: on NFS an open revalidates the attributes (close-to-open), a bare stat may answer from the
client's attribute cache. The device number is left out: it differs between the NFS clients of one export.

Only the nodes read the image and the layer: the controller needs no shared filesystem. Nothing here runs pyinfra.
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
CHANGED_MARK = "--- changed since hashed:"
# A file's identity: inode, size, mtime and ctime in ns (GNU stat). Equal identities, equal bytes (module docstring).
IDENTITY = "%i %s %.9Y %.9Z"
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
    image_identity: str  # IDENTITY as the node saw it ("" when it could not read it)
    layer_identity: str
    hashed_by: str = ""  # the node whose SHA-256 of these files stands for every node's (hash_command)

    def report(self) -> dict:
        return asdict(self)

    def files(self) -> tuple[tuple[str, str, str], ...]:
        """(path, identity, recorded SHA-256) of the layer, then of the image: the layer is the file more likely
        edited, and the smaller one (the image is not read when the layer differs)."""
        return ((self.layer, self.layer_identity, self.layer_sha256),
                (self.image, self.image_identity, self.image_sha256))


def identity_of(path: str) -> str:
    """Shell: ``path``'s IDENTITY, the file opened first (NFS close-to-open); nothing when it cannot be opened."""
    quoted = shlex.quote(path)
    return f"stat -L -c '{IDENTITY}' {quoted} 2>/dev/null <{quoted}"


def probe_command(image: str) -> str:
    """Shell: the runtime on PATH and its version, whether the image is there, then the layer's record."""
    files = LayerFiles(PurePosixPath(image))
    return (f"image={shlex.quote(image)}; record={shlex.quote(str(files.record))}; "
            f"r=$(command -v {' || command -v '.join(RUNTIMES)} || true); "
            'printf "runtime=%s\\n" "$r"; '
            '[ -z "$r" ] || printf "version=%s\\n" "$("$r" --version 2>&1 | head -n 1)"; '
            '[ -f "$image" ] && echo image=found || echo image=missing; '
            f'printf "image_identity=%s\\n" "$({identity_of(str(files.image))})"; '
            f'printf "layer_identity=%s\\n" "$({identity_of(str(files.layer))})"; '
            f'echo "{RECORD_MARK}"; cat "$record" 2>/dev/null || true')


def read_probe(lines: list[str]) -> dict:
    """``probe_command``'s output: runtime, version, image (found/missing), record (its text, "" when absent)."""
    split = lines.index(RECORD_MARK) if RECORD_MARK in lines else len(lines)
    fields = dict(line.split("=", 1) for line in lines[:split] if "=" in line)
    return {"runtime": fields.get("runtime", ""), "version": fields.get("version", ""),
            "image": fields.get("image", "missing"), "image_identity": fields.get("image_identity", ""),
            "layer_identity": fields.get("layer_identity", ""), "record": "\n".join(lines[split + 1:])}


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
                  layer_sha256, f"{prefix}/bin/python", "/" + sites[0][0], probe["image_identity"],
                  probe["layer_identity"])


def hash_command(launch: Launch) -> str:
    """Shell, for one node: each file's identity, its SHA-256, its identity again (a file written while it was read
    shows two); the image is not read when the layer differs from the record."""
    steps = []
    for index, (path, _, recorded) in enumerate(launch.files()):
        quoted = shlex.quote(path)
        steps.append(f"before=$({identity_of(path)}); sum=$(sha256sum <{quoted} 2>/dev/null | cut -d' ' -f1); "
                     f"after=$({identity_of(path)}); "
                     f'printf "file{index}=%s|%s|%s\\n" "$before" "$sum" "$after"; '
                     f'[ "$sum" = {shlex.quote(recorded)} ] || exit 0')
    return "; ".join(steps)


def hash_problem(launch: Launch, lines: list[str]) -> str | None:
    """What ``hash_command``'s output shows differs, naming the file and the record (no host: every node of the
    files shares the verdict), or None: the files with the identities the nodes saw are the recorded ones."""
    record = LayerFiles(PurePosixPath(launch.image)).record
    fields = dict(line.split("=", 1) for line in lines if line.startswith("file") and "=" in line)
    for index, (path, identity, recorded) in enumerate(launch.files()):
        before, digest, after = (fields.get(f"file{index}", "") + "||").split("|")[:3]
        if not digest or not before:
            return (f"{path}: could not be read to check its SHA-256 against {record}: not run; make it readable "
                    "on the nodes")
        if digest != recorded:
            return (f"{path}: SHA-256 differs from {record} (edited, or copied incompletely): not run; copy the files "
                    "again, or roll the layer back and deploy again")
        if not before == after == identity:
            return (f"{path}: changed while its SHA-256 was checked (identity {identity or 'unread'}, then {before}, "
                    f"then {after}; inode, size, mtime and ctime in ns): not run; run again once nothing writes it")
    return None


def smoke_command(launch: Launch, host_arch: str | None, gpu_checks: bool, expect_triton: str) -> str:
    """Shell: the files' identities checked on the node, then the smoke test inside ``RUNTIME exec`` with the
    layer."""
    return inside_command(launch, "cdna2.host.smoke", [
        "--site-packages", launch.site_packages, "--state-dir", ROOT_STATE_DIR, "--host-arch", host_arch or "none",
        *([] if gpu_checks else ["--no-gpu-checks"]), "--expect-triton", expect_triton, "--json"])


def bench_command(launch: Launch, host_arch: str | None, cases: list[dict]) -> str:
    """Shell: the files' identities checked on the node, then the bench cases inside ``RUNTIME exec`` with the
    layer; a case needing a patch set the layer's deployed state lacks is skipped there (the controller cannot read
    that state)."""
    return inside_command(launch, "cdna2.host.bench", [
        *host_command(launch.site_packages, ROOT_STATE_DIR, host_arch, cases), "--skip-unapplied-patch-sets"])


def inside_command(launch: Launch, module: str, arguments: list[str]) -> str:
    """Shell: the image's and the layer's identity checked against the ones hashed (a stat each: nothing is read),
    then ``module`` of the agent the layer carries, run by the image's Python inside ``RUNTIME exec`` on the record's
    launch line."""
    image = PurePosixPath(launch.image)
    # A file that cannot be opened has no identity: never equal to one that was hashed.
    checks = "; ".join(f'[ -n "$bad" ] || {{ now=$({identity_of(path)}); [ "$now" = {shlex.quote(identity)} ] || '
                       f'bad={shlex.quote(path)}"|{identity}|$now"; }}'
                       for path, identity, _ in launch.files())
    jit = f"{JIT_ROOT}/{launch.layer_sha256[:16]}"
    agent = ["/usr/bin/env", f"PYTHONPATH={ROOT_STATE_DIR}/agent", launch.python, "-B", "-m", module, *arguments]
    run = " ".join(shlex.quote(word) for word in (launch.runtime, "exec",
                                                  *launch_arguments(launch.layer, launch.image, JIT_WORD), *agent))
    return (f"cd {shlex.quote(str(image.parent))} || exit 1; "
            f"bad=; {checks}; "
            f'if [ -n "$bad" ]; then echo "{CHANGED_MARK}"; printf "%s\\n" "$bad"; exit 0; fi; '
            # The runtime's own stderr too: when it prints no report, its words are what names the fault.
            f'jit="{jit}"; mkdir -p "$jit" && ' + run.replace(JIT_WORD, '"$jit"') + " 2>&1 || true")


def read_report(host: str, launch: Launch, lines: list[str], what: str) -> dict:
    """The ``what`` report (smoke, bench) printed inside the runtime, or RuntimeCheckError: a file that is not the
    one hashed (its identity changed), or no report (the runtime's own words)."""
    if CHANGED_MARK in lines:
        found = lines[lines.index(CHANGED_MARK) + 1:][:1] or [""]
        path, hashed, now = [*found[0].rsplit("|", 2), "", ""][:3]  # identities hold no "|", a path may
        raise RuntimeCheckError(f"{host}: {path}: not the file whose SHA-256 matched "
                                f"{LayerFiles(PurePosixPath(launch.image)).record} in this run (identity {hashed}, "
                                f"now {now or 'unreadable'}; inode, size, mtime and ctime in ns): replaced or written "
                                "since; not run; run again once nothing writes it")
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
